"""Child processes that do not outlive the process that started them, and whose output outlives
its reader."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux /proc; None where it is gone or
    there is no /proc): a process that later gets the same pid has another."""
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return int(fields[19]) if fields else None


def stat_fields(stat: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ..., starttime at 19)."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this machine (signal 0 only asks; another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def boot_id() -> str | None:
    """This boot of the machine (Linux; None elsewhere): process start times count from it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_identity() -> dict[str, Any]:
    """What tells this process from a later one with its pid (after a reboot, or pids wrapping
    round): {"boot_id", "start"}, for a record of who writes something (`common.atomic.writer_state`)."""
    identity = {"boot_id": boot_id(), "start": start_time(os.getpid())}
    return {k: v for k, v in identity.items() if v is not None}


def is_gone(writer: dict[str, Any], pid: int) -> bool:
    """Whether the live process `pid` is not the one a record `writer` (`process_identity` and pid)
    names: it started in another boot or at another time, so it only reuses that pid."""
    boot, now = writer.get("boot_id"), boot_id()
    if boot and now and boot != now:
        return True
    start = writer.get("start")
    return start is not None and start_time(pid) not in (None, start)


def die_with_parent() -> None:
    """`preexec_fn` for subprocess.Popen (Linux): the child gets SIGTERM when the thread that
    started it ends, so even `kill -9` of its parent leaves no orphan. Start such children from
    the main thread (it lives as long as the process)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def watch_parent(parent: int, on_orphaned: Callable[[], None]) -> None:
    """Call `on_orphaned` (once, from a daemon thread) when this process's parent `parent` is gone,
    within half a second. For a child whose parent may die without passing a signal on (kill -9 of
    the torchrun launcher: its ranks, in sessions of their own, would train on with no one waiting)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        on_orphaned()

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def to_devnull(stream: TextIO) -> None:
    """Point `stream`'s file descriptor at /dev/null (C-level writers and logging handlers that
    hold the stream too): what is written after its reader left goes nowhere, without an error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


class _ReaderSurvivingStream:
    """A text stream whose writes outlive the process that reads them: the first BrokenPipeError
    points its file descriptor at /dev/null and the write counts as done."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            to_devnull(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            to_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def survive_a_lost_reader() -> None:
    """For a process whose work must outlive the reader of its stdout/stderr: a pretraining rank,
    whose output is a pipe to `bertflow` (a print raised BrokenPipeError once `bertflow` was killed,
    stopping the rank before it saved the step reached), and `bertflow run` (`| tee LOG`, tee gone:
    Prefect's console handler raised SystemExit and the flow crashed), and its fine-tuning workers,
    which inherit that output. After this call such output goes to /dev/null instead."""
    sys.stdout = _ReaderSurvivingStream(sys.stdout)  # type: ignore[assignment]
    sys.stderr = _ReaderSurvivingStream(sys.stderr)  # type: ignore[assignment]
