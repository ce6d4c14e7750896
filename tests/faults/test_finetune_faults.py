"""kill -9 of `bertflow finetune` in the middle of its second unit: the rerun reuses the finished
unit (not recomputed), finishes the rest, and scores exactly like an uninterrupted run."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.flow_support import sigint_as_in_a_terminal

ROOT = Path(__file__).resolve().parents[2]
UNITS = ["sst2-lr5e-05-s42", "mrpc-lr5e-05-s42", "rte-lr5e-05-s42"]


def _command(minilm_dir: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "pipelines.cli", "finetune", "--checkpoint", "random:tiny",
        "--tokenizer", str(minilm_dir), "--tasks", "sst2,mrpc,rte", "--max-train-examples", "320",
        "--max-eval-examples", "64", "--max-seq-length", "64", "--epochs", "2", "--batch-size", "16",
        "--workers", "1", "--threads", "1", "--baselines", "none", "--output", str(out),
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}


def _lock_free(unit_dir: Path) -> bool:
    with open(unit_dir / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True


def _unit_dir(out: Path, unit: str) -> Path | None:
    """`out/units/<unit>__<label>-<key>` (the fan-out's directory of that unit), once it exists."""
    found = list((out / "units").glob(f"{unit}__*"))
    return found[0] if found else None


def _scores(out: Path) -> list[dict]:
    card = json.loads((out / "scorecard.json").read_text())
    return [
        {t: (v["metrics"], v["n_train"], v["n_eval"]) for t, v in row["tasks"].items()}
        for row in card["rows"]
    ]


@pytest.mark.slow
def test_kill_during_second_unit_then_rerun(tmp_path, minilm_dir):
    out = tmp_path / "killed"
    proc = subprocess.Popen(_command(minilm_dir, out), env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    first = second = None
    while not (
        first is not None
        and (first / "_COMPLETE.json").is_file()
        and second is not None
        and (second / "metrics.jsonl").is_file()
    ):
        assert proc.poll() is None, "the command ended before its second unit started training"
        assert time.monotonic() < deadline, "second unit never started"
        time.sleep(0.05)
        first, second = _unit_dir(out, UNITS[0]), _unit_dir(out, UNITS[1])
    os.kill(proc.pid, signal.SIGKILL)  # mid-training of the second unit
    proc.wait()
    # the worker notices its parent is gone and exits: the unit's lock is released
    deadline = time.monotonic() + 30
    while not _lock_free(second):
        assert time.monotonic() < deadline, "orphaned worker kept running"
        time.sleep(0.2)
    assert not (second / "_COMPLETE.json").exists() and not (second / "result.json").exists()
    assert not (out / "scorecard.json").exists()
    first_mtime = (first / "result.json").stat().st_mtime_ns

    rerun = subprocess.run(_command(minilm_dir, out), env=_env(), cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert (first / "result.json").stat().st_mtime_ns == first_mtime  # reused, not recomputed
    for unit in UNITS:
        assert (_unit_dir(out, unit) / "_COMPLETE.json").is_file()

    clean = tmp_path / "clean"
    ref = subprocess.run(_command(minilm_dir, clean), env=_env(), cwd=ROOT, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    assert _scores(out) == _scores(clean)
    # one clean curve, no duplicate steps from the killed attempt (320 examples / 16 x 2 epochs = 40 steps)
    assert _logged_steps(second) == _logged_steps(_unit_dir(clean, UNITS[1])) == [1, *range(10, 41, 10)]


def _logged_steps(unit_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (unit_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train/loss" in r]


@pytest.mark.slow
def test_a_worker_killed_takes_no_other_unit_with_it(tmp_path, minilm_dir):
    """kill -9 of one fine-tuning worker (the OOM killer's way) while two train: a dead worker breaks
    the whole process pool, so every unit in flight or still queued failed with it ('4 of 4 units
    failed' in a flow). Now the units it took down run again in a fresh pool, once, and all finish."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    cmd = [*_command(minilm_dir, out), "--workers", "2"]  # the last --workers wins
    proc = subprocess.Popen(
        cmd,
        env={**_env(), "TMPDIR": str(tmp)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not all(
        (d := _unit_dir(out, u)) is not None and (d / "metrics.jsonl").is_file() for u in UNITS[:2]
    ):
        assert proc.poll() is None and time.monotonic() < deadline, "two units never trained at once"
        time.sleep(0.05)
    workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(workers) == 2
    workers[0].kill()
    said = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, said[-3000:]
    assert "a fine-tuning worker process died (out of memory or killed)" in said
    for unit in UNITS:
        assert (_unit_dir(out, unit) / "_COMPLETE.json").is_file()
    # the workers' temp folder (W&B's two, made at import) went with their pool, the killed one's too
    assert not list(tmp.iterdir()), list(tmp.iterdir())


def test_ctrl_c_stops_the_units_in_flight_with_their_workers(tmp_path, minilm_dir):
    """Ctrl-C (or SIGTERM) of a command while a unit trains: the command waited for the units in flight
    to finish (a Cancel from Prefect during a flow's fine-tuning: the units ran to their end, after a
    'worker process died' warning, in new workers). Now they stop with their workers: the unit is not
    finished (a rerun trains it), no worker is left."""
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        _command(minilm_dir, out),
        env={**_env(), "TMPDIR": str(tmp)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    deadline = time.monotonic() + 300
    while (d := _unit_dir(out, UNITS[0])) is None or not (d / "metrics.jsonl").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "the first unit never trained"
        time.sleep(0.05)
    workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    proc.send_signal(signal.SIGINT)  # to the command alone: its workers learn of it from it
    said = proc.communicate(timeout=300)[0]
    assert proc.returncode != 0, said[-3000:]
    assert not (d / "_COMPLETE.json").exists(), said[-3000:]
    # it said only 'interrupted.': what is kept and how to go on, as pretraining's stop says
    assert said.rstrip().endswith(
        f"bertflow finetune: stopped with 0 of 3 unit(s) complete in {out}; rerun the same command to run "
        "the other 3 (complete units are reused, the stopped ones train again).\n"
        "bertflow finetune: interrupted."
    ), said[-3000:]
    assert workers and not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    # the stopped workers' temp folders (W&B's two each, which only a normal exit removes) went too:
    # they were left in /tmp
    assert not list(tmp.iterdir()), list(tmp.iterdir())


def test_a_worker_writes_on_after_the_reader_of_the_commands_output_is_gone(tmp_path):
    """A fine-tuning worker inherits the command's stdout/stderr. With `bertflow run | tee LOG` and tee
    killed, the flow goes on (`survive_a_lost_reader`), but a warning or a traceback a worker wrote
    then raised BrokenPipeError in the worker and failed its unit. The worker's initializer, as the
    fan-out's pool runs it, then a write after the reader left."""
    finished = tmp_path / "finished"
    code = (
        "import os, sys; from finetuning.fanout import _init_worker; "
        f"_init_worker(os.getppid(), 1, None, {str(tmp_path)!r}); "
        "sys.stdin.read(); print('w' * 65536, flush=True); print('t', file=sys.stderr, flush=True); "
        f"open({str(finished)!r}, 'w').write('yes')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()
    proc.stderr.close()
    proc.stdin.close()  # the worker's cue to write, its readers gone
    assert proc.wait(timeout=120) == 0
    assert finished.read_text() == "yes"
