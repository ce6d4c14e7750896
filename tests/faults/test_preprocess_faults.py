"""Faults of stage 2: kill -9 mid-run then rerun, damaged shards, a manifest that disagrees."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from common.atomic import read_marker
from common.errors import UserError
from common.paths import PROJECT_ROOT
from preprocessing.shard_format import read_manifest, shard_paths

pytestmark = pytest.mark.slow


def command(data_dir: Path, minilm_dir: Path, out: Path) -> list[str]:
    files = [data_dir / "wiki/enwiki-2015" / n for n in ("AA/wiki_02.gz", "AB/wiki_03.gz", "AC/wiki_04.gz")]
    cmd = [sys.executable, "-m", "pipelines.cli", "preprocess", "--vocab", str(minilm_dir / "vocab.txt")]
    for f in files:
        cmd += ["--input", str(f)]
    return cmd + ["--output", str(out), "--dupe-factor", "1", "--num-shards", "2", "--workers", "2",
                  "--set", "preprocess.bucket_size_mb=0.5"]  # fmt: skip


def run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in ("stats.json",)  # stats hold the run's seconds
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_dir, minilm_dir):
    out = tmp_path_factory.mktemp("ref") / "shards"
    run(command(data_dir, minilm_dir, out))
    return out


def test_kill_9_mid_run_then_rerun_gives_identical_output(tmp_path, reference, data_dir, minilm_dir):
    out = tmp_path / "shards"
    cmd = command(data_dir, minilm_dir, out)
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # wait until bucket part files are being written
        if any((out / "_work" / "parts").rglob("*.arrow")) if (out / "_work").exists() else False:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Beam worker processes
    proc.wait()
    assert read_marker(out) is None and not (out / "manifest.json").exists()
    run(cmd)
    assert read_marker(out) is not None
    assert snapshot(out) == snapshot(reference)


def test_damaged_shards_and_manifest_are_named_with_the_fix(tmp_path, reference):
    def fresh() -> Path:
        d = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(reference, d)
        return d

    d = fresh()
    shard = shard_paths(d, "train")[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    with pytest.raises(UserError, match=rf"{shard.name} is corrupt.*delete .* rerun preprocess"):
        shard_paths(d, "train")

    d = fresh()
    shard = shard_paths(d, "train")[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"{shard.name} is corrupt \(checksum differs"):
        shard_paths(d, "train")

    d = fresh()
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["splits"]["train"][0]["sha256"] = "0" * 64  # manifest disagrees with its shard
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="checksum differs"):
        shard_paths(d, "train")

    d = fresh()
    shard_paths(d, "validation")[0].unlink()
    with pytest.raises(UserError, match="missing"):
        shard_paths(d, "validation")

    d = fresh()
    (d / "manifest.json").write_text("{half a file")
    with pytest.raises(UserError, match="corrupt"):
        read_manifest(d)


def test_rerun_on_a_damaged_output_recomputes_it(tmp_path, reference, data_dir, minilm_dir):
    d = tmp_path / "shards"
    shutil.copytree(reference, d)
    shard = shard_paths(d, "train")[0]
    shard.write_bytes(b"garbage")
    run(command(data_dir, minilm_dir, d))  # the marker is there, but the shard is not what it says
    assert snapshot(d) == snapshot(reference)


def test_a_beam_worker_killed_is_named_as_such(tmp_path, data_dir, minilm_dir):
    """kill -9 of one Beam worker process (the OOM killer's way): the command ended in a traceback,
    'RuntimeError: Channel closed prematurely.', which named neither the worker nor a way on. Now
    it says a worker died, and to rerun (exit 1, a flow stage retries it)."""
    out = tmp_path / "shards"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    proc = subprocess.Popen(
        command(data_dir, minilm_dir, out), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # wait until bucket part files are being written
        if any((out / "_work" / "parts").rglob("*.arrow")) if (out / "_work").exists() else False:
            break
        time.sleep(0.1)
    workers = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "apache_beam.runners.worker.sdk_worker_main" in p.cmdline()
    ]
    assert workers, "the run finished before it could be killed"
    workers[0].kill()
    said = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last.startswith("bertflow preprocess: error: a Beam worker process died"), said[-3000:]
    assert read_marker(out) is None
