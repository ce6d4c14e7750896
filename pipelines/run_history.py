"""What a run directory holds: the flow runs it has seen (their records in `flow_runs/`), every
stage output (complete, running, interrupted), and `latest/`, links to the newest flow run's
outputs. `bertflow runs` lists, shows and cleans with these; the flow updates `latest/` at its end.

Cleaning is safe by construction: only directories laid out as stage outputs under the run
directory are ever deleted, never one whose writer is still running, and a flow run's outputs
are deleted only where no other flow run's record still uses them (outputs are shared: a cached
rerun records the same directories).
"""

from __future__ import annotations

import calendar
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.atomic import MARKER_NAME, atomic_write_text, progress_state, writer_state
from common.dir_lock import lock_file_of
from common.errors import UserError
from pipelines.flow_records import FLOW_RECORDS
from pipelines.stage_keys import STAGES

LATEST = "latest"
UNITS = ("finetune", "units")


@dataclass
class FlowRunRecord:
    path: Path
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.data.get("flow_run", self.path.stem))

    @property
    def status(self) -> str:
        """completed, failed, stopped (SIGTERM, Ctrl-C), running, or interrupted: a running record
        whose writer is gone (killed)."""
        status = str(self.data.get("status", "completed"))
        writer = self.data.get("writer")
        if status == "running" and writer and writer_state(writer) == "interrupted":
            return "interrupted"
        return status

    @property
    def started(self) -> float | None:
        """When the flow run started (seconds since the epoch, to the second); None if unrecorded."""
        try:
            return float(calendar.timegm(time.strptime(self.data["started_utc"], "%Y-%m-%d %H:%M:%S")))
        except (KeyError, TypeError, ValueError):
            return None

    def out_dirs(self) -> list[Path]:
        """The stage outputs this flow run used (its fine-tuning units included, when recorded);
        while it runs, also those it is going to use. Not the stage a killed run was in (recorded as
        running): cleaning that run's record keeps an interrupted pretraining to resume."""
        stages = [
            r["out_dir"]
            for r in self.data.get("stages", [])
            if r.get("stage") != "finetune-units" and r.get("status") != "running"
        ]
        planned = self.data.get("planned", []) if self.status == "running" else []
        return list(dict.fromkeys(self.local(d) for d in [*stages, *self.data.get("units", []), *planned]))

    def ended_in(self) -> list[Path]:
        """The stage outputs (one, the stage it was in) this run was writing as it ended, killed or
        stopped (its record's rows still `running`): not among `out_dirs`, but what its command resumes."""
        if self.status == "running":
            return []
        rows = self.data.get("stages", [])
        return [self.local(r["out_dir"]) for r in rows if r.get("status") == "running" and "out_dir" in r]

    def output(self, stage: str) -> Path | None:
        """This run's output of `stage` (`local`), None when it had none."""
        entries = self.data.get("stages", [])
        return next((self.local(r["out_dir"]) for r in entries if r.get("stage") == stage), None)

    def recorded_stage_dirs(self) -> dict[str, Path]:
        """stage → this run's output as its record says (`stage_keys.stage_dirs` computes them from a
        config), as `update_latest` links them: the stages it recorded (a
        phase's as pretrain@NAME) and the others it planned (an --only run's inputs), these by their
        folder where it holds only one of them."""
        planned = [self.local(d) for d in self.data.get("planned", [])]
        folders = [p.parent.name for p in planned]
        dirs = {p.parent.name: p for p in planned if folders.count(p.parent.name) == 1}
        recorded = [r for r in self.data.get("stages", []) if r.get("stage") != "finetune-units"]
        return {**dirs, **{r["stage"]: self.local(r["out_dir"]) for r in recorded}}

    @property
    def run_dir(self) -> Path:
        """The run directory that holds this record (`run_dir/flow_runs/<record>.json`)."""
        return self.path.parent.parent

    def local(self, recorded: str) -> Path:
        """A recorded output in the run directory that holds this record (`in_run_dir`)."""
        return in_run_dir(self.run_dir, recorded)


def default_run_root() -> Path:
    """Where `bertflow runs` looks without --run-dir or a config: the default `run_dir`, here."""
    from pipelines.config import PipelineConfig

    return Path(PipelineConfig.model_fields["run_dir"].default).resolve()


def runs_cli(root: Path, words: str = "") -> str:
    """The `bertflow runs WORDS` command that looks at `root` when typed here, for a hint: with
    `--run-dir ROOT` unless `root` is the default run directory (without it, the hint of a run
    directory given by --run-dir or a config's run_dir would list ./runs)."""
    import shlex

    cmd = f"bertflow runs {words}".rstrip()
    return cmd if Path(root).resolve() == default_run_root() else f"{cmd} --run-dir {shlex.quote(str(root))}"


def flow_run_cli(root: Path, config: str | None = None) -> str:
    """The `bertflow run` command whose flow runs write into `root`, for a hint: `config` (the
    `--config` of `bertflow runs`) or the placeholder CONFIG, with `--set run_dir=ROOT` unless it
    is `config`'s own run_dir (a config's run_dir decides where a flow run writes, not --run-dir)."""
    from pipelines.config import PipelineConfig, load_config
    from pipelines.stage_keys import run_root

    root = Path(root).resolve()
    cfg = load_config(config) if config else PipelineConfig()  # none: the placeholder CONFIG
    if config and run_root(cfg) == root:
        return cfg.command_line("run")
    default = PipelineConfig.model_fields["run_dir"].default
    where = default if root == default_run_root() else str(root)
    return cfg.command_line("run", "--set", f"run_dir={where}")


def in_run_dir(root: Path, recorded: str) -> Path:
    """A recorded output (an absolute path, as the flow wrote it) in the run directory `root`: a
    copied or moved run directory names its own outputs, never those of the one it was copied from."""
    path = Path(recorded)
    unit = (path.parent.parent.name, path.parent.name) == UNITS
    return Path(root).joinpath(*path.parts[-3 if unit else -2 :])


@dataclass
class StageOutput:
    stage: str
    path: Path
    state: str  # complete | running | interrupted | unfinished (`common.atomic.progress_state`)
    size: int
    modified: float
    used_by: list[str] = field(default_factory=list)


def flow_runs(root: Path) -> list[FlowRunRecord]:
    """Every flow-run record of the run directory, newest first."""
    out = []
    for path in (root / FLOW_RECORDS).glob("*.json"):
        try:
            out.append(FlowRunRecord(path, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(out, key=lambda r: (r.data.get("started_utc", ""), r.path.name), reverse=True)


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def last_modified(path: Path) -> float:
    """The newest modification time of `path` and of everything below it; 0.0 when it is missing."""
    newest = 0.0
    for dirpath, _, files in os.walk(path):
        for name in [".", *files]:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                pass
    return newest


def _output_dirs(root: Path) -> list[tuple[str, Path]]:
    found = []
    for stage in STAGES:
        for d in sorted((root / stage).glob("*")):
            if d.is_dir() and not (stage == UNITS[0] and d.name == UNITS[1]):
                found.append((stage, d))
    found += [("finetune-unit", d) for d in sorted(root.joinpath(*UNITS).glob("*")) if d.is_dir()]
    return found


def stage_outputs(root: Path, runs: list[FlowRunRecord] | None = None) -> list[StageOutput]:
    runs = flow_runs(root) if runs is None else runs
    users: dict[Path, list[str]] = {}
    for run in runs:
        for d in run.out_dirs():
            users.setdefault(d.resolve(), []).append(run.name)
    return [
        StageOutput(stage, d, progress_state(d), dir_size(d), d.stat().st_mtime, users.get(d.resolve(), []))
        for stage, d in _output_dirs(root)
    ]


def find_run(
    runs: list[FlowRunRecord], name: str | None, root: Path, config: str | None = None
) -> FlowRunRecord:
    """A flow run of the run directory `root` by its name (or its record's file name); None or
    'latest' = the newest. `config`: the `--config` of `bertflow runs`, for the hint."""
    if not runs:
        raise UserError(
            f"{root} has no flow runs yet (no records in {root / 'flow_runs'}).",
            fix=f"run `{flow_run_cli(root, config)}` first.",
        )
    if name in (None, LATEST):
        return runs[0]
    match = [r for r in runs if name in (r.name, r.path.stem, r.path.name)]
    if not match:
        from common.errors import did_you_mean

        raise UserError(
            f"no flow run named {name!r}{did_you_mean(name, [r.name for r in runs])}.",
            fix=f"`{runs_cli(runs[0].run_dir)}` lists them.",
        )
    return match[0]


def _stage_output(root: Path, path: Path) -> Path:
    """`path` if it is a stage output directory of `root`: absolute, or relative to the run directory
    (`pretrain/KEY`) or to the current one (`runs/pretrain/KEY`, as a shell completes it)."""
    outputs = {d.resolve() for _, d in _output_dirs(root)}
    found = [p for p in (root / path, Path.cwd() / path) if p.resolve() in outputs]
    if not found:
        raise UserError(
            f"{path} is not a stage output of {root} (those are {root}/<stage>/<key> and "
            f"{root}/finetune/units/<unit>); nothing deleted.",
            fix=f"`{runs_cli(root, 'stages')}` lists them.",
        )
    return found[0].resolve()


def removal_plan(
    root: Path, targets: list[str], incomplete: bool = False, config: str | None = None
) -> list[Path]:
    """What `bertflow runs clean` deletes: named stage outputs, the outputs only the named flow runs
    used (+ their records), and with `incomplete` every interrupted or unfinished output."""
    runs = flow_runs(root)
    names = {r.name for r in runs} | {r.path.stem for r in runs}
    plan: list[Path] = []
    outputs = {d.resolve() for _, d in _output_dirs(root)}
    for target in targets:
        if target in names or target == LATEST:
            if not runs:  # only `latest` gets here: nothing to clean (find_run's hint makes a run)
                raise UserError(
                    f"{root} has no flow runs (no records in {root / 'flow_runs'}), so no {target} run to "
                    "clean; nothing deleted.",
                    fix="to clean another run directory's runs, name it: --run-dir DIR (or --config YAML).",
                )
            run = find_run(runs, target, root, config)
            others = {d.resolve() for r in runs if r is not run for d in r.out_dirs()}
            plan += [d.resolve() for d in run.out_dirs() if d.resolve() in outputs - others]
            plan.append(run.path)
        else:
            plan.append(_stage_output(root, Path(target)))
    if incomplete:  # not those a live flow run is about to resume (an interrupted pretraining)
        live = {d.resolve() for r in runs if r.status == "running" for d in r.out_dirs()}
        plan += [
            o.path.resolve()
            for o in stage_outputs(root, runs)
            if o.state in ("interrupted", "unfinished") and o.path.resolve() not in live
        ]
    plan = list(dict.fromkeys(plan))
    running = [p for p in plan if p.is_dir() and progress_state(p) == "running"]
    if running:
        raise UserError(
            f"{running[0]} is being written by a running process; nothing deleted.",
            fix="wait for it to finish (or stop it) and clean again.",
        )
    return plan


def remove(path: Path) -> None:
    """Delete a stage output (its completion marker first, so a half-deleted one never looks
    complete) or a flow-run record."""
    if path.is_dir():
        (path / MARKER_NAME).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        lock_file_of(path).unlink(missing_ok=True)  # the stage lock beside it (nobody holds it: not running)
    else:
        path.unlink(missing_ok=True)


def update_latest(root: Path, dirs: dict[str, Path], record: Path | None) -> Path:
    """`run_dir/latest/`: a relative link per complete stage output of the newest flow run (a
    phase's too, `pretrain@seq32`), plus `model` and `flow_run.json`, and `report.html`, a page that
    opens `report/report.html`; every other link goes (stages without a complete output, phases the
    newest run does not have)."""
    latest = root / LATEST
    latest.mkdir(parents=True, exist_ok=True)
    links: dict[str, Path] = {s: d for s, d in dirs.items() if (d / MARKER_NAME).is_file()}
    if "pretrain" in links:
        links["model"] = links["pretrain"] / "model"
    if record is not None:
        links["flow_run.json"] = record
    for link in latest.iterdir():
        if link.is_symlink() and link.name not in links:
            link.unlink()
    for name, target in links.items():
        tmp = latest / f".{name}.{os.getpid()}.{time.monotonic_ns()}"
        os.symlink(os.path.relpath(target, latest), tmp)
        os.replace(tmp, latest / name)
    # a page, not a link: a browser resolves a linked page's images and links against latest/
    page = latest / "report.html"
    if "report" in links:
        atomic_write_text(page, REPORT_REDIRECT)
    else:
        page.unlink(missing_ok=True)
    return latest


def relink_latest(root: Path) -> None:
    """After a clean: when the flow run `latest/` linked is gone, `latest/` links the newest
    completed flow run left (none: nothing), as that run's end would have; no link is left pointing
    at a deleted output."""
    latest = root / LATEST
    if not latest.is_dir():
        return
    record = latest / "flow_run.json"
    if record.is_symlink() and not record.exists():
        newest = next((r for r in flow_runs(root) if r.status == "completed"), None)
        update_latest(root, newest.recorded_stage_dirs() if newest else {}, newest.path if newest else None)
    for link in latest.iterdir():
        if link.is_symlink() and not link.exists():
            link.unlink()  # pointed at something just deleted
    if not (latest / "report").exists():
        (latest / "report.html").unlink(missing_ok=True)  # the page would open a deleted report


REPORT_REDIRECT = """<!doctype html>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0; url=report/report.html">
<title>BERT pipeline report</title>
<p>The newest flow run's report: <a href="report/report.html">report/report.html</a></p>
"""
