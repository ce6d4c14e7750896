"""Flow overhead and cache reruns: what Prefect orchestration costs, and what a rerun saves.

Measured in one process on a slice of the real summaries corpus:
  1. the tokenizer + preprocess stages called directly (the reference),
  2. the same two stages as Prefect flow runs (`--only tokenizer`, `--only preprocess`) in a fresh
     run directory, after a warm-up flow run that starts the ephemeral API (reported separately),
  3. the same flow runs again: every stage is a cache hit.
Prints the seconds and the ratios flow/direct (orchestration overhead) and direct/cached (what a
rerun saves).

    python benchmarks/bench_flow.py [--documents 2000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("WANDB_MODE", "offline")


def parser() -> argparse.ArgumentParser:
    from bench_args import positive_int

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--documents", type=positive_int, default=2000, help="documents of the summaries corpus")
    return p


def main(argv: list[str] | None = None) -> int:
    """The benchmark in a temporary folder (corpus, two run directories, Prefect's home), deleted
    at its end, after a failure too (it was left in /tmp, 16 MB a run)."""
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_flow_", ignore_cleanup_errors=True) as work:
        try:
            return measure(args, Path(work))
        finally:
            from tests.flow_support import stop_ephemeral_prefect

            stop_ephemeral_prefect()  # before its database in the folder goes


def measure(args: argparse.Namespace, tmp: Path) -> int:
    os.environ["PREFECT_HOME"] = str(tmp / "prefect-home")
    (tmp / "prefect-home").mkdir()

    from common.paths import data_root
    from pipelines.config import load_config
    from pipelines.stage_keys import stage_dirs
    from tests.flow_support import tiny_config

    config = tiny_config(tmp, data_root(), preprocess={"workers": 1})
    import yaml

    text = yaml.safe_load(config.read_text())
    from tests.flow_support import write_small_corpus

    write_small_corpus(data_root(), Path(text["tokenizer"]["input"][0]), documents=args.documents)

    # 1. direct calls
    from pipelines.stage_preprocess import run_preprocess_stage
    from pipelines.stage_tokenizer import run_tokenizer_stage

    cfg = load_config(config, [f"run_dir={tmp / 'direct'}"])
    dirs = stage_dirs(cfg)
    t0 = time.perf_counter()
    run_tokenizer_stage(cfg.tokenizer, dirs["tokenizer"], data_root=cfg.data_root)
    t_tok = time.perf_counter() - t0
    run_preprocess_stage(cfg.preprocess, dirs["tokenizer"], dirs["preprocess"], data_root=cfg.data_root)
    direct = time.perf_counter() - t0

    # 2. flow runs (after a warm-up that starts Prefect's ephemeral API)
    from pipelines.flow import bert_pipeline

    overrides = [f"run_dir={tmp / 'flow'}"]
    t0 = time.perf_counter()
    bert_pipeline(config=str(config), overrides=overrides, only="verify")
    startup = time.perf_counter() - t0

    def flow_pass() -> tuple[float, list[str]]:
        t = time.perf_counter()
        statuses = []
        for stage in ("tokenizer", "preprocess"):
            summary = bert_pipeline(config=str(config), overrides=overrides, only=stage)
            statuses += [r["status"] for r in summary["stages"]]
        return time.perf_counter() - t, statuses

    flow, first = flow_pass()
    cached, second = flow_pass()
    assert first == ["ran", "ran"] and second == ["cached", "cached"], (first, second)

    print(f"corpus: {args.documents} documents of wiki/summaries_en.txt; tiny preprocess settings")
    print(f"prefect ephemeral API start + first (verify) flow run: {startup:7.1f} s")
    print(
        f"direct  tokenizer + preprocess:                          {direct:7.1f} s (tokenizer {t_tok:.1f} s)"
    )
    print(f"flow    tokenizer + preprocess (2 flow runs):            {flow:7.1f} s")
    print(f"cached  rerun of the 2 flow runs:                        {cached:7.1f} s")
    print(f"ratio flow / direct (orchestration overhead):            {flow / direct:7.2f}x")
    print(f"ratio direct / cached rerun (what a rerun saves):        {direct / cached:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
