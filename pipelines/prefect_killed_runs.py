"""Flow runs of a run directory whose process was killed stay Running in Prefect forever: Prefect
cannot tell a dead client from a slow one. bertflow can: the run's record names its writer, which
is gone (`FlowRunRecord.status` interrupted). The next flow run of that run directory sets each such
flow run, and its task runs, that the Prefect API still holds as running to Crashed, with a message
naming what happened; the record notes it, so later flow runs do not ask again.

A flow run the user stopped (SIGTERM, Ctrl-C: its record says stopped) is one that Prefect's flow
engine sets Crashed, as it does on any BaseException ("Execution was aborted by a termination
signal"), its stage's task run too: `bertflow run` sets both Cancelled, Prefect's state for a run
stopped on request, as it ends (`cancel_stopped_runs`), and so does the next flow run where that
did not happen (the API was unreachable). One stopped as it started, before it wrote its record (Prefect's
engine beginning the run, bertflow loading the config), is Cancelled by the flow's `on_crashed` hook
(`cancel_a_stop_before_its_record`): no record names it for the others."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from common.atomic import atomic_write_json
from pipelines.run_history import FlowRunRecord, flow_runs, runs_cli

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import State

DONE_KEY = "prefect_crashed"  # in a killed or stopped run's record: its Prefect state was set
RECORDED: set[str] = set()  # the flow runs of this process that wrote their record (`FlowRun.recorded`)


def crash_killed_runs(root: Path, rerun: str, log: Callable[[str], None]) -> list[str]:
    """Set Crashed every flow run of `root` that was killed while the Prefect API still shows it
    running (and its running task runs), and Cancelled every stopped one Prefect holds as Crashed
    (`cancel_stopped_runs`); returns the killed ones' names. `rerun`: the flow run doing it."""
    cancel_stopped_runs(root, log)
    killed = [r for r in flow_runs(root) if _unreported(r, "interrupted")]
    crashed = _settle(killed, lambda run: _crashed(run, rerun), lambda state: not state.is_final())
    if crashed:
        log(f"Prefect: flow run(s) {', '.join(crashed)} were killed and had stayed Running; set to Crashed")
    return crashed


def cancel_stopped_runs(root: Path, log: Callable[[str], None]) -> list[str]:
    """Set Cancelled every flow run of `root` that the user stopped (SIGTERM, Ctrl-C), with its task
    runs that Prefect holds as Crashed or not yet final; returns their names."""
    stopped = [r for r in flow_runs(root) if _unreported(r, "stopped")]
    cancelled = _settle(stopped, _cancelled, lambda state: state.is_crashed() or not state.is_final())
    if cancelled:
        log(f"Prefect: flow run(s) {', '.join(cancelled)} were stopped on request; set to Cancelled")
    return cancelled


def _settle(
    runs: list[FlowRunRecord], final: Callable[[FlowRunRecord], State], unsettled: Callable[[State], bool]
) -> list[str]:
    """Set the flow run of each of `runs`, and each of its task runs, whose Prefect state is
    `unsettled` to `final(run)`; returns the names of the flow runs set."""
    if not runs:
        return []
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    settled = []
    with get_client(sync_client=True) as client:
        for run in runs:
            try:
                if _set_state(client, UUID(run.data["flow_run_id"]), final(run), unsettled):
                    settled.append(run.name)
            except (ObjectNotFound, httpx.HTTPError):  # another Prefect API's run (PREFECT_API_URL changed)
                continue
            _note_done(run)
    return settled


def _note_done(run: FlowRunRecord) -> None:
    """The record says its Prefect state was set, keeping its modification time: `bertflow runs`
    reads a killed run's time from it (a rewrite now made it end at this rerun's start)."""
    stat = run.path.stat()
    atomic_write_json(run.path, {**run.data, DONE_KEY: True})
    os.utime(run.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _unreported(run: FlowRunRecord, status: str) -> bool:
    return run.status == status and bool(run.data.get("flow_run_id")) and not run.data.get(DONE_KEY)


def _crashed(run: FlowRunRecord, rerun: str) -> State:
    from prefect.states import Crashed

    writer = run.data.get("writer", {})
    return Crashed(
        message=f"bertflow: the process of this flow run (pid {writer.get('pid')} on {writer.get('host')}) "
        f"is gone: it was killed. Flow run {rerun} of the same run directory started after it; "
        f"`{runs_cli(run.run_dir, 'show ' + run.name)}` says what it left."
    )


def _cancelled(run: FlowRunRecord) -> State:
    from prefect.states import Cancelled

    by = run.data.get("stopped_by", "SIGTERM or Ctrl-C")
    return Cancelled(
        message=f"bertflow: stopped on request ({by}); {_again(by)} to go on from there. "
        f"`{runs_cli(run.run_dir, 'show ' + run.name)}` says what it left."
    )


def _again(by: str) -> str:
    """How to go on after a stop by `by` (`common.errors.stop_request`)."""
    from common.errors import DEPLOYMENT_SIGTERM, go_on_after_a_stop

    return go_on_after_a_stop(by == DEPLOYMENT_SIGTERM)


def cancel_a_stop_before_its_record(flow: Any, flow_run: Any, state: State) -> None:
    """The flow's `on_crashed` hook: a flow run that Prefect's engine set Crashed for a stop (Ctrl-C,
    SIGTERM) before it wrote its record is set Cancelled. It stayed Crashed, said at ERROR, with no
    record for `bertflow run` or the next flow run to set it by."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    from common.errors import Terminated, stop_request
    from pipelines.prefect_logging import STOPS

    if str(flow_run.id) in RECORDED or state.message not in STOPS:
        return
    by = stop_request(KeyboardInterrupt() if state.message == STOPS[0] else Terminated())
    said = f"bertflow: stopped on request ({by}) as it started, before any stage; {_again(str(by))}."
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Cancelled(message=said), force=True)


def _set_state(
    client: SyncPrefectClient, flow_run_id: UUID, state: State, unsettled: Callable[[State], bool]
) -> bool:
    """Set the flow run and each of its task runs whose state is `unsettled` to `state`; returns
    whether any was. The task runs are looked at whatever the flow run's state: a Cancel from Prefect
    (the UI, `prefect flow-run cancel`) sets the flow run Cancelled itself and leaves the task run
    its SIGTERM stopped Crashed."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    stale = [task.id for task in tasks if task.state is not None and unsettled(task.state)]
    for task_id in stale:
        client.set_task_run_state(task_id, state.model_copy(), force=True)
    flow_state = client.read_flow_run(flow_run_id).state
    if flow_state is not None and unsettled(flow_state):
        client.set_flow_run_state(flow_run_id, state.model_copy(), force=True)
        return True
    return bool(stale)
