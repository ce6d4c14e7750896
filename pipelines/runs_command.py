"""`bertflow runs`: the past flow runs of a run directory, and safe deletion of their outputs.

    bertflow runs [list]                 flow runs, newest first: status, time, cache hits, result, report
    bertflow runs show [RUN]             one flow run (default: the newest): stages, paths, sizes, result
    bertflow runs stages                 every stage output: complete / running / interrupted, size, users
    bertflow runs clean TARGET... [--incomplete] [--yes]
                                         TARGET = a flow run name (its outputs no other run uses, and
                                         its record) or a stage output directory; a dry run unless --yes
    bertflow runs clean --all [--yes]    every flow run and stage output (`make clean`), refused
                                         while a flow run or a stage output's writer is running

The run directory is `--run-dir`, else the `run_dir` of `--config`, else `runs`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from common.disk_space import byte_size
from finetuning.scorecard import signed_points
from pipelines.flow_records import FLOW_RECORDS
from pipelines.run_history import (
    LATEST,
    UNITS,
    FlowRunRecord,
    StageOutput,
    default_run_root,
    dir_size,
    find_run,
    flow_run_cli,
    flow_runs,
    last_modified,
    relink_latest,
    removal_plan,
    remove,
    runs_cli,
    stage_outputs,
)

ACTIONS = ("list", "show", "stages", "clean")
# argparse fills `action` and `targets` from the words before the first option only, and leaves a
# target after an option (`runs show --config C RUN`) over: `main` takes those as targets
PASSES_UNKNOWN_ARGS = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", nargs="?", default="list", choices=ACTIONS, help="list (default), show, stages or clean"
    )
    p.add_argument(
        "targets",
        nargs="*",
        help="show: a flow run name (default: the newest); clean: flow run names or stage output directories",
    )
    p.add_argument("--run-dir", help="the run directory (default: --config's run_dir, else runs)")
    p.add_argument("--config", help="pipeline YAML whose run_dir to look at")
    p.add_argument(
        "--incomplete", action="store_true", help="clean: also every interrupted or unfinished output"
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="clean: every flow run and stage output (refused while one is being written)",
    )
    p.add_argument(
        "--yes", action="store_true", help="clean: really delete (without it, only list what would go)"
    )


def _root(args: argparse.Namespace) -> Path:
    if args.run_dir:
        return _existing_run_dir(Path(args.run_dir).expanduser().resolve(), "--run-dir")
    if args.config:
        from pipelines.config import load_config
        from pipelines.stage_keys import run_root

        return _existing_run_dir(run_root(load_config(args.config)), "run_dir", missing_ok=True)
    return _existing_run_dir(default_run_root(), "the run directory", missing_ok=True)


def _existing_run_dir(root: Path, key: str, missing_ok: bool = False) -> Path:
    """`root`, a folder; a file is a UserError naming `key`, and so is a missing folder given with
    --run-dir (a typo there read as "no flow runs yet"; a config's run_dir may not exist before
    its first flow run)."""
    from common.errors import UserError

    fix = "pass the folder a flow run wrote into (a config's run_dir; ./runs by default), or --config CONFIG."
    if root.exists() and not root.is_dir():
        raise UserError(f"{key} {root} is a file, not a run directory.", fix=fix)
    if not root.exists() and not missing_ok:
        raise UserError(f"{key} {root} does not exist.", fix=fix)
    return root


def _duration(seconds: float | None) -> str:
    from pipelines.report_sections import duration

    return duration(seconds)


def _running_row(run: FlowRunRecord) -> dict[str, Any] | None:
    """The row of the stage the flow run was in when it last wrote its record (status running)."""
    rows = run.data.get("stages", [])
    return rows[-1] if rows and rows[-1].get("status") == "running" else None


def _last_seen(run: FlowRunRecord, runs: list[FlowRunRecord]) -> float:
    """When the flow run was last seen at work: now while it runs; else the last write of its record
    or of the output of the stage it was in (a killed run writes nothing as it dies), up to the start
    of the next flow run of `runs`, which may have resumed in that output and written to it since."""
    if run.status == "running":
        return time.time()
    row = _running_row(run)
    out = last_modified(run.local(row["out_dir"])) if row else 0.0
    later = [r.started for r in runs if None not in (r.started, run.started) and r.started > run.started]
    return max(run.path.stat().st_mtime, min([out, *later]))


def _run_time(run: FlowRunRecord, runs: list[FlowRunRecord]) -> str:
    """The flow run's time; a live one's so far, a killed one's at least until it was last seen
    (its record's time stops at the last stage it started)."""
    seconds = run.data.get("seconds")
    if seconds is None or run.status not in ("running", "interrupted"):
        return _duration(seconds)
    total = _duration(seconds + max(0.0, _last_seen(run, runs) - run.path.stat().st_mtime))
    return f"{total} so far" if run.status == "running" else f"≥ {total}"


def _stage_time(run: FlowRunRecord, row: dict[str, Any], runs: list[FlowRunRecord]) -> str:
    """A stage's time; for one recorded as running (its 0.0 s is a placeholder): so far while the
    flow run lives; the time it ran until its flow run stopped (SIGTERM, Ctrl-C: `stopped`, written
    by the flow; in an older record, at least until the flow run ended); else at least until the
    run was last seen; — for a row without its start."""
    if row.get("status") != "running" or row.get("stopped"):
        return _duration(row.get("seconds"))
    if row.get("started") is None:
        return "—"
    ended = run.data.get("seconds")
    if run.status not in ("running", "interrupted") and run.started is not None and ended is not None:
        return f"≥ {_duration(max(0.0, run.started + ended - row['started']))}"  # started: to the second
    ran = _duration(max(0.0, _last_seen(run, runs) - row["started"]))
    return f"{ran} so far" if run.status == "running" else f"≥ {ran}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _scorecard(run: FlowRunRecord) -> dict[str, Any] | None:
    fin = run.output("finetune")
    try:
        return json.loads((fin / "scorecard.json").read_text()) if fin else None
    except (OSError, json.JSONDecodeError):
        return None


def result_text(run: FlowRunRecord) -> str:
    """The scorecard headline in a few words ('+1.5 GLUE avg vs random init, ahead on 1/5')."""
    card = _scorecard(run)
    h = (card or {}).get("headline")
    if not h:
        return "—"
    avg = h.get("glue_average_delta")
    text = (
        f"{signed_points(avg)} GLUE avg vs {h.get('versus_name', 'random init')}"
        if avg is not None
        else "vs random init"
    )
    return f"{text}, ahead on {len(h['ahead_on'])}/{len(h['tasks'])}"


def _report(run: FlowRunRecord) -> str:
    rep = run.output("report")
    return str(rep / "report.html") if rep and (rep / "report.html").is_file() else "—"


def _cached(run: FlowRunRecord) -> str:
    stages = [r for r in run.data.get("stages", []) if r.get("stage") != "finetune-units"]
    hits = sum(1 for r in stages if r.get("status") in ("cached", "reused"))
    return f"{hits}/{len(stages)} cached"


def list_runs(root: Path, config: str | None = None) -> str:
    """The flow runs of `root`, newest first; `config`: the --config given, for the hint."""
    runs = flow_runs(root)
    if not runs:
        return f"{root}: no flow runs yet (`{flow_run_cli(root, config)}` writes {root}/flow_runs/)."
    rows = [
        [r.name, r.data.get("started_utc", "?"), r.status, _run_time(r, runs), _cached(r),
         result_text(r), _report(r), _arguments(r)]
        for r in runs
    ]  # fmt: skip
    header = ["flow run", "started (UTC)", "status", "time", "stages", "result", "report", "command"]
    return (
        f"{root}\n"
        + _table(header, rows)
        + f"\n\nnewest outputs: {root / LATEST}/ (`{runs_cli(root, 'show')}` for one run)"
    )


def _arguments(run: FlowRunRecord) -> str:
    """What tells runs of one config apart: the run's command after `bertflow run` (its config, each
    `--set`, `--only`, `--force`), as it was given; "—" in a record from before commands were kept."""
    command = run.data.get("command")
    return command.removeprefix("bertflow run ") if command else "—"


def show_run(root: Path, name: str | None, config: str | None = None) -> str:
    runs = flow_runs(root)
    run = find_run(runs, name, root, config)
    d = run.data
    by = f" ({d['stopped_by']})" if d.get("stopped_by") else ""  # SIGTERM to bertflow, Ctrl-C
    lines = [
        f"flow run {run.name}: {run.status}{by}, started {d.get('started_utc', '?')} UTC, "
        f"{_run_time(run, runs)}; W&B group {d.get('wandb_group', '—')}",
        f"record: {run.path}",
        *([f"command: {d['command']}"] if d.get("command") else []),
        f"result: {result_text(run)}",
        "",
    ]
    rows = []
    for r in d.get("stages", []):
        out = run.local(r["out_dir"])
        ended = r["status"] == "running" and run.status != "running"  # the stage its run was in as it ended
        rows.append(
            [
                r["stage"],
                ("stopped" if r.get("stopped") else "interrupted") if ended else r["status"],
                _stage_time(run, r, runs),
                *(_units_cells(run, out) if r.get("stage") == "finetune-units" else _output_cells(out)),
            ]
        )
    lines.append(_table(["stage", "status", "time", "now", "size", "output"], rows))
    lines += [f"\n{r['stage']} failed: {r['error']}" for r in d.get("stages", []) if r.get("error")]
    if failed := [u for r in d.get("stages", []) for u in r.get("failed_units", [])]:
        rows = [[u["unit"], u["checkpoint"], u["error"], str(run.local(u["out_dir"]))] for u in failed]
        lines += ["", _table(["failed unit", "checkpoint", "error (first line)", "folder"], rows)]
    pre = run.output("pretrain")
    if pre is not None and (pre / "model").is_dir():
        lines += [
            "",
            f"model:  {pre / 'model'}"
            + ("  (model card: README.md)" if (pre / "model" / "README.md").is_file() else ""),
        ]
    lines.append(f"report: {_report(run)}")
    return "\n".join([*lines, *how_to_go_on(run)])


def how_to_go_on(run: FlowRunRecord) -> list[str]:
    """For a flow run killed or stopped midway whose record has its command: how to resume it (the
    command less the --force/--from of the stages it had begun, `FlowRun.resume_command`)."""
    from common.errors import go_on_after_a_stop

    command, resume = run.data.get("command"), run.data.get("resume")
    if run.status not in ("interrupted", "stopped") or not command or not resume:
        return []
    kept = "its complete stages are reused, a pretraining goes on from its last checkpoint"
    if run.data.get("deployment"):
        unforced = (
            "" if resume == command else ", with `force`/`from_stage` no longer naming the stages it began"
        )
        return [f"\nto resume: {go_on_after_a_stop(True)}{unforced}; {kept}."]
    if resume == command:
        return [f"\nto resume: rerun the same command, `{command}`; {kept}."]
    return [
        f"\nto resume: `{resume}` (its own --force/--from would recompute the stages it began from scratch); {kept}."
    ]


def _output_cells(out: Path) -> list[str]:
    """now, size, output of a stage output."""
    from common.atomic import progress_state

    if not out.exists():
        return ["deleted", "—", str(out)]
    return [progress_state(out), byte_size(dir_size(out)), str(out)]


def _units_cells(run: FlowRunRecord, units_dir: Path) -> list[str]:
    """now, size, output of the `finetune-units` row: the unit folders this flow run used (its
    record's `units`), not all of `units_dir`, which holds every flow run's units. A record
    without them (written before they were recorded) gets the whole folder, said so."""
    if not (recorded := run.data.get("units")):
        size = byte_size(dir_size(units_dir)) if units_dir.exists() else "—"
        return ["present" if units_dir.exists() else "deleted", size, f"{units_dir} (all flow runs' units)"]
    units = [run.local(u) for u in recorded]
    left = [u for u in units if u.exists()]
    now = f"{len(left)} of {len(units)} present" if 0 < len(left) < len(units) else "present"
    if not left:
        now = "deleted"
    size = byte_size(sum(dir_size(u) for u in left)) if left else "—"
    return [now, size, f"{units_dir} ({len(units)} units)"]


def list_stages(root: Path) -> str:
    runs = flow_runs(root)
    outputs = stage_outputs(root, runs)
    if not outputs:
        return f"{root}: no stage outputs."
    rows = [
        [o.stage, o.path.name, o.state, byte_size(o.size), time.strftime("%Y-%m-%d %H:%M", time.gmtime(o.modified)),
         ", ".join(o.used_by) or _ended_in(o, runs)]
        for o in outputs
    ]  # fmt: skip
    total = sum(o.size for o in outputs)
    return _table(["stage", "output", "state", "size", "modified (UTC)", "used by flow runs"], rows) + (
        f"\n\n{len(outputs)} outputs, {byte_size(total)} in {root}"
    )


def _ended_in(output: StageOutput, runs: list[FlowRunRecord]) -> str:
    """For an output no flow run uses: "—", and for an unfinished one, the runs killed or stopped
    while writing it, whose command finishes it (a pretraining: resumes it)."""
    if output.state == "complete":
        return "—"
    ended = [r.name for r in runs if output.path.resolve() in {d.resolve() for d in r.ended_in()}]
    if not ended:
        return "—"
    return f"— ({', '.join(ended)} ended while writing it; rerunning its command finishes it)"


def clean(
    root: Path,
    targets: list[str],
    incomplete: bool,
    yes: bool,
    config: str | None = None,
    everything: bool = False,
) -> str:
    from common.errors import UserError

    if not targets and not incomplete and not everything:
        raise UserError(
            "nothing to clean.",
            fix="name flow runs or stage output directories, or pass --incomplete or --all.",
        )
    if everything:
        targets = [*targets, *_everything(root)]
    plan = removal_plan(root, targets, incomplete, config)
    if not plan and everything:
        if yes:
            _remove_empty_layout(root)
        return f"nothing to delete: {root} holds no flow run and no stage output."
    if not plan:  # a named run or stage output is always in the plan: only --incomplete finds none
        return (
            f"nothing to delete: {root} holds no interrupted or unfinished stage output "
            "(one that a running flow run will resume is not counted)."
        )
    sizes = {p: dir_size(p) if p.is_dir() else p.stat().st_size for p in plan}
    users, resumable = _users(root, plan), _resumable(plan)
    lines = [f"  {byte_size(sizes[p]):>10}  {p}{users.get(p, '')}{resumable.get(p, '')}" for p in plan]
    total = byte_size(sum(sizes.values()))
    if not yes:
        return "\n".join(
            ["would delete:", *lines, f"  {total} in all. Dry run: nothing deleted; add --yes to delete."]
        )
    for p in plan:
        remove(p)
    relink_latest(root)
    if everything:
        _remove_empty_layout(root)
    return "\n".join(["deleted:", *lines, f"  {total} freed."])


def _everything(root: Path) -> list[str]:
    """Every flow run and stage output of `root`, as `clean` targets; refused while a flow run is
    running (it may be between two stages, none of its outputs being written)."""
    from common.errors import UserError

    runs = flow_runs(root)
    if live := [r.name for r in runs if r.status == "running"]:
        raise UserError(
            f"flow run {live[0]} is running in {root}; nothing deleted.",
            fix="wait for it to finish (or stop it) and clean again.",
        )
    return [*(r.name for r in runs), *(str(o.path) for o in stage_outputs(root, runs))]


def _remove_empty_layout(root: Path) -> None:
    """The folders of the run directory's layout that cleaning left empty, and `root` if it is then
    empty (a user's own file keeps its folder). The stage locks of outputs never made go first
    (`remove_orphan_locks`): they alone kept a stage's folder."""
    from common.dir_lock import remove_orphan_locks
    from pipelines.stage_keys import STAGES

    for d in [root.joinpath(*UNITS), *(root / s for s in STAGES), root / LATEST, root / FLOW_RECORDS, root]:
        if d.is_dir() and not d.is_symlink():
            remove_orphan_locks(d)
        try:
            d.rmdir()
        except OSError:  # not empty, or absent
            pass


def _resumable(plan: list[Path]) -> dict[Path, str]:
    """For each unfinished pretraining output in `plan` with a verified checkpoint, a note that a
    rerun resumes there: `--incomplete` lists it among the interrupted outputs (hours of steps)."""
    from common.atomic import read_marker
    from common.stage_output import newest_verified_step

    notes = {}
    for path in plan:
        if path.is_dir() and read_marker(path) is None and (step := newest_verified_step(path)) is not None:
            notes[path] = (
                f"  (an unfinished pretraining with a verified checkpoint at step {step:,}: rerunning the "
                "command that started it resumes there; deleting it loses those steps)"
            )
    return notes


def _users(root: Path, plan: list[Path]) -> dict[Path, str]:
    """For each stage output in `plan` that a flow run kept in the records still uses (a stage
    output named by path), a note naming those runs: `runs show` will list it as deleted."""
    kept = [r for r in flow_runs(root) if r.path.resolve() not in plan]
    used = [(r.name, {d.resolve() for d in r.out_dirs()}) for r in kept]  # each run's outputs, once
    notes = {}
    for path in plan:
        names = [name for name, outputs in used if path in outputs]
        if names:
            runs, records = ("runs", "their records") if len(names) > 1 else ("run", "its record")
            notes[path] = f"  (used by flow {runs} {', '.join(names)}: {records} will name a deleted output)"
    return notes


def _targets(args: argparse.Namespace) -> list[str]:
    """The targets wherever they stand among the options; an unknown option is an error."""
    from common.errors import UserError

    unknown = [a for a in args.extra_args if a.startswith("-")]
    if unknown:
        raise UserError(
            f"unrecognized arguments: {' '.join(unknown)}.", fix="see `bertflow runs --help` for the options."
        )
    return [*args.targets, *args.extra_args]


def main(args: argparse.Namespace) -> int:
    args.targets = _targets(args)
    root = _root(args)
    if args.action == "list":
        print(list_runs(root, args.config))
    elif args.action == "show":
        print(show_run(root, args.targets[0] if args.targets else None, args.config))
    elif args.action == "stages":
        print(list_stages(root))
    else:
        print(clean(root, args.targets, args.incomplete, args.yes, args.config, args.all))
    return 0
