"""Reading a YAML file that a user wrote (the pipeline config, a task config): YAML that does not
parse is one line with its line and column, not PyYAML's multi-line excerpt."""

from __future__ import annotations

import os
from typing import Any

import yaml

from common.errors import UserError
from common.textfile import read_user_text


def read_user_yaml(path: str | os.PathLike, what: str) -> Any:
    """The YAML document in `path` (None for an empty file); `what` names the file in errors
    ("config file", "task config")."""
    loader = yaml.SafeLoader(read_user_text(path, what))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {path} is not valid YAML{_where(exc)}: {_problem(exc)}.") from None
    finally:
        loader.dispose()


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    return getattr(exc, "problem", None) or str(exc).replace("\n", " ")
