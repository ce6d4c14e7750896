"""`bertflow run CONFIG [--only S] [--from S] [--force S] [--set section.key=value ...]`.

Runs the Prefect flow in this process against Prefect's ephemeral local API (nothing to start;
set PREFECT_API_URL to use a running `prefect server start` instead and watch it in the UI).
The config and the data paths are checked before Prefect starts, so a typo fails in a second.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from common.errors import sigterm_as_interrupt
from common.paths import PROJECT_ROOT, torch_extensions_dir

# Prefect reads its settings when it is first imported: set ours before that.
ENV_DEFAULTS = {
    "PREFECT_HOME": str(PROJECT_ROOT / ".cache" / "prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TORCH_EXTENSIONS_DIR": str(torch_extensions_dir()),
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
    parser.add_argument(
        "--only",
        action="append",
        choices=STAGES,
        help="run just this stage (repeatable: these stages; the inputs of each must be complete or "
        "among them); preprocess and pretrain include their phases",
    )
    parser.add_argument(
        "--from", dest="from_stage", choices=STAGES, help="recompute this stage and every later one"
    )
    parser.add_argument(
        "--force", action="append", default=[], choices=STAGES, help="recompute this stage (repeatable)"
    )
    add_set_argument(parser)


def main(args: argparse.Namespace) -> int:
    from common.child_process import survive_a_lost_reader

    # `bertflow run ... 2>&1 | tee LOG` and tee dies: Prefect's console handler (rich) raised SystemExit
    # on the broken pipe and the flow crashed; its output now goes nowhere and the flow finishes (the
    # run dir and the flow-run record hold it all). Before Prefect's logging takes sys.stderr.
    survive_a_lost_reader()
    apply_env_defaults()
    from pipelines.beam_console import no_default_root_handler
    from pipelines.config import load_config
    from pipelines.flow_preflight import check_flow
    from pipelines.stage_plan import plan_stages

    cfg = load_config(args.config, args.overrides)  # fails fast, before Prefect starts
    selected, _ = plan_stages(args.only, args.from_stage, args.force)
    with no_default_root_handler():  # the checks import Beam, which must not set up logging before Prefect
        check_flow(cfg, selected)

    from pipelines.flow import bert_pipeline
    from pipelines.prefect_killed_runs import cancel_stopped_runs
    from pipelines.prefect_server import start_temporary_server, stop_prefect
    from pipelines.stage_keys import run_root

    # SIGTERM unwinds like Ctrl-C: the pretraining launcher's group is stopped, the flow records
    # the stop, the temporary API stops (Prefect's flow engine passes a SIGTERM it catches on here)
    started = time.time()
    with sigterm_as_interrupt():
        summary: dict[str, Any] = {}
        try:
            start_temporary_server()
            summary = bert_pipeline(
                config=args.config,
                overrides=args.overrides,
                only=args.only,
                from_stage=args.from_stage,
                force=args.force,
            )
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: Prefect's engine set the flow run Crashed
            cancel_stopped_runs(run_root(cfg), logging.getLogger("prefect").info)
            say_how_to_resume(run_root(cfg), since=started)
            raise
        finally:
            stop_prefect(summary.get("task_run_ids", ()))
    print()
    print(end_summary(summary))
    return 0


def say_how_to_resume(root: Path, since: float) -> None:
    """For the flow run stopped here (started at or after `since`) whose own command would recompute
    stages it began (its --force, --from: a pretraining's checkpoints deleted, started over), the
    command that resumes it, on stderr (the ranks' "rerun the same command" does not know the
    flow's flags); nothing where the same command resumes it."""
    from pipelines.run_history import flow_runs
    from pipelines.runs_command import how_to_go_on

    run = next((r for r in flow_runs(root) if r.status == "stopped" and (r.started or 0) >= int(since)), None)
    if run is not None and run.data.get("resume") not in (None, run.data.get("command")):
        print("\n".join(how_to_go_on(run)).strip(), file=sys.stderr)


def end_summary(summary: dict[str, Any]) -> str:
    """What a person needs when the flow ends: the stages, then the result and where it is."""
    import json

    from finetuning.scorecard import headline_text
    from pipelines.flow_records import found_complete
    from pipelines.report_sections import duration

    stages = summary["stages"]
    cells = [(r["stage"], r["status"], duration(r["seconds"]), r["out_dir"]) for r in stages]
    # widths from the rows: pretrain@NAME for a phase's stages, "30 ran, 0 cached, 30 reused" for units
    name_w, status_w, time_w = (max(len(c[i]) for c in cells) if cells else 0 for i in range(3))
    lines = [f"  {n:<{name_w}}  {s:<{status_w}}  {t:>{time_w}}  {o}" for n, s, t, o in cells]
    out = {r["stage"]: Path(r["out_dir"]) for r in stages}
    lines += [f"  WARNING {r['code_note']}" for r in stages if r.get("code_note")]
    lines.append("")
    card = out.get("finetune", Path("/nonexistent")) / "scorecard.json"
    if card.is_file():
        headline = headline_text(json.loads(card.read_text()).get("headline"))
        lines += ["Result: " + headline.replace("**", "").replace("  \n", "\n        "), ""]
    if "pretrain" in out and (out["pretrain"] / "model").is_dir():
        lines.append(f"Model:  {out['pretrain'] / 'model'}  (model card: README.md)")
    if summary.get("report_html"):
        lines.append(f"Report: {summary['report_html']}")
    root = Path(summary["run_dir"])
    if (root / "latest").is_dir():
        from pipelines.run_history import runs_cli

        lines.append(f"Latest: {root / 'latest'}/  (`{runs_cli(root)}` lists past runs)")
    if not all(found_complete(r["status"]) for r in stages):
        lines.append(
            f"W&B:    group {summary['wandb_group']} (offline runs: see the report for `wandb sync`)"
        )
        lines += [f"        {note}" for note in resumed_pretraining_groups(stages, summary["wandb_group"])]
    else:
        lines.append(
            "W&B:    nothing new logged (every stage was reused; its runs are in the earlier flow runs' groups)"
        )
    return "\n".join(lines)


def resumed_pretraining_groups(stages: list[dict[str, Any]], group: str) -> list[str]:
    """A pretraining that ran here but resumed an earlier flow run's attempt logs into the W&B group
    of its first attempt (`training.train.first_attempts_target`), not into this flow run's: said,
    so that a reader looks for its curve there."""
    from common.tracking import first_attempt_group_file

    notes = []
    for r in stages:
        recorded = first_attempt_group_file(Path(r["out_dir"]))
        if r["stage"].startswith("pretrain") and r["status"] == "ran" and recorded.is_file():
            if (first := recorded.read_text()) and first != group:
                notes.append(
                    f"{r['stage']}: its run is in group {first}, that of its first attempt, which it resumed"
                )
    return notes
