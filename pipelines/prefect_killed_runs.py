"""Flow runs of a run directory whose process was killed stay Running in Prefect forever: Prefect
cannot tell a dead client from a slow one. bertflow can: the run's record names its writer, which
is gone (`FlowRunRecord.status` interrupted). The next flow run of that run directory sets each such
flow run, and its task runs, that the Prefect API still holds as running to Crashed, with a message
naming what happened; the record notes it, so later flow runs do not ask again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from common.atomic import atomic_write_json
from pipelines.run_history import FlowRunRecord, flow_runs

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

DONE_KEY = "prefect_crashed"  # in the killed run's record: its Prefect state was set


def crash_killed_runs(root: Path, rerun: str, log: Callable[[str], None]) -> list[str]:
    """Set Crashed every flow run of `root` that was killed while the Prefect API still shows it
    running (and its running task runs); returns their names. `rerun`: the flow run doing it."""
    killed = [r for r in flow_runs(root) if _unreported(r)]
    if not killed:
        return []
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    crashed = []
    with get_client(sync_client=True) as client:
        for run in killed:
            try:
                flow_run = client.read_flow_run(UUID(run.data["flow_run_id"]))
                if flow_run.state is not None and not flow_run.state.is_final():
                    _crash(client, flow_run.id, _message(run, rerun))
                    crashed.append(run.name)
            except (ObjectNotFound, httpx.HTTPError):  # another Prefect API's run (PREFECT_API_URL changed)
                continue
            _note_done(run)
    if crashed:
        log(f"Prefect: flow run(s) {', '.join(crashed)} were killed and had stayed Running; set to Crashed")
    return crashed


def _note_done(run: FlowRunRecord) -> None:
    """The record says its Prefect state was set, keeping its modification time: `bertflow runs`
    reads a killed run's time from it (a rewrite now made it end at this rerun's start)."""
    stat = run.path.stat()
    atomic_write_json(run.path, {**run.data, DONE_KEY: True})
    os.utime(run.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _unreported(run: FlowRunRecord) -> bool:
    return run.status == "interrupted" and bool(run.data.get("flow_run_id")) and not run.data.get(DONE_KEY)


def _message(run: FlowRunRecord, rerun: str) -> str:
    writer = run.data.get("writer", {})
    return (
        f"bertflow: the process of this flow run (pid {writer.get('pid')} on {writer.get('host')}) is gone: "
        f"it was killed. Flow run {rerun} of the same run directory started after it; "
        f"`bertflow runs show {run.name}` says what it left."
    )


def _crash(client: SyncPrefectClient, flow_run_id: UUID, message: str) -> None:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Crashed

    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    for task in tasks:
        if task.state is not None and not task.state.is_final():
            client.set_task_run_state(task.id, Crashed(message=message), force=True)
    client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
