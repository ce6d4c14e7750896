"""Prefect logs a failed task or flow run with the exception's traceback. For a UserError (a
message naming the file or key and the fix, e.g. a full disk) the traceback only buries that
message: keep Prefect's log line, drop the traceback."""

from __future__ import annotations

import logging

from common.errors import UserError

RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")


class _UserErrorWithoutTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], UserError):
            record.exc_info, record.exc_text = None, None
        return True


def drop_user_error_tracebacks() -> None:
    """Install the filter on Prefect's task and flow run loggers (idempotent)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _UserErrorWithoutTraceback) for f in logger.filters):
            logger.addFilter(_UserErrorWithoutTraceback())
