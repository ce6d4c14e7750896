"""Reading a YAML file that a user wrote (the pipeline config, a task config), with one clear error
for each way it can be wrong: not YAML (one line with its line and column, not PyYAML's multi-line
excerpt), or a key written twice in one mapping, which PyYAML accepts by keeping the last value,
so a second `pretrain:` section silently dropped every setting of the first."""

from __future__ import annotations

import os
from typing import Any

import yaml

from common.errors import UserError
from common.textfile import read_user_text

MERGE_TAG = "tag:yaml.org,2002:merge"


def read_user_yaml(path: str | os.PathLike, what: str) -> Any:
    """The YAML document in `path` (None for an empty file); `what` names the file in errors
    ("config file", "task config")."""
    text = read_user_text(path, what)
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, "", path, what)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {path} is not valid YAML{_where(exc)}: {_problem(exc)}.") from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    return getattr(exc, "problem", None) or str(exc).replace("\n", " ")


def _refuse_duplicate_keys(node: yaml.Node, parent: str, path: str | os.PathLike, what: str) -> None:
    """A UserError for the first key that appears twice in one mapping, anywhere below `node`."""
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{parent}[{index}]", path, what)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    first_line: dict[tuple[str, str], int] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == MERGE_TAG:
            continue  # `<<: *a` twice merges both anchors: not a repeat
        dotted = f"{parent}.{key_node.value}" if parent else key_node.value
        line = key_node.start_mark.line + 1
        key = (key_node.tag, key_node.value)
        if key in first_line:
            lines = f"lines {first_line[key]} and {line}" if first_line[key] != line else f"line {line}"
            raise UserError(
                f"{what} {path}: key {dotted!r} appears twice ({lines}); "
                "YAML would keep only the second and drop the first one's settings.",
                fix="write the key once (merge the two into one).",
            )
        first_line[key] = line
        _refuse_duplicate_keys(value_node, dotted, path, what)
