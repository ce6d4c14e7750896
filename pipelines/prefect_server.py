"""Prefect's temporary API server for `bertflow run`, owned by this process.

Prefect starts its temporary server (`SubprocessASGIServer`, uvicorn) in the caller's process
group. Ctrl-C in a terminal signals that whole group, so the server died at once while the flow
was still recording its crash, and Prefect then retried each API call for minutes ("Error logging
to API - All connection attempts failed"); `kill -TERM` ended `bertflow` without its atexit hooks
and left the server running. Here the server runs in a session of its own (a Ctrl-C reaches only
`bertflow`, which stops the server when the flow has recorded its end) and gets SIGTERM when
`bertflow` dies, even by `kill -9`. A server that dies on its own while the flow runs (the OOM
killer's pick, a `kill` of the wrong process) is started again on the same port and database: the
flow's calls, which Prefect retries for a while, then reach it, and the flow goes on. Before, the
stages finished and then `bertflow run` retried every record and event for minutes and ended in a
ConnectError traceback, its work done but its run marked failed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, get_current_settings

from common.child_process import die_with_parent

DRAIN_TIMEOUT_S = 5.0  # the log and event workers' last sends when the flow ends
API_LIMIT = 200  # the most rows one read returns (the server's default PREFECT_SERVER_API_DEFAULT_LIMIT)


class OwnedTemporaryServer(SubprocessASGIServer):
    """Prefect's temporary server (the same uvicorn command as Prefect 3.8's
    `SubprocessASGIServer._run_uvicorn_command`) in its own session, dying with this process, and
    started again if it dies before `stop`.

    Prefect keeps one server per port in a class-level registry: created first, this instance is
    the one every later `SubprocessASGIServer()` of Prefect's client code returns."""

    def start(self, timeout: int | None = None) -> None:
        super().start(timeout)
        if not hasattr(self, "_stopping"):
            self._stopping = threading.Event()
            # the thread that starts a server again must outlive it (die_with_parent)
            threading.Thread(target=self._keep_alive, name="prefect-server-keeper", daemon=True).start()

    def stop(self) -> None:
        if hasattr(self, "_stopping"):
            self._stopping.set()
        super().stop()

    def _keep_alive(self) -> None:
        """Start the server again, on its port, whenever it ends before `stop` (checked twice a second)."""
        while not self._stopping.wait(0.5):
            proc = self.server_process
            if proc is None or proc.poll() is None or self._stopping.is_set():
                continue
            logging.getLogger("prefect").warning(
                "Prefect's temporary API server (pid %d) ended (exit code %s) while the flow runs; "
                "starting it again on %s",
                proc.pid,
                proc.returncode,
                self.address,
            )
            self.server_process = self._run_uvicorn_command()

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        args = [
            sys.executable, "-m", "uvicorn",
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--log-level", "error", "--lifespan", "on",
        ]  # fmt: skip
        return subprocess.Popen(
            args,
            env={
                **os.environ,
                **server_env,
                **get_current_settings().to_environment_variables(exclude_unset=True),
            },
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def start_temporary_server() -> None:
    """Start the temporary API from this (the main) thread, unless PREFECT_API_URL names a server."""
    if not PREFECT_API_URL.value():
        OwnedTemporaryServer().start()


def stop_prefect(task_run_ids: Sequence[str] = ()) -> None:
    """Flush Prefect's log and event workers (a few seconds at most), let the temporary API record
    the final states of `task_run_ids` (the flow run's tasks; a few seconds at most), then stop it.

    A task run's states reach the API as events, which the server's task-run recorder writes to its
    database one by one after they arrive. Stopped in the middle of such a write, the server printed
    "Error flushing 1 events" with two tracebacks after a finished flow (2 of 16 cached reruns, two at
    a time on one database; the recorder retries such an event while it shuts down)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
    EventsWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
    servers = list(SubprocessASGIServer._instances.values())
    if servers and task_run_ids:
        wait_for_task_run_records(task_run_ids, DRAIN_TIMEOUT_S)
    for server in servers:
        server.stop()


def wait_for_task_run_records(task_run_ids: Sequence[str], timeout_s: float) -> bool:
    """Whether the API holds every one of `task_run_ids` in a final state within `timeout_s`."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    pending = list({UUID(i) for i in task_run_ids})
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while pending:
            wanted = TaskRunFilter(id=TaskRunFilterId(any_=pending[:API_LIMIT]))
            final = {
                r.id for r in client.read_task_runs(task_run_filter=wanted) if r.state and r.state.is_final()
            }
            if not final.issuperset(pending[:API_LIMIT]):  # the server has not recorded them yet
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)
            pending = [i for i in pending if i not in final]
    return True
