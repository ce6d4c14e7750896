"""`bertflow run CONFIG [--only S] [--from S] [--force S] [--set section.key=value ...]`.

Runs the Prefect flow in this process against Prefect's ephemeral local API (nothing to start;
set PREFECT_API_URL to use a running `prefect server start` instead and watch it in the UI).
The config and the data paths are checked before Prefect starts, so a typo fails in a second.
"""

from __future__ import annotations

import argparse
import os

from common.paths import PROJECT_ROOT

# Prefect reads its settings when it is first imported: set ours before that.
ENV_DEFAULTS = {
    "PREFECT_HOME": str(PROJECT_ROOT / ".cache" / "prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TORCH_EXTENSIONS_DIR": str(PROJECT_ROOT / ".cache" / "torch_extensions"),
    "DS_BUILD_OPS": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def apply_env_defaults() -> None:
    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument
    from pipelines.stage_keys import STAGES

    parser.add_argument(
        "config",
        nargs="?",
        default="configs/default.yaml",
        help="pipeline YAML (default: configs/default.yaml)",
    )
    parser.add_argument("--only", choices=STAGES, help="run just this stage (its inputs must be complete)")
    parser.add_argument(
        "--from", dest="from_stage", choices=STAGES, help="recompute this stage and every later one"
    )
    parser.add_argument(
        "--force", action="append", default=[], choices=STAGES, help="recompute this stage (repeatable)"
    )
    add_set_argument(parser)


def main(args: argparse.Namespace) -> int:
    apply_env_defaults()
    from pipelines.config import load_config
    from pipelines.stage_plan import plan_stages
    from pipelines.verify_data import check_data_paths

    cfg = load_config(args.config, args.overrides)  # fails fast, before Prefect starts
    plan_stages(args.only, args.from_stage, args.force)
    check_data_paths(cfg)

    from pipelines.flow import bert_pipeline

    summary = bert_pipeline(
        config=args.config,
        overrides=args.overrides,
        only=args.only,
        from_stage=args.from_stage,
        force=args.force,
    )
    print()
    for r in summary["stages"]:
        print(f"  {r['stage']:<15} {r['status']:<18} {r['seconds']:8.1f} s  {r['out_dir']}")
    print(f"W&B group: {summary['wandb_group']} (offline runs: see the report for `wandb sync`)")
    if summary.get("report_html"):
        print(f"Report: {summary['report_html']}")
        print(f"        {summary['report_md']}")
    return 0
