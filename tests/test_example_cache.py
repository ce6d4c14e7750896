"""The per-node memory-mapped example cache: same data as the Parquet shards, reused only while
it matches the shards and is intact, rebuilt otherwise."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from preprocessing import shard_format
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from training import example_cache
from training.data import load_split, mapped_split


@pytest.fixture(scope="module")
def shards(tmp_path_factory, minilm_dir, data_dir):
    root = tmp_path_factory.mktemp("cache-data")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    return make_shards(root / "shards", tok, data_dir, num_docs=300, num_train_shards=3)


FIELDS = ("input_ids", "segment_ids", "offsets", "mlm_positions", "mlm_ids", "mlm_offsets", "nsp_labels")


def test_mapped_split_equals_the_parquet_read_across_shards(shards, tmp_path):
    assert len(shard_format.read_manifest(shards)["splits"]["train"]) == 3
    path = example_cache.ensure(shards, "train", tmp_path / "cache")
    mapped, parquet = mapped_split(path), load_split(shards, "train")
    assert len(mapped) == len(parquet) > 100
    for name in FIELDS:
        a, b = getattr(mapped, name), getattr(parquet, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert isinstance(mapped.input_ids, np.memmap)  # shared through the page cache, not copied
    meta = json.loads((path / example_cache.CACHE_META).read_text())
    assert meta["num_examples"] == len(parquet) and meta["num_tokens"] == len(parquet.input_ids)


def test_complete_cache_is_reused_and_a_damaged_or_stale_one_rebuilt(shards, tmp_path):
    root = tmp_path / "cache"
    path = example_cache.ensure(shards, "train", root)
    stamp = (path / example_cache.CACHE_META).stat().st_mtime_ns
    assert example_cache.ensure(shards, "train", root) == path
    assert (path / example_cache.CACHE_META).stat().st_mtime_ns == stamp  # reused

    want = load_split(shards, "train").input_ids
    logs: list[str] = []
    ids = path / "input_ids.bin"
    ids.write_bytes(ids.read_bytes()[:-4])  # truncated
    example_cache.ensure(shards, "train", root, log=logs.append)
    assert np.array_equal(mapped_split(path).input_ids, want) and len(logs) == 1

    raw = bytearray(ids.read_bytes())
    raw[100] ^= 0x01  # same size, one bit flipped: caught by the sha256 check
    ids.write_bytes(bytes(raw))
    example_cache.ensure(shards, "train", root, log=logs.append)
    assert np.array_equal(mapped_split(path).input_ids, want) and len(logs) == 2

    meta = json.loads((path / example_cache.CACHE_META).read_text())
    meta["source"][0]["sha256"] = "0" * 64  # built from other shards
    (path / example_cache.CACHE_META).write_text(json.dumps(meta))
    example_cache.ensure(shards, "train", root, log=logs.append)
    assert len(logs) == 3 and example_cache.is_complete(path, shards, "train", check_hashes=True)

    meta = json.loads((path / example_cache.CACHE_META).read_text())
    meta["version"] = example_cache.VERSION - 1  # written by an older layout of the cache
    (path / example_cache.CACHE_META).write_text(json.dumps(meta))
    assert not example_cache.is_complete(path, shards, "train", check_hashes=False)
    example_cache.ensure(shards, "train", root, log=logs.append)
    assert (
        len(logs) == 4
        and json.loads((path / example_cache.CACHE_META).read_text())["version"] == example_cache.VERSION
    )
    assert not list(root.glob(".*tmp*"))  # no temp directories left behind


def test_shards_rewritten_under_the_same_names_and_counts_rebuild_the_cache(shards, tmp_path):
    """A rerun of preprocess with other masking writes shards of the same names and sizes: only
    their sha256 in the manifest tells them apart, and the cache must follow them."""
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    root = tmp_path / "cache"
    path = example_cache.ensure(copy, "train", root)
    manifest = json.loads((copy / shard_format.MANIFEST_NAME).read_text())
    entry = manifest["splits"]["train"][0]
    shard = copy / "train" / entry["path"]
    table = shard_format.read_shard(shard)
    flipped = table.set_column(
        table.schema.get_field_index("next_sentence_label"),
        "next_sentence_label",
        pa.array([1 - v for v in table.column("next_sentence_label").to_pylist()], pa.int8()),
    )
    rewritten = shard_format.write_shard(shard, flipped)
    assert rewritten["path"] == entry["path"] and rewritten["num_examples"] == entry["num_examples"]
    entry["sha256"] = rewritten["sha256"]
    (copy / shard_format.MANIFEST_NAME).write_text(json.dumps(manifest))
    logs: list[str] = []
    example_cache.ensure(copy, "train", root, log=logs.append)
    assert len(logs) == 1  # rebuilt
    assert np.array_equal(mapped_split(path).nsp_labels, load_split(copy, "train").nsp_labels)


def test_shards_of_another_schema_version_are_refused(shards, tmp_path):
    import shutil

    from common.errors import UserError

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    manifest = json.loads((copy / shard_format.MANIFEST_NAME).read_text())
    manifest["schema_version"] = shard_format.SCHEMA_VERSION + 1
    (copy / shard_format.MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(
        UserError, match=f"shard schema version {shard_format.SCHEMA_VERSION + 1}, this code reads"
    ):
        example_cache.ensure(copy, "train", tmp_path / "cache")


def test_missing_split_is_a_user_error(shards, tmp_path):
    from common.errors import UserError

    with pytest.raises(UserError, match="no 'test' (split|shards)"):
        example_cache.ensure(shards, "test", tmp_path / "cache")
