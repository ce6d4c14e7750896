"""The one exception type for mistakes a user can fix (bad file, bad config, bad flag).

The CLI prints a UserError as one paragraph with no traceback and exits non-zero; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input. The message names the file/key and says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, fix: str | None = None) -> None:
        parts = [message]
        if path is not None and str(path) not in message:
            parts.append(f"(file: {path})")
        if fix:
            parts.append(f"Fix: {fix}")
        super().__init__(" ".join(parts))
