"""Which code made an output: installed package versions (from package metadata, nothing imported)
and digests of the project's own source files.

A source digest hashes a file's syntax tree without docstrings, so comments, docstrings and
formatting leave it unchanged and any change to the code changes it. Stage outputs record the
digests of the code that made them (`pipelines/stage_keys.py`, `STAGE_CODE`), so reusing an output
that other code made can be said out loud.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from importlib import metadata
from pathlib import Path

from common.paths import PROJECT_ROOT


def package_version(name: str = "bertflow") -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def source_digests(patterns: tuple[str, ...], root: Path = PROJECT_ROOT) -> dict[str, str]:
    """Project-relative path → digest of every Python file the globs `patterns` match under `root`."""
    files = sorted({p for pattern in patterns for p in root.glob(pattern) if p.suffix == ".py"})
    return {p.relative_to(root).as_posix(): _source_digest(p, p.stat().st_mtime_ns) for p in files}


@functools.cache
def _source_digest(path: Path, _mtime_ns: int) -> str:
    """sha256 (16 hex digits) of the file's syntax tree without docstrings; of its bytes when it does
    not parse. `_mtime_ns` keys the cache, so an edited file is read again."""
    data = path.read_bytes()
    try:
        tree = ast.parse(data)
    except SyntaxError:
        return hashlib.sha256(data).hexdigest()[:16]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def changed_sources(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The files that differ between two `source_digests` results (changed, added or removed)."""
    return sorted(f for f in recorded.keys() | current.keys() if recorded.get(f) != current.get(f))
