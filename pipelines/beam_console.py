"""Keep Beam's start-up chatter off the console while a preprocessing job runs.

Every Beam run prints the same harmless warnings, from the driver and again from each local worker
process (which writes to the stderr it inherits): BigQuery's missing apitools, "Logging handler
created", "No semi_persistent_directory found", "Discarding unparseable args", and the workers'
copies of them relayed through the job service. `quiet_beam(log)` routes them to a log file:
while the job runs, file descriptor 2 is a pipe that a thread reads line by line, sending known
chatter to `log` and everything else (our own log lines, real warnings, tracebacks) on to the
console unchanged, except Beam's own ERROR records of a failed bundle with their tracebacks
(`BeamErrorBlocks`): the job raises that error, and the command reports it once; and the tracebacks
a Ctrl-C makes Beam print (`InterruptTracebacks`): the command says "interrupted." once.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHATTER = (
    "apitools not found, and bigquery client libraries are not available",
    "Logging handler created.",
    "No semi_persistent_directory found",
    "Discarding unparseable args",
)
RELAY_LOGGER = "apache_beam.runners.portability.local_job_service"  # workers' messages, in the driver


def beam_log_path(out_dir: str | Path) -> Path:
    """Where a job's chatter goes: a temp file named after the output (the output directory itself
    holds only what the job makes, byte-identical from run to run)."""
    import hashlib
    import tempfile

    tag = hashlib.sha256(str(out_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"bertflow-beam-{tag}.log"


def is_chatter(text: str) -> bool:
    return any(marker in text for marker in CHATTER)


class _DropChatter(logging.Filter):
    def __init__(self, log) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if is_chatter(message) or (
            record.levelno >= logging.ERROR and record.name.startswith("apache_beam.")
        ):
            self.log.write(f"{record.name}: {message}\n")  # Beam's error records: see BeamErrorBlocks
            return False
        return True


class BeamErrorBlocks:
    """Recognises Beam's own error log records on stderr, each with its traceback: a failing
    DoFn is logged by the worker, again by the worker's bundle processor, and relayed twice more
    by the driver's job service (200+ lines for one error). The job then raises that error, so the
    CLI shows it once (one line for a user error, else its traceback); the copies go to the log."""

    HEADERS = ("Traceback (most recent call last)", "During handling of the above", "The above exception")

    def __init__(self) -> None:
        self.inside = False
        self.after_frame = False  # the previous line was a traceback frame: this one may be the error

    def takes(self, line: str) -> bool:
        if line.startswith(("ERROR:apache_beam.", "CRITICAL:apache_beam.")):
            self.inside, self.after_frame = True, False
            return True
        if not self.inside:
            return False
        indented = line[:1] in (" ", "\t")
        if indented or not line.strip() or line.startswith(self.HEADERS) or self.after_frame:
            self.after_frame = indented
            return True
        self.inside = False
        return False


class InterruptTracebacks:
    """Recognises what a Ctrl-C makes Beam print: every worker's "Python sdk harness failed" and
    KeyboardInterrupt tracebacks, then the driver's threads that lose them (grpc.RpcError, "Worker
    subprocess exited with return code -2"): ~140 lines for two workers. The lines of a traceback are
    held until its last line: one that says interrupted sends the block to the log and puts this into
    the interrupted state, where every traceback line goes to the log (two workers' blocks arrive
    interleaved); any other block goes to the console as it was. Lines outside a traceback pass at
    once."""

    STARTS = BeamErrorBlocks.HEADERS + ("Exception in thread ", "CRITICAL:__main__:Python sdk harness")
    INTERRUPTED = re.compile(
        r"^(KeyboardInterrupt|RuntimeError: Worker subprocess exited with return code -(2|15))$"
    )

    def __init__(self) -> None:
        self.held: list[str] = []
        self.after_frame = False  # the previous line was a traceback frame: this one may be the error
        self.interrupted = False

    def feed(self, line: str) -> tuple[list[str], list[str]]:
        """(lines for the console, lines for the log) now that `line` has arrived."""
        indented = line[:1] in (" ", "\t")
        if self.interrupted and (indented or not line.strip() or line.startswith(self.STARTS) or
                                 self.after_frame or self.INTERRUPTED.match(line.strip())):  # fmt: skip
            self.after_frame = indented
            return [], [line]
        if line.startswith(self.STARTS) or (self.held and indented):
            self.held.append(line)
            self.after_frame = indented
            return [], []
        if not (self.held and self.after_frame):  # not in a traceback, or it ended oddly: release it
            released, self.held = self.held, []
            return released + [line], []
        block, self.held, self.after_frame = self.held + [line], [], False
        if self.INTERRUPTED.match(line.strip()):
            self.interrupted = True
            return [], block
        return block, []

    def flush(self) -> list[str]:
        released, self.held = self.held, []
        return released


class _DropImportChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not is_chatter(record.getMessage())


@contextmanager
def no_default_root_handler() -> Iterator[None]:
    """Beam's import warns on the root logger (BigQuery's missing apitools) through
    `logging.warning`, which gives a root without handlers Python's default console handler;
    Prefect then takes that handler for the user's own and leaves its console unset, and the flow's
    lines read `INFO:prefect.flow_runs:...`. Within the block, a NullHandler on such a root keeps
    it so (the warning is import chatter: dropped)."""
    root = logging.getLogger()
    guard = None if root.handlers else logging.NullHandler()
    if guard is not None:
        root.addHandler(guard)
    try:
        yield
    finally:
        if guard is not None:
            root.removeHandler(guard)


def drop_import_chatter() -> None:
    """Beam warns about BigQuery's missing apitools on the root logger when it is first imported,
    outside any job (so `quiet_beam` cannot catch it; in a flow it became a task-run WARNING):
    drop that record in this process. Idempotent."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropImportChatter) for f in root.filters):
        root.addFilter(_DropImportChatter())


@contextmanager
def quiet_beam(log_path: Path) -> Iterator[None]:
    """Within the block, Beam's known chatter goes to `log_path`, the rest of stderr to the console."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    console = os.dup(2)
    read_end, write_end = os.pipe()
    with open(log_path, "w", encoding="utf-8", buffering=1) as log:
        relay = _DropChatter(log)
        logging.getLogger(RELAY_LOGGER).addFilter(relay)
        logging.getLogger().addFilter(relay)

        def pump() -> None:
            errors, interrupts = BeamErrorBlocks(), InterruptTracebacks()
            with os.fdopen(read_end, "rb") as pipe:
                for raw in pipe:
                    line = raw.decode("utf-8", "replace")
                    if is_chatter(line) or errors.takes(line):
                        log.write(line)
                        continue
                    to_console, to_log = interrupts.feed(line)
                    log.writelines(to_log)
                    if to_console:  # nothing while a traceback is held
                        os.write(console, "".join(to_console).encode())
            os.write(console, "".join(interrupts.flush()).encode())

        thread = threading.Thread(target=pump, name="beam-stderr", daemon=True)
        thread.start()
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(console, 2)  # the pipe's last writer in this process is gone: the pump ends
            thread.join(timeout=10)
            os.close(console)
            logging.getLogger(RELAY_LOGGER).removeFilter(relay)
            logging.getLogger().removeFilter(relay)
