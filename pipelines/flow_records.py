"""What each flow run did, stage by stage: `run_dir/flow_runs/<time>-<flow run>.json`, the report's
timing and cache-hit table."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_json
from common.child_process import process_identity

FLOW_RECORDS = "flow_runs"


def stage_record(
    stage: str, out_dir: Path, status: str, seconds: float, compute_seconds: float, code_note: str = ""
) -> dict:
    """One row: `status` is ran (computed in this flow run), cached (Prefect cache hit) or reused
    (a complete output found on disk, e.g. written by the stage command alone); running while it
    runs (a killed flow run's record keeps it), failed (`failed_record`); `code_note`: what
    `stage_keys.code_change_note` says when the output was made by other code than this run's;
    `started`: when the stage began (epoch seconds; a row is made as its stage starts or ends), so
    `bertflow runs` can tell how long a stage a killed run left as running had run (a flow run
    stopped by SIGTERM or Ctrl-C adds `stopped` to the row, its seconds those it ran until then)."""
    return {
        "stage": stage,
        "key": out_dir.name,
        "out_dir": str(out_dir),
        "status": status,
        "started": round(time.time() - seconds, 3),
        "seconds": round(seconds, 3),
        "compute_seconds": round(compute_seconds, 3),
        "code_note": code_note,
    }


def found_complete(status: str) -> bool:
    """Whether a row's stage computed nothing in its flow run: cached, reused, or fine-tuning units
    none of which ran ("0 ran, 30 cached")."""
    return status in ("cached", "reused") or status.startswith("0 ran")


def failed_record(stage: str, out_dir: Path, seconds: float, error: BaseException) -> dict:
    """The row of a stage that failed in this flow run, with its error's first line(s)."""
    text = str(error).strip() or type(error).__name__
    return {**stage_record(stage, out_dir, "failed", seconds, 0.0), "error": text[:1000]}


def write_record(
    root: Path,
    run_name: str,
    group: str,
    records: list[dict[str, Any]],
    started: float,
    path: Path | None = None,
    status: str = "running",
    units: list[str] | None = None,
    planned: list[str] | None = None,
    flow_run_id: str | None = None,
    stopped_by: str | None = None,
    command: str | None = None,
    resume: str | None = None,
) -> Path:
    """`status`: running (written at the start and after each stage), completed, failed, or stopped
    (by `stopped_by`: "SIGTERM to bertflow", its deployment variant or "Ctrl-C",
    `common.errors.stop_request`);
    `units`: the fine-tuning unit directories this flow run used (for `bertflow runs clean`);
    `planned`: the stage outputs it will use, which a live run's record protects from cleaning;
    `flow_run_id`: its Prefect flow run (`pipelines.prefect_killed_runs`);
    `command`: the `bertflow run` command of its settings (config, --set, stage selection), which
    `bertflow runs show` prints: what tells two flow runs of one run directory apart, and what a
    killed or stopped one is resumed with (a deployment's flow run, `deployment`: run it again);
    `resume`: that command less the --force/--from of the stages it had begun, which would
    recompute them from scratch (`FlowRun.resume_command`).
    While running, the record names its writer (pid, host): a killed run reads as interrupted."""
    if path is None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
        path = root / FLOW_RECORDS / f"{stamp}-{run_name}.json"
    atomic_write_json(
        path,
        {
            "flow_run": run_name,
            "flow_run_id": flow_run_id,
            "wandb_group": group,
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
            "seconds": round(time.time() - started, 3),
            "status": status,
            "stages": records,
            "units": units or [],
            "planned": planned or [],
            "writer": (
                {"pid": os.getpid(), "host": socket.gethostname(), **process_identity()}
                if status == "running"
                else {}
            ),
            **({"stopped_by": stopped_by} if stopped_by else {}),
            **({"command": command} if command else {}),
            **({"resume": resume} if resume else {}),
            **({"deployment": True} if os.environ.get("PREFECT__FLOW_RUN_ID") else {}),
        },
    )
    return path


def latest_record(root: Path, scorecard_dir: Path) -> tuple[Path | None, dict[str, Any]]:
    """The newest flow-run record of a run directory whose scorecard is `scorecard_dir` (the last
    flow run of that config; another config's run, or one with `--only verify`, is not it)."""
    records = sorted((root / FLOW_RECORDS).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in records:
        data = json.loads(path.read_text())
        stages = data.get("stages", [])
        if any(
            r.get("stage") == "finetune" and Path(r["out_dir"]).name == scorecard_dir.name for r in stages
        ):
            return path, data
    return None, {}
