"""Faults of stage 1: `bertflow tokenizer` killed with SIGKILL at several points, then rerun.

The rerun of the same command must write byte-identical vocab.txt / tokenizer.json /
tokenizer_config.json to an uninterrupted run's, and no file that a kill left behind may pass for a
finished one: outputs are written atomically (`.tmp-*` then rename), the marker last.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.atomic import IN_PROGRESS_NAME, MARKER_NAME, TMP_PREFIX, read_marker
from common.dir_lock import lock_file_of
from common.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow  # four real trainings plus the killed starts: ~40 s on 2 busy cores

OUTPUTS = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")


def command(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "tokenizer", "--input", str(corpus), "--vocab-size", "2000",
            "--output", str(out)]  # fmt: skip


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}


def run(cmd: list[str]) -> float:
    start = time.monotonic()
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return time.monotonic() - start


def outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUTS}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, data_dir) -> Path:
    """The first ~1 MB of the 5 MB summaries file (whole documents)."""
    text = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8")
    cut = text.index("\n\n", 1_000_000)
    path = tmp_path_factory.mktemp("corpus") / "summaries_head.txt"
    path.write_text(text[:cut] + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, corpus) -> tuple[Path, float]:
    """An uninterrupted run's output directory and its seconds."""
    out = tmp_path_factory.mktemp("ref") / "tok"
    return out, run(command(corpus, out))


@pytest.fixture(scope="module")
def reference(reference_run) -> tuple[dict[str, bytes], float]:
    out, seconds = reference_run
    return outputs(out), seconds


def finished_copy(reference_run: tuple[Path, float], out: Path) -> None:
    """`out` as the same command leaves it finished (a copy of the reference run, not another training),
    its lock file beside it included."""
    shutil.copytree(reference_run[0], out)
    shutil.copy(lock_file_of(reference_run[0]), lock_file_of(out))


def kill_when(cmd: list[str], ready) -> int:
    """Start `cmd`, SIGKILL it as soon as `ready()` holds; returns its exit status."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not ready():
            time.sleep(0.0002)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def assert_nothing_passes_for_finished(out: Path, ref: dict[str, bytes]) -> None:
    """After a kill: any output under its final name is complete; a marker means all are."""
    if not out.exists():
        return
    for name in OUTPUTS:
        if (out / name).exists():
            assert (out / name).read_bytes() == ref[name], f"{name} under its final name is partial"
    if read_marker(out) is not None:
        assert outputs(out) == ref


def written_since(out: Path, since_ns: int) -> bool:
    """An output or a temp file of one in `out`, made by the process started at `since_ns` (the
    folder itself exists from the stage's lock on, before any training: not a sign of writing)."""
    try:
        entries = list(out.iterdir())
    except FileNotFoundError:
        return False
    for entry in entries:
        if entry.name.startswith(TMP_PREFIX) or entry.name in OUTPUTS:
            try:
                if entry.stat().st_mtime_ns >= since_ns:
                    return True
            except FileNotFoundError:  # a temp file renamed meanwhile: the write is under way
                return True
    return False


def test_kill_9_at_several_points_then_rerun_is_byte_identical(tmp_path, corpus, reference):
    ref, seconds = reference
    out = tmp_path / "tok"
    cmd = command(corpus, out)
    start, start_ns = time.monotonic(), time.time_ns()
    points = {
        "early (importing / reading)": lambda: time.monotonic() - start > 0.5,
        "mid-training": lambda: time.monotonic() - start > seconds * 0.6,
        "as soon as it starts writing": lambda: written_since(out, start_ns),
        "after vocab.txt is in place": lambda: (out / "vocab.txt").exists(),
    }
    killed = []
    for name, ready in points.items():
        for _ in range(5):
            start, start_ns = time.monotonic(), time.time_ns()
            status = kill_when(cmd, ready)
            assert_nothing_passes_for_finished(out, ref)
            if status == -signal.SIGKILL or name.startswith("after"):
                break
            # too late (a busy machine can miss the writes, tens of ms): the run finished; as a kill
            # just before its marker leaves it (its _IN_PROGRESS.json, no marker), the next run writes again
            (out / MARKER_NAME).unlink()
            (out / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 1, "host": "gone"}))
        killed.append((name, status))
    # the first three kills must have struck a live process (the last one may come too late)
    assert [s for _, s in killed[:3]] == [-signal.SIGKILL] * 3, killed
    run(cmd)
    assert outputs(out) == ref
    assert read_marker(out) is not None
    assert not list(out.glob(TMP_PREFIX + "*")), "temp files left behind"


def test_leftovers_of_a_killed_write_are_replaced_not_used(tmp_path, corpus, reference):
    """The state a kill mid-write leaves (a temp file, no marker) is redone, never taken as finished."""
    ref, _ = reference
    out = tmp_path / "tok"
    out.mkdir()
    (out / "vocab.txt").write_bytes(ref["vocab.txt"])  # the first file made it
    # cut mid-write, under the name atomic_path gives it (`.tmp-NAME.` and mkstemp's 8 characters)
    (out / f"{TMP_PREFIX}tokenizer.json.abc123_x").write_bytes(ref["tokenizer.json"][:1000])
    run(command(corpus, out))
    assert outputs(out) == ref and read_marker(out) is not None
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUTPUTS, MARKER_NAME])


def test_deleted_marker_is_refused_not_redone_over(tmp_path, corpus, reference, reference_run):
    """With its marker deleted by hand, an output is files of the stage's names and nothing that
    says they are a run's: the lock file beside it (`PARENT/.tok.lock`) outlives the folder, so it
    says nothing of whose the files now are. Refused, untouched, naming the lock; moved out, redone."""
    ref, _ = reference
    out = tmp_path / "tok"
    cmd = command(corpus, out)
    finished_copy(reference_run, out)
    inode = (out / "tokenizer.json").stat().st_ino
    run(cmd)  # marker present, same settings and inputs: nothing rewritten
    assert (out / "tokenizer.json").stat().st_ino == inode
    (out / MARKER_NAME).unlink()
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "it is not a bertflow tokenizer output" in r.stderr, r.stderr
    assert f"{lock_file_of(out)} says a bertflow run wrote a folder of this name before" in r.stderr
    assert (out / "tokenizer.json").stat().st_ino == inode
    for name in OUTPUTS:
        (out / name).unlink()
    run(cmd)
    assert outputs(out) == ref and read_marker(out) is not None


def test_bit_flipped_output_of_a_finished_run_is_redone(tmp_path, corpus, reference, reference_run):
    """The marker records each file's sha256: a damaged vocab.txt is not taken as up to date."""
    ref, _ = reference
    out = tmp_path / "tok"
    cmd = command(corpus, out)
    finished_copy(reference_run, out)
    data = bytearray((out / "vocab.txt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / "vocab.txt").write_bytes(bytes(data))
    run(cmd)
    assert outputs(out) == ref and read_marker(out) is not None
