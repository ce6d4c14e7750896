"""Memory-mapped example arrays: the ranks of a node share one copy of the training data.

Decoding the Parquet shards into numpy arrays in every rank costs ~5 bytes per token per rank
(8 ranks on a node: 8 copies) and a full Parquet read at every start and resume. Instead, the
first rank of each node flattens a split once, one shard at a time (memory bounded by the largest
shard), into raw arrays under `<cache_root>/<split>/` and every rank opens them with `np.memmap`:
the OS page cache holds one copy per node, and a resume opens the arrays without reading Parquet.

A cache directory is complete when its `cache.json` (written last, after an atomic rename of the
whole directory) lists the manifest entries it was built from and the byte size and sha256 of
every array; a cache built from other shards, or truncated or altered since, is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np

from common.atomic import sha256_file
from common.errors import UserError
from preprocessing import shard_format
from training.data import flatten_table

CACHE_META = "cache.json"
VERSION = 1
ARRAYS: dict[str, str] = {  # the ExampleStore fields, as raw little-endian arrays
    "input_ids": "<i4",
    "segment_ids": "i1",
    "offsets": "<i8",
    "mlm_positions": "<i4",
    "mlm_ids": "<i4",
    "mlm_offsets": "<i8",
    "nsp_labels": "i1",
}


def source_key(shards_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """What a cache is built from: the manifest's entries for the split (names, counts, sha256)."""
    manifest = shard_format.read_manifest(shards_dir)
    entries = manifest.get("splits", {}).get(split)
    if not entries:
        raise UserError(
            f"{Path(shards_dir) / shard_format.MANIFEST_NAME} lists no {split!r} shards.",
            fix="rerun preprocess on a corpus with enough documents.",
        )
    return [{k: e.get(k) for k in ("path", "num_examples", "sha256")} for e in entries]


def build(shards_dir: str | Path, split: str, target: Path) -> Path:
    """Flatten every shard of `split` into `target` (atomically: a temp dir renamed at the end)."""
    paths = shard_format.shard_paths(shards_dir, split, verify=True)
    tmp = target.with_name(f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = {name: (tmp / f"{name}.bin").open("wb") for name in ARRAYS}
    token_base, mlm_base, rows = 0, 0, 0
    files["offsets"].write(np.zeros(1, "<i8").tobytes())
    files["mlm_offsets"].write(np.zeros(1, "<i8").tobytes())
    try:
        for path in paths:
            arrays = flatten_table(shard_format.read_shard(path), f"shard {path}")
            for name, dtype in ARRAYS.items():
                values = arrays[name]
                if name == "offsets":
                    values = values[1:] + token_base
                elif name == "mlm_offsets":
                    values = values[1:] + mlm_base
                files[name].write(values.astype(dtype, copy=False).tobytes())
            token_base += int(arrays["offsets"][-1])
            mlm_base += int(arrays["mlm_offsets"][-1])
            rows += len(arrays["nsp_labels"])
    finally:
        for f in files.values():
            f.close()
    files_info = {}
    for name, dtype in ARRAYS.items():
        f = tmp / f"{name}.bin"
        files_info[name] = {"dtype": dtype, "bytes": f.stat().st_size, "sha256": sha256_file(f)}
    meta = {
        "version": VERSION,
        "split": split,
        "source": source_key(shards_dir, split),
        "num_examples": rows,
        "num_tokens": token_base,
        "arrays": files_info,
    }
    (tmp / CACHE_META).write_text(json.dumps(meta, indent=1))
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(target, ignore_errors=True)  # a stale cache (ensure() decided to rebuild)
    os.replace(tmp, target)  # only the first rank of this node builds here (the path names the host)
    return target


def is_complete(path: Path, shards_dir: str | Path, split: str, check_hashes: bool) -> bool:
    """The cache at `path` was built from these shards and its arrays are intact."""
    try:
        meta = json.loads((path / CACHE_META).read_text())
    except (OSError, ValueError):
        return False
    if meta.get("version") != VERSION or meta.get("source") != source_key(shards_dir, split):
        return False
    for name in ARRAYS:
        info = meta["arrays"].get(name, {})
        f = path / f"{name}.bin"
        if not f.is_file() or f.stat().st_size != info.get("bytes"):
            return False
        if check_hashes and sha256_file(f) != info.get("sha256"):
            return False
    return True


def ensure(shards_dir: str | Path, split: str, cache_root: Path, log=print) -> Path:
    """Called by the first rank of each node: reuse a complete cache (hashes checked) or build it."""
    target = Path(cache_root) / split
    if is_complete(target, shards_dir, split, check_hashes=True):
        return target
    if target.exists():
        log(f"data cache {target} is stale or damaged; rebuilding it from {shards_dir}")
        shutil.rmtree(target, ignore_errors=True)
    return build(shards_dir, split, target)


def open_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read-only memory maps of a complete cache directory (see `ensure`)."""
    meta = json.loads((Path(path) / CACHE_META).read_text())
    out = {}
    for name, info in meta["arrays"].items():
        f = Path(path) / f"{name}.bin"
        if info["bytes"] == 0:
            out[name] = np.zeros(0, info["dtype"])
        else:
            out[name] = np.memmap(f, dtype=info["dtype"], mode="r")
    return out
