"""Atomic writes: a reader sees either the old file or the complete new one, never half a file.

Write to a temp name in the same directory, fsync, then rename. Stage outputs end with a
completion marker written last (`write_marker`), so a killed run never looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.child_process import is_alive, is_gone, process_identity
from common.errors import UserError

MARKER_NAME = "_COMPLETE.json"
IN_PROGRESS_NAME = "_IN_PROGRESS.json"  # present from a stage's start until its marker is written
TMP_PREFIX = ".tmp-"
# the temp name of a write of NAME: `.tmp-NAME.` and mkstemp's 8 characters (`atomic_path`) or 12 hex
# digits (`preprocessing.storage`); a user's `.tmp-draft` is none
_TEMP_NAME = re.compile(r"^\.tmp-(?P<name>.+)\.(?:[a-z0-9_]{8}|[0-9a-f]{12})$")


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `final`; on success it is fsynced and renamed onto `final`."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + final.name + ".", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp makes 0600, and writers that replace the file (safetensors) make it 0600 again:
        # the finished file gets the usual mode, as its siblings
        os.chmod(tmp_path, 0o666 & ~_umask())
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, final)
        _fsync_dir(final.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(final: str | os.PathLike, data: bytes) -> None:
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(final: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(final, text.encode("utf-8"))


def atomic_write_json(final: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(final, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_marker(directory: str | os.PathLike, payload: dict[str, Any] | None = None) -> None:
    """Mark a stage output directory complete. Call last, after every other file is in place."""
    atomic_write_json(Path(directory) / MARKER_NAME, payload or {})
    clear_in_progress(directory)


def clear_in_progress(directory: str | os.PathLike) -> None:
    """The writer is done (`write_marker` calls it; so does a stage that writes its marker itself)."""
    (Path(directory) / IN_PROGRESS_NAME).unlink(missing_ok=True)


def release_in_progress(directory: str | os.PathLike) -> None:
    """This process stops writing `directory` without finishing it (its stage failed): its record
    goes, so the output reads 'unfinished', not 'interrupted' as after a kill; a record of another
    writer stays."""
    import socket

    writer = _in_progress(Path(directory))
    if writer.get("pid") == os.getpid() and writer.get("host") == socket.gethostname():
        clear_in_progress(directory)


def mark_in_progress(directory: str | os.PathLike) -> None:
    """Say, in the directory itself, that a process is writing it (who, where, since when), so an
    unfinished output never looks like a finished one; `write_marker` removes it."""
    import socket
    import time

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # a second run refused by the stage's lock must not have taken the output's record first
    # (`bertflow runs` would call the live output interrupted, and `clean --incomplete` delete it)
    refuse_other_writer(directory)
    atomic_write_json(
        directory / IN_PROGRESS_NAME,
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            **process_identity(),
        },
    )


def refuse_other_writer(directory: str | os.PathLike) -> None:
    """A UserError when another live process is writing `directory` (its `_IN_PROGRESS.json`)."""
    directory = Path(directory)
    writer = _in_progress(directory)
    running = read_marker(directory) is None and writer_state(writer) == "running"
    if running and writer.get("pid") != os.getpid():
        raise UserError(
            f"{directory} is being written by another process (pid {writer.get('pid')}, since "
            f"{writer.get('started_utc', '?')} UTC); two runs writing one directory would mix their files.",
            fix="wait for that run to finish, or give this one another output directory (or run_dir).",
        )


def progress_state(directory: str | os.PathLike) -> str:
    """'complete', 'running' (its writer is alive on this host), 'interrupted' (the writer is gone,
    or on another host: unknown), or 'unfinished' (no marker of either kind)."""
    directory = Path(directory)
    if read_marker(directory) is not None:
        return "complete"
    if not (directory / IN_PROGRESS_NAME).is_file():
        return "unfinished"
    return writer_state(_in_progress(directory))


def writer_state(writer: dict[str, Any]) -> str:
    """'running' (the process `writer` names, {"pid", "host"}, is alive on this host),
    'interrupted' (it is gone, or nothing readable was recorded; or its pid is now another
    process's, which `process_identity`'s boot and start time, where recorded, tell), or
    'running elsewhere?'."""
    if not writer:
        return "interrupted"
    import socket

    if writer.get("host") != socket.gethostname():
        return "running elsewhere?"
    try:
        pid = int(writer.get("pid", 0))
    except (ValueError, TypeError):
        return "interrupted"
    if pid <= 0 or not is_alive(pid) or is_gone(writer, pid):  # a reused pid is no writer
        return "interrupted"
    return "running"


def _in_progress(directory: Path) -> dict[str, Any]:
    """The writer `mark_in_progress` recorded ({} when none or unreadable)."""
    try:
        return json.loads((directory / IN_PROGRESS_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def read_marker(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The marker's payload, or None when the directory is not (yet) complete; a `_COMPLETE.json`
    that holds no JSON object (`[1]`, a user's file) is no marker of ours."""
    path = Path(directory) / MARKER_NAME
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def temp_target(name: str) -> str | None:
    """The name whose write `name` is the temp file of (`.tmp-vocab.txt.k2j_9x0a` → `vocab.txt`),
    or None for any other name."""
    match = _TEMP_NAME.match(name)
    return match.group("name") if match else None


def temp_files(directory: str | os.PathLike, written: Iterable[str] | None = None) -> list[Path]:
    """Leftovers of killed writes in a directory: temp files of the names in `written` (with
    `_COMPLETE.json` and `_IN_PROGRESS.json`), or of any name when None (a folder only bertflow
    writes, as a unit's); never a file of the user's named `.tmp-*` otherwise."""
    names = None if written is None else {*written, MARKER_NAME, IN_PROGRESS_NAME}
    return [
        p
        for p in Path(directory).glob(TMP_PREFIX + "*")
        if p.is_file() and (target := temp_target(p.name)) is not None and (names is None or target in names)
    ]


def remove_temp_files(directory: str | os.PathLike, written: Iterable[str] | None = None) -> int:
    """Delete leftovers of killed writes (`temp_files`) in a directory; returns how many."""
    leftovers = temp_files(directory, written)
    for p in leftovers:
        p.unlink()
    return len(leftovers)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
