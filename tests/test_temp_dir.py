"""common/temp_dir.py: a block's own temp directory, and the sweep of those a killed bertflow left."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from common.temp_dir import own_temp_dir


def test_a_block_has_its_own_temp_directory_removed_at_its_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with own_temp_dir("bertflow-x-") as own:
        assert own.parent == tmp_path and own.name.startswith(f"bertflow-x-{os.getpid()}-")
        assert tempfile.gettempdir() == str(own) and os.environ["TMPDIR"] == str(own)
        child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        assert Path(child.stdout.strip()).parent == own  # a worker process's folders go there too
        Path(tempfile.mkdtemp()).joinpath("left").write_text("x")
    assert list(tmp_path.iterdir()) == []
    assert os.environ["TMPDIR"] == str(tmp_path) and tempfile.gettempdir() == str(tmp_path)


def test_folders_a_killed_bertflow_left_go_once_stale(tmp_path: Path, monkeypatch) -> None:
    """Named with their bertflow's pid: a gone one's stale folder goes, not a fresh one, nor a live
    bertflow's, nor another prefix's."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = gone.stdout.strip()
    left = {
        "stale": tmp_path / f"bertflow-x-{pid}-a",
        "fresh": tmp_path / f"bertflow-x-{pid}-b",
        "alive": tmp_path / f"bertflow-x-{os.getpid()}-c",
        "other": tmp_path / f"bertflow-y-{pid}-d",
    }
    for name, path in left.items():
        (path / "beam-temp1").mkdir(parents=True)
        if name != "fresh":
            os.utime(path, (time.time() - 7200, time.time() - 7200))
    with own_temp_dir("bertflow-x-"):
        pass
    assert sorted(tmp_path.iterdir()) == sorted(left[n] for n in ("fresh", "alive", "other"))


@pytest.mark.parametrize("env", [None, "/somewhere"])
def test_tmpdir_is_restored_as_it_was(env: str | None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if env is None:
        monkeypatch.delenv("TMPDIR", raising=False)
    else:
        monkeypatch.setenv("TMPDIR", env)
    with own_temp_dir("bertflow-x-"):
        pass
    assert os.environ.get("TMPDIR") == env and tempfile.tempdir == str(tmp_path)
