"""A full disk is one message naming the path and the space needed, no traceback: the output
folder is a small real tmpfs, mounted in a private mount namespace (`unshare -rm`, no root on the
host needed), so the writes fail with the kernel's own ENOSPC wherever they happen (Beam workers,
torch's checkpoint writer)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.paths import PROJECT_ROOT, torch_extensions_dir
from tests.flow_support import fresh_prefect_home, tiny_config
from tests.shard_fixtures import make_shards, make_tokenizer_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _mount_namespaces() -> None:
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (unshare -rm: {probe.stderr.strip()})")


def run_on_small_disk(mountpoint: Path, size: str, cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    """`cmd` with a `size` tmpfs mounted at `mountpoint` (seen only by cmd and its children)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "TORCH_EXTENSIONS_DIR": str(torch_extensions_dir()),
        **env,
    }
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", size, str(mountpoint), *cmd],
        env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def assert_one_disk_full_message(proc: subprocess.CompletedProcess, path: Path, needs: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert "Errno 28" not in output, output[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bertflow ") and "the disk is full: no space left to write " + str(path) in last, (
        last
    )
    assert f"{needs} needs about " in last and "Fix: free space" in last, last


def test_preprocess_on_a_full_disk(tmp_path: Path, data_dir: Path, minilm_dir: Path) -> None:
    out = tmp_path / "small_disk"
    cmd = [
        sys.executable, "-m", "pipelines.cli", "preprocess", "--vocab", str(minilm_dir / "vocab.txt"),
        "--input", str(data_dir / "wiki/enwiki-2015/AA/wiki_00.gz"), "--output", str(out / "shards"),
        "--dupe-factor", "1", "--num-shards", "2", "--workers", "2",
    ]  # fmt: skip
    proc = run_on_small_disk(out, "200k", cmd)  # the job writes about 1.7 MB at its peak
    assert_one_disk_full_message(proc, out / "shards", "this preprocess job")
    assert proc.stderr.count("the disk is full") == 1, proc.stderr  # not once per Beam worker


def test_pretrain_checkpoint_on_a_full_disk(tmp_path: Path, data_dir: Path, minilm_dir: Path) -> None:
    tok = make_tokenizer_dir(minilm_dir, tmp_path / "tok")
    shards = make_shards(tmp_path / "shards", tok, data_dir, num_docs=200, max_seq_length=64)
    out = tmp_path / "run"
    sets = ["model.preset=tiny", "pretrain.num_processes=1", "pretrain.micro_batch_size=8",
            "pretrain.max_steps=4", "pretrain.checkpoint_every=2", "pretrain.log_every=1"]  # fmt: skip
    cmd = [sys.executable, "-m", "pipelines.cli", "pretrain", "--shards", str(shards), "--tokenizer", str(tok),
           "--output", str(out), *[x for s in sets for x in ("--set", s)]]  # fmt: skip
    # training runs on the real disk; the checkpoints (megabytes) go to a 300 KiB one
    proc = run_on_small_disk(out / "checkpoints", "300k", cmd)
    assert_one_disk_full_message(proc, out / "checkpoints" / "global_step2", "one checkpoint")


def test_flow_with_preprocess_on_a_full_disk(tmp_path: Path, data_dir: Path) -> None:
    """Through `bertflow run`: Prefect logs the failed task and flow run without a traceback."""
    cfg = tiny_config(tmp_path, data_dir, finetune={"tasks": ["rte"], "baselines": []})
    cmd = [sys.executable, "-m", "pipelines.cli", "run", str(cfg)]
    proc = run_on_small_disk(
        tmp_path / "run" / "preprocess",
        "40k",
        cmd,
        PREFECT_HOME=str(fresh_prefect_home(tmp_path / "prefect")),
    )
    assert_one_disk_full_message(proc, tmp_path / "run" / "preprocess", "this preprocess job")
