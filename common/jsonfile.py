"""Reading a JSON object that a user or an earlier stage wrote, with one clear error for each way
it can be wrong (missing, not JSON, not an object)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.paths import check_input_file
from common.textfile import read_user_text


def read_json_object(
    path: Path,
    what: str,
    missing: str | None = None,
    missing_fix: str | None = None,
    invalid_fix: str | None = None,
) -> dict[str, Any]:
    """`what` names the file in errors ("DeepSpeed config", ...); `missing` replaces the default
    message for a file that does not exist."""
    check_input_file(path, what, fix=missing_fix, missing=missing)
    try:
        data = json.loads(read_user_text(path, what))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(
            f"{what} {path} is not valid JSON (corrupt or truncated: {exc}).", fix=invalid_fix
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must hold a JSON object, not {type(data).__name__}.", fix=invalid_fix)
    return data


def read_json_or_empty(path: Path) -> dict[str, Any]:
    """A JSON object written by an earlier stage, or {} when it is missing or not an object: for
    what only describes a result (the model card, display names), never for what decides one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
