"""Prefect's temporary API server for `bertflow run`, owned by this process.

Prefect starts its temporary server (`SubprocessASGIServer`, uvicorn) in the caller's process
group. Ctrl-C in a terminal signals that whole group, so the server died at once while the flow
was still recording its crash, and Prefect then retried each API call for minutes ("Error logging
to API - All connection attempts failed"); `kill -TERM` ended `bertflow` without its atexit hooks
and left the server running. Here the server runs in a session of its own (a Ctrl-C reaches only
`bertflow`, which stops the server when the flow has recorded its end) and gets SIGTERM when
`bertflow` dies, even by `kill -9`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, get_current_settings

from common.child_process import die_with_parent

DRAIN_TIMEOUT_S = 5.0  # the log and event workers' last sends when the flow ends


class OwnedTemporaryServer(SubprocessASGIServer):
    """Prefect's temporary server (the same uvicorn command as Prefect 3.8's
    `SubprocessASGIServer._run_uvicorn_command`) in its own session, dying with this process.

    Prefect keeps one server per port in a class-level registry: created first, this instance is
    the one every later `SubprocessASGIServer()` of Prefect's client code returns."""

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


def stop_prefect() -> None:
    """Flush Prefect's log and event workers (a few seconds at most), then stop the temporary API."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
    EventsWorker.drain_all(timeout=DRAIN_TIMEOUT_S)
    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()
