"""Prefect logs a failed task or flow run with the exception's traceback. For a UserError (a
message naming the file or key and the fix, e.g. a full disk) or a TransientError (a lost rank or
worker, a failed fine-tuning unit, and the way on) the traceback only buries that message: keep the
failed task's log line (it names the stage), drop the traceback, and drop the flow run's two repeats
of the same message (`bertflow run` ends by printing it once more).

A run the user stopped (Ctrl-C, SIGTERM) is one Prefect's engine logs as "Crash detected! Execution was
aborted by ... signal." at ERROR, for the flow run and for the task run it stopped: said as what it
is, at INFO, and its "Finished in state Crashed(...)" at INFO too (`bertflow run` then sets both
Cancelled and says so, `pipelines.prefect_killed_runs`). A deployment's flow run stopped by a Cancel in
Prefect ends with the engine's "Finished in state Running()": the worker that sent the SIGTERM sets the
final state (Cancelled) once the process is gone, so the engine logs the state it last held; said as
what it is (`WORKER_SETS_STATE`).

When the temporary API server stops at the end of a flow (or dies and is started again while it
runs), websockets may log "keepalive ping failed" at ERROR with the ConnectionClosedError's
traceback: a ping sent in the moment between the server's end and the connection's own cleanup,
which should have cancelled it (websockets 16, `Connection.keepalive`). The connection is gone for
a reason bertflow knows and says; that line is kept, at DEBUG, without the traceback."""

from __future__ import annotations

import logging

from common.errors import TransientError, UserError

RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
WEBSOCKETS_CLIENT = "websockets.client"  # Prefect's events and logs websockets to its API
EXPLAINED = (UserError, TransientError)  # what `pipelines.cli` prints as one paragraph
# Prefect's Crashed message for a KeyboardInterrupt (Ctrl-C; bertflow's Terminated) and for its own
# TerminationSignal (SIGTERM while its flow engine runs): prefect.states.exception_to_crashed_state
STOPS = ("Execution was aborted by an interrupt signal.", "Execution was aborted by a termination signal.")
STOPPED = "stopped on request (Ctrl-C or SIGTERM), not a crash: bertflow sets it Cancelled"
# prefect.flow_engine's lines around bertflow's on_crashed hook (`pipelines.prefect_killed_runs`)
HOOK_LINES = ("Running hook 'cancel_a_stop_before_its_record' ", "Hook 'cancel_a_stop_before_its_record' ")
# prefect.flow_engine logs the state it holds as the process ends; after a Cancel its worker sets the final one
WORKER_SETS_STATE = "Finished: stopped by its worker (a Cancel in Prefect), which sets the flow run Cancelled"


class _UserErrorWithoutTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        user_error = bool(record.exc_info and isinstance(record.exc_info[1], EXPLAINED))
        if user_error:
            record.exc_info, record.exc_text = None, None
        if record.name == "prefect.flow_runs":  # "Encountered exception ...", "Finished in state Failed(...)"
            message = record.getMessage()
            return not (user_error or any(f"{name}:" in message for name in _user_error_names()))
        return True


class _StopNotCrash(logging.Filter):
    """Prefect's "Crash detected!" for a run the user stopped said as a stop, at INFO, and its
    "Finished in state Crashed(...)" at INFO too, as a task run's "Finished in state Cancelled(...)";
    a flow run's "Finished in state Running()" (its worker sets the final state) as `WORKER_SETS_STATE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in [f"Crash detected! {said}" for said in STOPS]:
            record.msg, record.args = STOPPED, ()
        if record.name == "prefect.flow_runs" and str(record.msg).startswith("Finished in state Running("):
            record.msg, record.args = WORKER_SETS_STATE, ()
        if any(str(record.msg).startswith(said) for said in HOOK_LINES):
            return False  # Prefect's lines around the flow's on_crashed hook: it said "Crashed" on a stop
        stopped = record.msg in [STOPPED, *(f"Finished in state Crashed({said!r})" for said in STOPS)]
        # a fine-tuning unit stopped with its flow run (`finetune_unit_task`): Prefect says it at ERROR
        if stopped or record.getMessage().startswith("Finished in state Cancelled("):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class _ClosedConnectionPing(logging.Filter):
    """websockets' "keepalive ping failed" on a connection already closed, at DEBUG without its
    traceback (so not shown unless that logger logs DEBUG); any other websockets error as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        from websockets.exceptions import ConnectionClosed

        closed = bool(record.exc_info and isinstance(record.exc_info[1], ConnectionClosed))
        if not (closed and record.msg == "keepalive ping failed"):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        # Prefect's console handler has no level of its own: the logger's decides, as for a DEBUG call
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _user_error_names() -> list[str]:
    """UserError, TransientError and their subclasses (PretrainingStopped, ...) by name, as Prefect's
    state messages print them."""
    names, todo = [], list(EXPLAINED)
    while todo:
        cls = todo.pop()
        names.append(cls.__name__)
        todo += cls.__subclasses__()
    return names


def install_log_filters() -> None:
    """Install the filters on Prefect's task and flow run loggers and on websockets' client logger
    (idempotent)."""
    loggers = {name: (_StopNotCrash, _UserErrorWithoutTraceback) for name in RUN_LOGGERS}
    for name, kinds in {**loggers, WEBSOCKETS_CLIENT: (_ClosedConnectionPing,)}.items():
        logger = logging.getLogger(name)
        for kind in kinds:
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())
