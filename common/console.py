"""How a warning is marked: by the sink, never in the note's text. The flow logs a note at WARNING
level (Prefect's console shows `WARNING | ...`); a stand-alone command prints it, or logs it
through `command_logging`, after one `warning: `. A note that carried its own marker read
`WARNING | ... - warning: ...` in the flow's log."""

from __future__ import annotations

import logging

WARNING_MARK = "warning: "


def warning_line(note: str) -> str:
    """`note` as a command prints it: 'warning: NOTE'."""
    return WARNING_MARK + note


class _WarningMarked(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING:
            marked = {**record.__dict__, "msg": warning_line(record.getMessage()), "args": None}
            record = logging.makeLogRecord(marked)
        return super().format(record)


def command_log_handler() -> logging.Handler:
    """To stderr: time, logger, message; a warning marked once."""
    handler = logging.StreamHandler()
    handler.setFormatter(_WarningMarked("%(asctime)s %(name)s: %(message)s"))
    return handler


def command_logging() -> None:
    """The console log of a stand-alone stage command (`command_log_handler`), at INFO."""
    logging.basicConfig(level=logging.INFO, handlers=[command_log_handler()])
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
