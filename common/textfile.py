"""Reading a text file that a user wrote (a vocabulary, a config, a hostfile, a task file).

Editors on Windows start UTF-8 files with a byte-order mark (U+FEFF); it is not part of the
content, so every such read goes through `read_user_text`, which drops it. Bytes that are not
UTF-8 are a UserError naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import UserError


def read_user_text(path: str | os.PathLike, what: str = "file") -> str:
    """The file's text (UTF-8, a leading byte-order mark removed)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
