"""A full disk as one message: where, how much is free there, and about how much the work needs.

A full disk reaches us in many forms: an OSError with errno ENOSPC (or EDQUOT, a full quota), the
same error as text inside a Beam worker's RuntimeError, or a library's own words without any errno
(torch's zip writer: "file write failed"). `disk_full_error` turns any of them into one UserError;
a rerun after freeing space continues from what was written completely.
"""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

from common.errors import UserError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# "[Errno 28] No space left on device: '/path'" as Python prints an OSError (path optional)
_FULL_TEXT = re.compile(rf"\[Errno (?:{'|'.join(map(str, _FULL_ERRNOS))})\] [^:'\n]*(?:: '([^']+)')?")

_FULL_WORDS = ("No space left on device", "Disk quota exceeded")  # strerror, in other libraries' errors


def byte_size(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def free_bytes(path: str | Path) -> int | None:
    """Free space on the filesystem of `path` (its nearest existing folder); None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def full_disk_path(exc: BaseException) -> str | None:
    """'' or the path named when `exc` (or an exception it came from) says the disk is full; None
    when it does not."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return str(e.filename or "")
        m = _FULL_TEXT.search(str(e))
        if m:
            return m.group(1) or ""
        if any(words in str(e) for words in _FULL_WORDS):
            return ""
        e = e.__cause__ or e.__context__
    return None


def disk_full_error(where: str | Path, needed_bytes: float | None, what: str) -> UserError:
    """The one message for a full disk while `what` wrote below `where`."""
    free = free_bytes(where)
    free_text = f"{byte_size(free)} free there now" if free is not None else "free space unknown"
    need_text = f"; {what} needs about {byte_size(needed_bytes)}" if needed_bytes else ""
    return UserError(
        f"the disk is full: no space left to write {where} ({free_text}{need_text}).",
        fix="free space on that disk (or choose an output folder on another one), then rerun the same "
        "command: it continues from what was written completely.",
    )
