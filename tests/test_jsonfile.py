"""The JSON files users and stages hand each other: each way of being wrong is one clear error
naming the file, through the real readers (shard manifest, DeepSpeed template, model config)."""

from __future__ import annotations

import os
import stat

import pytest

from common.atomic import MARKER_NAME, atomic_write_json, progress_state, read_marker
from common.errors import UserError
from model.hf_io import read_config
from preprocessing.shard_format import read_manifest
from training.ds_config import load_template


def test_manifest_that_is_not_an_object_or_not_json(tmp_path):
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(UserError, match=r"shard manifest .*manifest.json must hold a JSON object, not list"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"splits": ')
    with pytest.raises(UserError, match=r"not valid JSON \(corrupt or truncated.*delete .* rerun preprocess"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(UserError, match=r"no shards at .*manifest.json is missing"):
        read_manifest(tmp_path)


def test_deepspeed_template_and_model_config(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{'stage': 2}")
    with pytest.raises(UserError, match=r"DeepSpeed config .*ds.json is not valid JSON.*infra/deepspeed"):
        load_template(str(bad))
    with pytest.raises(UserError, match=r"DeepSpeed config .*nope.json does not exist"):
        load_template(str(tmp_path / "nope.json"))
    (tmp_path / "config.json").write_text('"bert"')
    with pytest.raises(UserError, match=r"model config .*config.json must hold a JSON object, not str"):
        read_config(tmp_path)


def test_an_unreadable_completion_marker_is_not_complete(tmp_path):
    """A marker cut short (`{`, a disk that filled up) says nothing: the output is not complete,
    so it is redone rather than trusted."""
    (tmp_path / MARKER_NAME).write_text("{")
    assert read_marker(tmp_path) is None
    assert progress_state(tmp_path) == "unfinished"


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_atomically_written_files_get_the_usual_mode(tmp_path, umask):
    """The finished file has the mode any new file gets (not the 0600 of its temp file) (others in
    the group can read a shared run directory)."""
    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "stats.json", {"docs": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "stats.json").stat().st_mode) == 0o666 & ~umask
