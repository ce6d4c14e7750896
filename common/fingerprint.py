"""The one way to answer "has this already been computed?": a digest of everything that determines
an output.

`digest` hashes a JSON-able description of a computation's inputs (keys sorted, so dict order never
matters). Files enter that description by a cheap stamp (`file_stamp`: path, size, mtime), which
changes whenever a file is replaced or edited, or, for small files whose content matters more than
their path (a DeepSpeed JSON, a task YAML, a vocabulary), by a content hash (`content_digest`).
Corpus files enter by `content_stamp` (path, size, sha256): a corpus copied again or touched keeps
its bytes, so it must not cost an hour of pretraining; its sha256 is remembered per file version
(its `file_stamp`) in the user's cache, so each version is read once.

Users of the scheme: the stage keys (`pipelines/stage_keys.py`, the directory a stage writes), the
fine-tuning unit keys (`finetuning/fanout.py`: the checkpoint by `model_dir_content`, so a moved or
copied run finds its units), the pretraining run fingerprint in its completion marker
(`training/preflight.py`), and the tokenizer stage's identity. The preprocessing manifest
is the one place that records sha256 of every input file instead of stamps: it travels with the
shards as their provenance, where a path and an mtime mean nothing on another machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_text, sha256_file
from common.paths import user_cache_dir

KEY_LENGTH = 12  # the stage / unit keys in directory names


def digest(obj: Any, length: int | None = None) -> str:
    """sha256 of `obj` as canonical JSON (sorted keys, no spaces); the first `length` hex digits."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    full = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return full if length is None else full[:length]


def file_stamp(path: str | os.PathLike) -> dict[str, Any]:
    """path + size + mtime: cheap, and changes whenever the file is replaced or edited."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError:
        return {"path": str(path), "missing": True}
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def content_stamp(path: str | os.PathLike) -> dict[str, Any]:
    """path + size + sha256 of the bytes: the same after a copy or `touch` that keeps the bytes."""
    stamp = file_stamp(path)
    if stamp.get("missing"):
        return stamp
    return {"path": stamp["path"], "size": stamp["size"], "sha256": _remembered_sha256(stamp)}


def _remembered_sha256(stamp: dict[str, Any]) -> str:
    """sha256 of the file `stamp` describes, read once per file version (its `file_stamp`): one small
    memo file per version under the user's cache; a memo that cannot be read or written only costs
    a re-read."""
    version = digest(stamp)
    memo = user_cache_dir() / "file_sha256" / version[:2] / version
    try:
        remembered = memo.read_text().strip()
        if len(remembered) == 64:
            return remembered
    except OSError:
        pass
    value = sha256_file(stamp["path"])
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, value)
    except OSError:
        pass
    return value


def content_digest(path: str | os.PathLike, length: int = 16) -> str:
    """Hash of a small file's bytes (`missing:PATH` when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return f"missing:{path}"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:length]


def _model_files(directory: Path) -> list[Path]:
    """A model directory's config and weight files (any HF layout)."""
    patterns = ("config.json", "*.safetensors", "*.bin", "*.index.json")
    return sorted(p for pattern in patterns for p in directory.glob(pattern))


def model_dir_stamp(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Stamps of a model directory's config and weight files: a model retrained into the same
    directory gets a new stamp."""
    directory = Path(directory)
    return [file_stamp(p) for p in _model_files(directory)] or [{"path": str(directory), "missing": True}]


def model_dir_content(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """A model directory's config and weight files by name, size and sha256 (`content_stamp`),
    without the directory's path: the same after the directory is moved or copied, new when a model
    is retrained into it."""
    return [{**content_stamp(p), "path": p.name} for p in _model_files(Path(directory))]
