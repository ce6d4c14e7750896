"""The pretraining example format on disk: Parquet shards, one row per example.

Both the preprocessing job (writer) and the pretraining loader (reader) import this module, so
the format is defined once. Sequences are stored unpadded; the loader pads each batch to its
longest sequence. Bump SCHEMA_VERSION on any change; readers refuse other versions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import progress_state, sha256_file
from common.errors import UserError
from common.jsonfile import read_json_object

SCHEMA_VERSION = 1

# next_sentence_label: 0 = IsNext (B follows A in the source), 1 = NotNext (B from another
# document), the convention of the original BERT data and of transformers' BertForPreTraining.
IS_NEXT = 0
NOT_NEXT = 1

# What each column means. Written into every shard (Parquet field metadata `description`, and the
# schema metadata `bertflow_columns`) and into manifest.json (`schema`), so a shard opened in
# pandas, duckdb or pyarrow explains itself.
COLUMN_MEANINGS: dict[str, str] = {
    "input_ids": "WordPiece ids of `[CLS] A [SEP] B [SEP]`, unpadded, with masking ALREADY APPLIED: "
    "at masked positions the id is [MASK] (80%), a random token (10%) or the original (10%)",
    "segment_ids": "0 for [CLS], segment A and its [SEP]; 1 for segment B and the final [SEP] "
    "(token_type_ids in transformers)",
    "masked_lm_positions": "indices into input_ids of the positions to predict, ascending",
    "masked_lm_ids": "the original token id at each of masked_lm_positions (the MLM labels)",
    "next_sentence_label": f"{IS_NEXT} = IsNext (B follows A in the same document), "
    f"{NOT_NEXT} = NotNext (B from another document); as transformers' BertForPreTraining",
}


def schema_description() -> dict[str, Any]:
    """The format's meaning, as written into manifest.json."""
    return {
        "version": SCHEMA_VERSION,
        "columns": COLUMN_MEANINGS,
        "next_sentence_label": {"0": "IsNext", "1": "NotNext"},
    }


_TYPES = {
    "input_ids": pa.list_(pa.int32()),
    "segment_ids": pa.list_(pa.int8()),
    "masked_lm_positions": pa.list_(pa.int32()),
    "masked_lm_ids": pa.list_(pa.int32()),
    "next_sentence_label": pa.int8(),
}
SCHEMA = pa.schema(
    [
        pa.field(name, kind, nullable=False, metadata={"description": COLUMN_MEANINGS[name]})
        for name, kind in _TYPES.items()
    ],
    metadata={
        "bertflow_schema_version": str(SCHEMA_VERSION),
        "bertflow_columns": json.dumps(COLUMN_MEANINGS),
    },
)

SHARD_PATTERN = "shard-{index:05d}-of-{count:05d}.parquet"
MANIFEST_NAME = "manifest.json"
STATS_NAME = "stats.json"

# manifest.json = {"schema_version": 1, "config": {...}, "tokenizer_sha256": ..., "input_fingerprint": ...,
#                  "splits": {"train": [{"path": "shard-00000-of-00004.parquet", "num_examples": N,
#                                        "sha256": ...}, ...], "validation": [...]}}
# Layout: DIR/manifest.json, DIR/stats.json, DIR/train/<shards>, DIR/validation/<shards>, DIR/_COMPLETE.json

SPLITS = ("train", "validation")


def shard_name(index: int, count: int) -> str:
    return SHARD_PATTERN.format(index=index, count=count)


def write_shard(path: str | os.PathLike, table: pa.Table | Iterable[pa.Table]) -> dict[str, Any]:
    """Write one shard atomically on any filesystem Beam knows (local path or URL); returns its
    manifest entry (name, rows, sha256). A Table is written whole (one row group up to pyarrow's
    default of 1M rows); an iterable of Tables is streamed, one row group each."""
    from preprocessing import storage

    rows = 0

    def write(sink) -> None:
        nonlocal rows
        if isinstance(table, pa.Table):
            whole = table.cast(SCHEMA)
            rows = whole.num_rows
            pq.write_table(whole, sink, compression="zstd")
            return
        with pq.ParquetWriter(sink, SCHEMA, compression="zstd") as writer:
            for group in table:
                group = group.cast(SCHEMA)
                rows += group.num_rows
                writer.write_table(group, row_group_size=group.num_rows)

    sha = storage.write_atomically(str(path), write)
    return {"path": storage.basename(str(path)), "num_examples": rows, "sha256": sha}


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """Load `manifest.json` of a shard directory, refusing missing or foreign formats."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not path.is_file() and (root := _shard_dir_above(directory)) is not None:
        raise UserError(
            f"no shards at {directory}: it is not a shard directory but lies inside one, {root}.",
            fix=f"pass {root}, the folder that holds {MANIFEST_NAME}.",
        )
    if not path.is_file() and (state := progress_state(directory)) in ("running", "interrupted"):
        raise UserError(
            f"no shards at {directory} yet: "
            + (
                "a preprocess is writing them now (its _IN_PROGRESS.json names a live process)."
                if state == "running"
                else "the preprocess writing them was stopped before it finished (its _IN_PROGRESS.json "
                "names a process that is gone)."
            ),
            fix="wait for it to finish."
            if state == "running"
            else "rerun the same `bertflow preprocess` command (or the flow): it writes them again.",
        )
    if not path.is_file() and (below := _shard_dirs_below(directory)):
        more = f" and {len(below) - 3} more" if len(below) > 3 else ""
        raise UserError(
            f"no shards at {directory}: it is not a shard directory, but holds "
            f"{'one' if len(below) == 1 else 'some'}: {', '.join(map(str, below[:3]))}{more}.",
            fix=f"pass {below[0]}." if len(below) == 1 else f"pass one of them, e.g. {below[0]}.",
        )
    manifest = read_json_object(
        path,
        "shard manifest",
        missing=f"no shards at {directory}: {path} is missing.",
        missing_fix="run `bertflow preprocess` (or the flow) to write them, or point to the right directory.",
        invalid_fix=f"delete {directory} and rerun preprocess.",
    )
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UserError(
            f"{path}: shard schema version {version!r}, this code reads {SCHEMA_VERSION}.",
            fix="rerun preprocess with this version of bertflow.",
        )
    return manifest


def _shard_dir_above(path: Path) -> Path | None:
    """The shard directory `path` lies in, when it is one's manifest.json, split folder or shard
    file (a parent or grandparent holding manifest.json); None otherwise."""
    return next((d for d in (path.parent, path.parent.parent) if (d / MANIFEST_NAME).is_file()), None)


def _shard_dirs_below(path: Path) -> list[Path]:
    """The shard directories one or two levels below `path` (a run directory's preprocess/<key>
    and latest/preprocess, or its preprocess/ folder's outputs), one per directory they resolve to."""
    found: dict[Path, Path] = {}
    for manifest in sorted([*path.glob(f"*/{MANIFEST_NAME}"), *path.glob(f"*/*/{MANIFEST_NAME}")]):
        found.setdefault(manifest.parent.resolve(), manifest.parent)
    return list(found.values())


def shard_paths(directory: str | os.PathLike, split: str = "train", verify: bool = True) -> list[Path]:
    """The shard files of one split, in order; with verify, each must exist with its recorded
    size of rows and sha256 (a truncated or bit-flipped shard is named, with what to do)."""
    directory = Path(directory)
    paths = []
    for entry in _split_entries(directory, split):
        p = directory / split / entry["path"]
        if not p.is_file():
            raise UserError(
                f"shard {p} listed in the manifest is missing.",
                fix=f"delete {directory} and rerun preprocess.",
            )
        if verify and sha256_file(p) != entry["sha256"]:
            raise UserError(
                f"shard {p} is corrupt (checksum differs from {MANIFEST_NAME}).",
                fix=f"delete {directory} and rerun preprocess.",
            )
        paths.append(p)
    return paths


def split_size(directory: str | os.PathLike, split: str) -> int:
    """The examples of one split, as the manifest records them (no shard is read)."""
    return sum(int(entry.get("num_examples", 0)) for entry in _split_entries(Path(directory), split))


def _split_entries(directory: Path, split: str) -> list[dict[str, Any]]:
    splits = read_manifest(directory).get("splits", {})
    if splits.get(split) is None:
        raise UserError(
            f"{directory / MANIFEST_NAME} has no {split!r} split; its splits are {', '.join(map(repr, splits))}.",
            fix=f"choose one of them ({', '.join(splits)}).",
        )
    return splits[split]


def read_shard(path: str | os.PathLike) -> pa.Table:
    """Read one shard, checking that its schema is ours."""
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise UserError(
            f"cannot read shard {path}: {exc}", fix="delete the shard directory and rerun preprocess."
        ) from None
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise UserError(f"shard {path} does not have the bertflow example schema: {table.schema}")
    return table
