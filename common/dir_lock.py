"""One process at a time per output directory.

Every stage that writes a directory (the tokenizer, preprocess and pretrain stages, each
fine-tuning unit), and export-hf / import-hf while they publish OUT_DIR, holds an exclusive
`flock` while it writes: a second run on the same directory (`bertflow run cfg.yaml` twice on one
run_dir) is refused with one message instead of both writing the same files. The lock dies with its process (kill -9 included), so a stale lock file never
blocks a rerun. The file holds the holder's pid, which the message names.

The lock file of a stage output lies beside it (`PARENT/.NAME.lock`), so that the output holds
only what the stage writes (fault tests compare shard and tokenizer directories byte for byte);
a fine-tuning unit's lies inside its directory (`UNIT/.lock`).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import UserError

LOCK_FILE = ".lock"


def lock_file_of(directory: Path, inside: bool = False) -> Path:
    return directory / LOCK_FILE if inside else directory.parent / f".{directory.name}.lock"


@contextmanager
def exclusive_dir(directory: str | os.PathLike, what: str, inside: bool = False) -> Iterator[None]:
    """Hold the lock of DIR: `PARENT/.NAME.lock` (PARENT is created; DIR is its writer's to make,
    so that a refused export-hf leaves no empty OUT_DIR), or `DIR/.lock` with `inside` (DIR is
    created); a UserError naming `what` when another process holds it."""
    directory = Path(directory)
    lock_path = lock_file_of(directory, inside)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock_path, "a+")
    except OSError as exc:
        raise UserError(
            f"cannot write {directory}: {exc.strerror}.", fix="choose a writable output folder."
        ) from None
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise UserError(
                f"{what} in {directory} is being run by another process (pid {holder}, which holds "
                f"{lock_path}); two runs writing one directory would mix their files.",
                fix="wait for that run to finish, or give this one another output directory (or run_dir).",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield
    finally:
        fh.close()


def remove_orphan_locks(parent: Path) -> None:
    """Delete the lock files in `parent` of outputs that do not exist (`.NAME.lock` without `NAME`:
    a run refused or killed after it took the lock and before it made its output) and that no
    process holds; each is deleted while this process holds it."""
    for lock_path in sorted(parent.glob(".*.lock")):
        if (parent / lock_path.name[1 : -len(".lock")]).exists():
            continue
        try:
            with open(lock_path, "a+") as fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_path.unlink()
        except (BlockingIOError, FileNotFoundError):
            pass  # held by a live run, or gone already
