"""`bertflow report [CONFIG] [--output DIR] [--set ...]`: (re)build the report of a run directory.

Without --output it writes where the flow's report stage writes for this config
(`run_dir/report/<key>/`), so the result is the same as inside the flow.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument

    parser.add_argument("config", nargs="?", default=None, help="pipeline YAML (default: built-in defaults)")
    parser.add_argument("--output", default=None, help="report directory (default: the flow's)")
    add_set_argument(parser)


def main(args: argparse.Namespace) -> int:
    from common.atomic import write_marker
    from pipelines.config import load_config
    from pipelines.report_builder import build_report
    from pipelines.stage_keys import stage_code, stage_dir

    cfg = load_config(args.config, args.overrides)
    out = Path(args.output) if args.output else stage_dir(cfg, "report")
    paths = build_report(cfg, out)
    write_marker(out, {"stage": "report", "by": "bertflow report", "code": stage_code("report")})
    print(f"Report: {paths['report_html']}\n        {paths['report_md']}")
    return 0
