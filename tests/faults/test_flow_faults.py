"""Faults of the whole flow: `kill -9` of `bertflow run` during pretraining, then the same command
again, ends with the scorecard of an uninterrupted run and reuses the stages that had completed
(a deleted completion marker: tests/test_flow_cache.py), though Prefect's temporary API server is
killed during that rerun. Ctrl-C and SIGTERM stop every process of the run within seconds."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from common.atomic import MARKER_NAME, sha256_file
from common.paths import PROJECT_ROOT
from tests.flow_support import USER_TASK, fresh_prefect_home, sigint_as_in_a_terminal, tiny_config
from training.checkpoint import VERIFIED_NAME

pytestmark = pytest.mark.slow


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "PREFECT_HOME": str(fresh_prefect_home(tmp_path / "prefect-home")),
        "COLUMNS": "200",
    }


def _cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "run", str(config), *extra]


def _statuses(stdout: str) -> dict[str, str]:
    """The stage table `bertflow run` prints at the end: `  stage  status  seconds s  dir`."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and line.startswith("  ") and parts[-1].startswith("/"):
            out[parts[0]] = " ".join(parts[1:-3])
    return out


def _scores(run_dir: Path) -> dict:
    """Every fine-tuning unit's metrics (the numbers the scorecard is built from)."""
    results = {}
    for path in sorted((run_dir / "finetune" / "units").glob("*/result.json")):
        r = json.loads(path.read_text())
        results[(r["unit"], r["checkpoint_kind"])] = r["metrics"]
    return results


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None else ""
            pytest.fail(f"bertflow run ended (rc {proc.returncode}) before {what}\n{tail}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


def _has_verified_checkpoint(run_dir: Path) -> bool:
    """A pretraining checkpoint whose save completed: a tag dir alone may be one the signal cut
    short, which resume rightly discards (the rerun would then start at step 0)."""
    return any((run_dir / "pretrain").glob(f"*/checkpoints/global_step*/{VERIFIED_NAME}"))


def _vocab(run_dir: Path) -> str:
    return next((run_dir / "tokenizer").glob("*/vocab.txt")).read_text()


def _model_sha(run_dir: Path) -> str:
    return sha256_file(next((run_dir / "pretrain").glob("*/model/model.safetensors")))


# Two fine-tuning units, one worker: while one unit trains the other is queued (the output-reader
# test's case); the kill -9 test's killed run and its rerun use the same, so that flow is its reference.
FLOW_FT = {"tasks": ["rte", "stsb"], "baselines": [], "seeds": [1], "concurrency": 1}


@pytest.fixture(scope="module")
def reader_left_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[int, Path]:
    """`bertflow run CONFIG | reader` with the reader gone once pretraining starts (exit code, run dir):
    the output-reader test's flow, and the kill -9 test's uninterrupted reference (one flow run, ~25 CPU-s,
    for both)."""
    root = tmp_path_factory.mktemp("reader-left")
    cfg = tiny_config(root, data_dir, finetune=FLOW_FT)
    proc = subprocess.Popen(
        _cmd(cfg), env=_env(root), cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen = []
        while "Task run 'pretrain'" not in (line := proc.stdout.readline()):
            assert line, "".join(seen[-30:])  # it ended before pretraining
            seen.append(line)
        proc.stdout.close()  # the reader leaves
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, root / "run"


def test_kill_9_during_pretrain_then_rerun_matches_uninterrupted(
    tmp_path: Path, data_dir: Path, reader_left_run: tuple[int, Path]
) -> None:
    # Each run trains its own vocabulary from the same corpus (the tokenizer stage is deterministic
    # across processes: tests/test_tokenizer.py), so the two runs agree from the first stage on.
    # The reference: an uninterrupted run of the same config (its reader leaving changes no number:
    # test_a_flow_whose_output_reader_leaves_finishes_its_work checks it completed)
    rc, ref_run = reader_left_run
    assert rc == 0, "the reference flow failed (test_a_flow_whose_output_reader_leaves_finishes_its_work)"
    reference = _scores(ref_run)
    assert len(reference) == 2

    # the same config in another run dir, killed with SIGKILL once pretraining has a checkpoint
    (tmp_path / "b").mkdir()
    cfg = tiny_config(tmp_path / "b", data_dir, finetune=FLOW_FT)
    run_dir = tmp_path / "b" / "run"
    log = (tmp_path / "b" / "first.log").open("w")
    # its 8 steps take about as long as the check for the step-4 checkpoint: unslowed, the kill
    # came after the step-8 one and the rerun resumed nothing (a second a step: the kill lands
    # mid-run, and a rerun that restarted the data at step 0 would fail the model's sha256)
    proc = subprocess.Popen(
        _cmd(cfg),
        env={**_env(tmp_path), "BERTFLOW_DEBUG_STEP_DELAY_S": "1"},
        cwd=PROJECT_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _has_verified_checkpoint(run_dir), proc, 600, "the first pretraining checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:  # what kill -9 leaves behind in its process group (Prefect's temporary API server)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pretrain_dirs = [d for d in (run_dir / "pretrain").iterdir() if d.is_dir()]  # not the .KEY.lock beside it
    assert len(pretrain_dirs) == 1 and not (pretrain_dirs[0] / MARKER_NAME).exists()
    completed_before = {d.parent.parent.name: d for d in run_dir.glob("*/*/" + MARKER_NAME)}
    assert {"tokenizer", "preprocess"} <= set(completed_before)
    tok_stamp = (run_dir / "tokenizer").glob("*/" + MARKER_NAME).__next__().stat().st_mtime_ns
    # the killed run's record: the stages it finished, and interrupted, not running forever
    from pipelines.run_history import flow_runs

    [killed] = flow_runs(run_dir)
    assert killed.status == "interrupted"
    assert {"verify", "tokenizer", "preprocess"} <= {r["stage"] for r in killed.data["stages"]}

    # the same command again: completed stages are reused, pretraining resumes, same final scores,
    # though Prefect's temporary API server (uvicorn) is killed -9 as the resumed pretraining starts.
    # That server's death used to end the flow, its stages done, in minutes of retried records and
    # events, a ConnectError traceback and a failed run; now it is started again on its port and
    # database and the flow finishes as usual. Three seconds a step keep pretraining going while it
    # restarts (~6 s), as it did in a test of its own, a whole flow run more (~45 CPU-s).
    rerun_log = tmp_path / "rerun.log"
    with rerun_log.open("w") as log:
        proc = subprocess.Popen(
            _cmd(cfg), env={**_env(tmp_path), "BERTFLOW_DEBUG_STEP_DELAY_S": "3"}, cwd=PROJECT_ROOT,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    leftovers: list[psutil.Process] = []
    try:
        resumed = re.compile(r"start step [1-7]\b")
        _wait_for(lambda: resumed.search(rerun_log.read_text()), proc, 600, "resumed pretraining", rerun_log)
        leftovers = psutil.Process(proc.pid).children(recursive=True)
        server = next(p for p in leftovers if "uvicorn" in p.cmdline())
        server.kill()
        rc = proc.wait(timeout=600)
    finally:
        _kill_all(proc, leftovers)
    stdout = rerun_log.read_text()
    assert rc == 0, stdout[-3000:]
    assert f"API server (pid {server.pid}) ended (exit code -9) while the flow runs" in stdout
    assert "Traceback" not in stdout and "Error logging to API" not in stdout, stdout[-3000:]
    status = _statuses(stdout)
    assert status["tokenizer"] == "cached" and status["preprocess"] == "cached", stdout
    assert status["pretrain"] == "ran"
    # resumed mid-run: from the step its rank saved as its launcher went (or the step-4 checkpoint)
    assert re.search(r"start step [1-7]\b", stdout), stdout
    # the last unit's progress line says it is done (Prefect's API lags the unit's final state)
    assert re.search(r"finetune: \S+ \[\S+\] done; 2/2 units to run done", stdout), stdout
    assert "FAILED" not in stdout, stdout
    assert next((run_dir / "tokenizer").glob("*/" + MARKER_NAME)).stat().st_mtime_ns == tok_stamp
    assert _vocab(run_dir) == _vocab(ref_run)
    assert _scores(run_dir) == reference
    assert _model_sha(run_dir) == _model_sha(ref_run)  # resume is bit-exact


def _stop_and_collect(proc: subprocess.Popen, sig: int, *, group: bool) -> tuple[float, list[psutil.Process]]:
    """Send `sig` (to the whole process group, as a terminal's Ctrl-C does, or to `bertflow` only,
    as `kill -TERM PID` does); the seconds until `bertflow` exits and its descendants from just
    before the signal (the Prefect API server, the launcher and its ranks, W&B's service)."""
    descendants = psutil.Process(proc.pid).children(recursive=True)
    t0 = time.monotonic()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - t0
    gone, alive = psutil.wait_procs(descendants, timeout=5)
    return seconds, alive


def _prefect_states(home: Path, flow_run_ids: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The state types Prefect's database in `home` holds (its API is gone with its flow run): those
    of `flow_run_ids`, and of their task runs by name."""
    import sqlite3
    from uuid import UUID

    ids = [UUID(i) for i in flow_run_ids]
    with sqlite3.connect(home / "prefect.db") as db:
        flows = {UUID(i): t for i, t in db.execute("SELECT id, state_type FROM flow_run")}
        tasks: dict[str, list[str]] = {}
        for flow_id, name, state in db.execute("SELECT flow_run_id, name, state_type FROM task_run"):
            if UUID(flow_id) in ids:
                tasks.setdefault(name, []).append(state)
    return [flows.get(i) for i in ids], tasks


def _kill_all(proc: subprocess.Popen, leftovers: list[psutil.Process]) -> None:
    if proc.poll() is None:
        proc.kill()
    for p in leftovers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def test_ctrl_c_and_sigterm_during_pretrain_exit_at_once_and_leave_no_process(
    tmp_path: Path, data_dir: Path
) -> None:
    """Ctrl-C of `bertflow run` during pretraining used to take ~140 s (the terminal's SIGINT also
    stopped Prefect's temporary API server, and Prefect retried every call); `kill -TERM` left that
    server running. Both now stop every process of the run within seconds; a rerun resumes. A run so
    stopped read `failed` in `bertflow runs` and Crashed in Prefect; now `stopped`, and Cancelled."""
    pretrain = {"max_steps": 2000, "checkpoint_every": 10, "eval_every": 1000, "log_every": 2}
    cfg = tiny_config(tmp_path, data_dir, pretrain=pretrain, finetune={"tasks": ["rte"], "baselines": []})
    run_dir = tmp_path / "run"

    def start(log_path: Path, cmd: list[str]) -> subprocess.Popen:
        with log_path.open("w") as log:
            return subprocess.Popen(
                cmd, env=_env(tmp_path), cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=sigint_as_in_a_terminal,
            )  # fmt: skip

    def run_and_stop(
        log_path: Path, ready, what: str, sig: int, *, group: bool, cmd: list[str]
    ) -> tuple[int, str]:
        proc = start(log_path, cmd)
        leftovers: list[psutil.Process] = []
        try:
            _wait_for(ready, proc, 600, what, log_path)
            seconds, leftovers = _stop_and_collect(proc, sig, group=group)
        finally:
            _kill_all(proc, leftovers)
        log = log_path.read_text()
        assert seconds < 20, f"{signal.Signals(sig).name} took {seconds:.0f} s\n{log[-3000:]}"
        assert not leftovers, [(p.pid, p.cmdline()) for p in leftovers]
        assert "Traceback" not in log and "Error logging to API" not in log, log[-3000:]
        # a stop, not a crash: Prefect's "Crash detected!" ERROR line is said as what it is, no ERROR line
        assert "Crash detected!" not in log and "stopped on request (Ctrl-C or SIGTERM)" in log, log[-3000:]
        assert "| ERROR " not in log, log[-3000:]
        return proc.returncode, log.rstrip()

    # Ctrl-C in a terminal: SIGINT to the whole foreground process group, once a checkpoint is saved;
    # started with --from pretrain, whose rerun would force pretraining again: from step 0, its
    # checkpoints deleted (the ranks' "rerun the same command" does not know the flow's flags)
    rc, log = run_and_stop(
        tmp_path / "first.log",
        lambda: _has_verified_checkpoint(run_dir),
        "a checkpoint",
        signal.SIGINT,
        group=True,
        cmd=_cmd(cfg, "--from", "pretrain"),
    )
    assert rc == 130 and log.endswith("bertflow run: interrupted."), log[-3000:]
    said = re.search(r"to resume: `bertflow (run [^`]*)` \(its own --force/--from would recompute", log)
    assert said and "--from" not in said.group(1) and "--force pretrain" not in said.group(1), log[-3000:]
    resume = [sys.executable, "-m", "pipelines.cli", *shlex.split(said.group(1))]
    # the ranks saved the step they reached (not only the last periodic checkpoint)
    saved = re.search(
        r"stopped by a stop request \(Ctrl-C or SIGTERM\) after step (\d+) of 2000; its checkpoint is saved",
        log,
    )
    assert saved, log[-3000:]

    # the command it said resumes pretraining there; `kill -TERM` of bertflow alone (not its group)
    resumed = re.compile(rf"start step {saved.group(1)}\b.*step \d+/2000 loss", re.DOTALL)
    second_log = tmp_path / "second.log"
    rc, log = run_and_stop(
        second_log,
        lambda: resumed.search(second_log.read_text()),
        "resumed steps",
        signal.SIGTERM,
        group=False,
        cmd=resume,
    )
    assert rc == 143 and log.endswith("bertflow run: terminated (SIGTERM)."), log[-3000:]
    # each stopped run's record says how long pretraining ran until it stopped (`runs show` printed
    # the time up to its output's last write, which a later run moves on: longer than the flow run)
    from pipelines.run_history import flow_runs

    runs = flow_runs(run_dir)
    for stopped in runs:
        row = stopped.data["stages"][-1]
        assert row["stage"] == "pretrain" and row["status"] == "running" and row.get("stopped"), row
        assert 0 < row["seconds"] < stopped.data["seconds"], stopped.data
    # the user stopped them: their records say stopped and how (they said failed), and Prefect holds
    # both flow runs Cancelled, their pretrain task runs too (both were Crashed)
    assert [(r.status, r.data.get("stopped_by")) for r in reversed(runs)] == [
        ("stopped", "Ctrl-C"),
        ("stopped", "SIGTERM to bertflow"),
    ], [r.data for r in runs]
    flows, tasks = _prefect_states(tmp_path / "prefect-home", [r.data["flow_run_id"] for r in runs])
    assert flows == ["CANCELLED", "CANCELLED"], flows
    assert sorted(tasks) == ["preprocess", "pretrain", "tokenizer", "verify"], tasks
    assert tasks["pretrain"] == ["CANCELLED"] * 2, tasks
    assert {state for name in ("verify", "tokenizer", "preprocess") for state in tasks[name]} == {"COMPLETED"}


def test_failed_fine_tuning_units_end_the_flow_in_one_paragraph_naming_them(
    tmp_path: Path, data_dir: Path
) -> None:
    """A fine-tuning unit that fails mid-flow (here its task's TSV gets a broken line once the
    flow's checks passed) ended `bertflow run` in 'RuntimeError: 1 of 1 fine-tuning units failed'
    with a Python traceback. Now the flow's last words are one paragraph naming the failed unit,
    its error and its folder, and the way on; exit 2, since the unit failed on bad input (it was exit 1,
    as for a lost worker, which a wrapper retries to the same end)."""
    rows = (data_dir / "glue/SST-2/dev.tsv").read_text().splitlines()[1:41]
    tsv = tmp_path / "movies.tsv"
    tsv.write_text(
        "text\tsentiment\n"
        + "".join(f"{r.split(chr(9))[0]}\t{'pos' if r.split(chr(9))[1] == '1' else 'neg'}\n" for r in rows)
    )
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(USER_TASK.format(tsv=tsv))
    ft = {"tasks": ["movies"], "task_config": str(tasks), "baselines": [], "seeds": [1], "lrs": [5e-5]}
    cfg = tiny_config(tmp_path, data_dir, finetune=ft)
    log_path = tmp_path / "flow.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            _cmd(cfg), env=_env(tmp_path), cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        _wait_for(lambda: (tmp_path / "run" / "pretrain").is_dir(), proc, 600, "pretraining", log_path)
        with tsv.open("a") as fh:  # after the flow's checks read it: the unit reads it broken
            fh.write("a broken\tline\tneg\n")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = log_path.read_text()
    assert proc.returncode == 2, said[-3000:]
    [unit_dir] = (tmp_path / "run" / "finetune" / "units").iterdir()
    end = said[said.rindex("bertflow run: error: ") :]
    assert end.startswith("bertflow run: error: 1 of 1 fine-tuning units failed"), said[-3000:]
    unit = unit_dir.name.split("__")[0]
    assert f"- {unit} [" in end and f"its folder {unit_dir}" in end, end
    assert f"{tsv} line 42: 3 tab-separated columns" in end, end
    assert end.rstrip().endswith("rerun the same command: it runs only the failed units again."), end
    assert "Traceback" not in said, said[-3000:]
    # a failure, not a stop; and the run's record, which `bertflow runs show` reads, names the failed
    # unit with its checkpoint, error and folder (it had no row for the units: only the console did)
    from pipelines.run_history import flow_runs
    from pipelines.runs_command import show_run

    [record] = flow_runs(tmp_path / "run")
    assert record.status == "failed" and "stopped_by" not in record.data, record.data
    shown = show_run(tmp_path / "run", None)
    assert re.search(r"\nfinetune-units +failed ", shown), shown
    assert "finetune-units failed: 1 of 1 fine-tuning units failed." in shown, shown
    label = end[end.index(f"- {unit} [") + len(f"- {unit} [") :].split("]")[0]
    row = re.search(
        rf"\n{re.escape(unit)} +{re.escape(label)} +(.+?) +{re.escape(str(unit_dir))}\n", shown + "\n"
    )
    assert row and f"{tsv} line 42: 3 tab-separated columns" in row.group(1), shown


def test_a_flow_whose_output_reader_leaves_finishes_its_work(reader_left_run: tuple[int, Path]) -> None:
    """`bertflow run CONFIG 2>&1 | tee LOG` with tee killed mid-flow: Prefect's console handler
    (rich) raised SystemExit on the broken pipe, the flow ended 'Crashed' with exit 1 and the units
    still queued were dropped. Now its console output, once its reader is gone, goes to /dev/null,
    as a pretraining rank's does: the flow finishes every stage (the run dir holds it all), exit 0."""
    returncode, run_dir = reader_left_run
    from pipelines.run_history import flow_runs

    [record] = flow_runs(run_dir)
    failed = [(r["stage"], r.get("error")) for r in record.data["stages"] if r["status"] == "failed"]
    assert (returncode, record.status) == (0, "completed"), failed
    units = list((run_dir / "finetune" / "units").iterdir())
    assert len(units) == 2 and all((u / MARKER_NAME).is_file() for u in units)
    assert list((run_dir / "report").glob(f"*/{MARKER_NAME}"))
