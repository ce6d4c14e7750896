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
    from common.atomic import read_marker, write_marker
    from common.paths import check_output_dir
    from common.stage_output import check_own_output, refuse_foreign_files
    from pipelines.config import load_config
    from pipelines.report_builder import EMBEDDED_NAME, OUTPUT_NAMES, build_report
    from pipelines.stage_keys import stage_code, stage_dirs, stage_key_inputs, write_stage_key

    cfg = load_config(args.config, args.overrides)
    if args.output:
        check_output_dir(args.output, "--output")
        # not another stage's output nor a model folder: the report's _COMPLETE.json replaced
        # theirs (shards or a pretraining the flow then no longer found complete, and computed again)
        check_own_output(args.output, "report", {})
        refuse_foreign_files(args.output, "report", OUTPUT_NAMES, own=(EMBEDDED_NAME,))
    dirs = stage_dirs(cfg)
    out = Path(args.output) if args.output else dirs["report"]
    paths = build_report(cfg, out)
    unfinished = [s for s in ("pretrain", "finetune") if read_marker(dirs[s]) is None]
    if unfinished:  # a look at a run under way: the flow's report stage must not take it as final
        print(f"bertflow report: no complete {' or '.join(unfinished)} output yet, so this report is "
              "partial and not marked complete (the flow's report stage writes it again).")  # fmt: skip
    else:
        write_marker(out, {"stage": "report", "by": "bertflow report", "code": stage_code("report")})
        if not args.output:
            write_stage_key(out, stage_key_inputs(cfg)["report"])
    print(f"Report: {paths['report_html']}\n        {paths['report_md']}")
    return 0
