"""`bertflow runs`: past flow runs listed with their result, one shown in detail, and cleaning that
deletes only what no other flow run uses and never an output still being written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.atomic import IN_PROGRESS_NAME, MARKER_NAME, mark_in_progress, progress_state, write_marker
from common.dir_lock import exclusive_dir, lock_file_of
from common.disk_space import byte_size
from common.errors import UserError
from common.paths import PROJECT_ROOT
from common.stage_output import VERIFIED_NAME
from pipelines.cli import main as cli
from pipelines.flow_run import clear
from pipelines.run_history import dir_size, update_latest


def _stage(root: Path, stage: str, key: str, complete: bool = True) -> Path:
    d = root / stage / key
    d.mkdir(parents=True)
    (d / "payload.bin").write_bytes(b"x" * 1000)
    if complete:
        write_marker(d)
    return d


def _record(root: Path, name: str, started: str, dirs: dict[str, Path], seconds: float = 100.0) -> Path:
    stages = [{"stage": s, "key": d.name, "out_dir": str(d), "status": "ran", "seconds": 1.0,
               "compute_seconds": 1.0} for s, d in dirs.items()]  # fmt: skip
    path = root / "flow_runs" / f"{started.replace(' ', 'T')}-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"flow_run": name, "started_utc": started, "seconds": seconds, "stages": stages})
    )
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two flow runs sharing the tokenizer; the second changed pretraining; one interrupted output."""
    root = tmp_path / "runs"
    tok = _stage(root, "tokenizer", "t1")
    pre1, pre2 = _stage(root, "pretrain", "p1"), _stage(root, "pretrain", "p2")
    fin = _stage(root, "finetune", "f2")
    (fin / "scorecard.json").write_text(json.dumps(
        {"headline": {"glue_average_delta": 3.25, "versus_name": "random init (tiny)", "ahead_on": ["sst2"],
                      "tasks": ["sst2", "rte"]}}
    ))  # fmt: skip
    _record(root, "first-run", "2026-01-01 10:00:00", {"tokenizer": tok, "pretrain": pre1})
    _record(root, "second-run", "2026-01-02 10:00:00", {"tokenizer": tok, "pretrain": pre2, "finetune": fin})
    broken = _stage(root, "preprocess", "s9", complete=False)
    (broken / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    return root


def test_list_and_show(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["runs", "--run-dir", str(root)]) == 0
    out = capsys.readouterr().out
    first, second = out.index("first-run"), out.index("second-run")
    assert second < first  # newest first
    assert "+3.2 GLUE avg vs random init (tiny), ahead on 1/2" in out
    assert cli(["runs", "show", "--run-dir", str(root)]) == 0  # default: the newest
    out = capsys.readouterr().out
    assert out.startswith("flow run second-run: completed") and str(root / "pretrain" / "p2") in out
    assert cli(["runs", "stages", "--run-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "second-run, first-run" in out  # the shared tokenizer


def test_the_list_tells_runs_of_one_config_apart_by_their_command(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs of one config with other `--set` items (a user's sweep) were rows the list could not tell
    apart; each row now ends with the command after `bertflow run`, as given ("—" in a record from
    before commands were kept)."""
    tok = root / "tokenizer" / "t1"
    for name, started, settings in (("lr-low", "2026-01-03", "1e-4"), ("lr-high", "2026-01-04", "1e-3")):
        record = _record(root, name, f"{started} 10:00:00", {"tokenizer": tok})
        command = f"bertflow run configs/default.yaml --set pretrain.lr={settings} 'finetune.tasks=[sst2]'"
        record.write_text(json.dumps({**json.loads(record.read_text()), "command": command}))
    assert cli(["runs", "--run-dir", str(root)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert rows["lr-low"].endswith("configs/default.yaml --set pretrain.lr=1e-4 'finetune.tasks=[sst2]'")
    assert rows["lr-high"].endswith("configs/default.yaml --set pretrain.lr=1e-3 'finetune.tasks=[sst2]'")
    assert rows["first-run"].endswith("—")


def test_clean_a_run_keeps_what_another_run_uses(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with exclusive_dir(root / "pretrain" / "p1", "pretraining"):  # leaves its lock file beside p1
        pass
    assert lock_file_of(root / "pretrain" / "p1").is_file()
    assert cli(["runs", "clean", "first-run", "--run-dir", str(root)]) == 0
    assert "Dry run: nothing deleted" in capsys.readouterr().out
    assert (root / "pretrain" / "p1" / MARKER_NAME).is_file()
    assert cli(["runs", "clean", "first-run", "--run-dir", str(root), "--yes"]) == 0
    assert not (root / "pretrain" / "p1").exists() and (root / "tokenizer" / "t1" / MARKER_NAME).is_file()
    assert not lock_file_of(root / "pretrain" / "p1").exists()
    assert not any("first-run" in p.name for p in (root / "flow_runs").iterdir())
    assert (root / "pretrain" / "p2" / MARKER_NAME).is_file()


def test_cleaning_a_stage_output_a_run_uses_names_that_run(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage output named by path is deleted as asked, but the listing says which flow runs'
    records still use it (their `runs show` will list it as deleted); an unused one says nothing."""
    assert cli(["runs", "clean", "tokenizer/t1", "preprocess/s9", "--run-dir", str(root)]) == 0
    out = capsys.readouterr().out
    (tokenizer,) = [line for line in out.splitlines() if "tokenizer" in line]
    assert "(used by flow runs second-run, first-run: their records will name a deleted output)" in tokenizer
    (preprocess,) = [line for line in out.splitlines() if "preprocess" in line]
    assert "used by" not in preprocess and "Dry run" in out
    assert cli(["runs", "clean", "first-run", "--run-dir", str(root)]) == 0  # a run's own outputs: no note
    assert "used by" not in capsys.readouterr().out


def test_a_copied_run_directory_cleans_its_own_outputs_never_the_originals(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The records hold absolute paths: in a copy (a backup, a directory to experiment in) they
    name the original's outputs, which cleaning the copy must not touch."""
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, symlinks=True)
    assert cli(["runs", "show", "second-run", "--run-dir", str(copy)]) == 0
    out = capsys.readouterr().out
    assert str(copy / "pretrain" / "p2") in out and str(root) + os.sep not in out
    assert cli(["runs", "clean", "first-run", "--run-dir", str(copy), "--yes"]) == 0
    assert (root / "pretrain" / "p1" / MARKER_NAME).is_file()  # the original's, untouched
    assert not (copy / "pretrain" / "p1").exists() and (copy / "tokenizer" / "t1" / MARKER_NAME).is_file()


def test_a_run_named_before_or_after_the_options(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`runs show --config C RUN` failed: argparse left RUN, after an option, unrecognized."""
    for argv in (["first-run", "--run-dir", str(root)], ["--run-dir", str(root), "first-run"]):
        assert cli(["runs", "show", *argv]) == 0
        assert capsys.readouterr().out.startswith("flow run first-run: completed")
    assert cli(["runs", "clean", "--run-dir", str(root), "first-run", "--yes"]) == 0
    assert not (root / "pretrain" / "p1").exists()
    assert cli(["runs", "show", "--run-dir", str(root), "--bogus"]) == 2  # an unknown option stays an error
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_clean_incomplete_and_refusals(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert progress_state(root / "preprocess" / "s9") == "interrupted"  # its writer is gone
    running = _stage(root, "preprocess", "s10", complete=False)
    mark_in_progress(running)  # this very process: alive
    assert progress_state(running) == "running"
    assert cli(["runs", "clean", "preprocess/s10", "--yes", "--run-dir", str(root)]) == 2
    assert "being written by a running process; nothing deleted" in capsys.readouterr().err
    # an interrupted pretraining with a verified checkpoint: listed, said to be resumable (it was
    # listed as any interrupted output, hours of steps deleted by --yes without a word)
    killed = _stage(root, "pretrain", "p9", complete=False)
    (killed / "checkpoints" / "global_step40").mkdir(parents=True)
    (killed / "checkpoints" / "global_step40" / VERIFIED_NAME).write_text("{}")
    (killed / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    assert cli(["runs", "clean", "--incomplete", "--run-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "preprocess/s9" in out and "preprocess/s10" not in out  # the running one is not "incomplete"
    (line,) = [line for line in out.splitlines() if "pretrain/p9" in line]
    assert "a verified checkpoint at step 40: rerunning the command that started it resumes there" in line
    assert "verified checkpoint" not in out.replace(line, "")
    write_marker(running)
    assert not (running / IN_PROGRESS_NAME).exists() and progress_state(running) == "complete"
    assert cli(["runs", "clean", "--incomplete", "--yes", "--run-dir", str(root)]) == 0
    assert not (root / "preprocess" / "s9").exists() and running.is_dir()
    # nothing outside the stage layout is ever deleted
    outside = root / "notes"
    outside.mkdir()
    assert cli(["runs", "clean", str(outside), "--yes", "--run-dir", str(root)]) == 2
    assert cli(["runs", "clean", "pretrain", "--yes", "--run-dir", str(root)]) == 2
    assert outside.is_dir() and (root / "pretrain" / "p2").is_dir()
    assert cli(["runs", "show", "secnd-run", "--run-dir", str(root)]) == 2
    assert "did you mean second-run?" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["list", "show", "stages"])
def test_a_run_dir_that_is_missing_or_a_file_is_refused(
    tmp_path: Path, action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It read "no flow runs yet", exit 0: a typo in --run-dir looked like an empty run directory."""
    (tmp_path / "a_file").write_text("x")
    for run_dir, words in ((tmp_path / "typo", "does not exist"), (tmp_path / "a_file", "is a file")):
        assert cli(["runs", action, "--run-dir", str(run_dir)]) == 2
        assert f"--run-dir {run_dir} {words}" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # an existing run directory without runs keeps its message
    assert cli(["runs", "list", "--run-dir", str(tmp_path / "empty")]) == 0
    assert "no flow runs yet" in capsys.readouterr().out


def test_a_second_writer_leaves_the_live_writers_record_alone(tmp_path: Path) -> None:
    """A run refused on an output another live process writes must not replace that process's
    in-progress record: `runs stages` would call the live output interrupted, and
    `runs clean --incomplete` delete it. Once the writer is gone, the output is taken over."""
    out = tmp_path / "runs" / "pretrain" / "p1"
    code = "import sys, time; from common.atomic import mark_in_progress; mark_in_progress(sys.argv[1]); "
    code += "print('marked', flush=True); time.sleep(60)"
    writer = subprocess.Popen(
        [sys.executable, "-c", code, str(out)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline() == "marked\n"
        with pytest.raises(UserError, match=f"being written by another process \\(pid {writer.pid},"):
            mark_in_progress(out)
        assert progress_state(out) == "running"
        assert json.loads((out / IN_PROGRESS_NAME).read_text())["pid"] == writer.pid
        with pytest.raises(UserError, match="being written by another process"):  # `--force` neither
            clear(out)
        assert (out / IN_PROGRESS_NAME).is_file()
    finally:
        writer.kill()
        writer.wait()
    assert progress_state(out) == "interrupted"
    mark_in_progress(out)
    assert json.loads((out / IN_PROGRESS_NAME).read_text())["pid"] == os.getpid()


def test_a_live_flow_run_keeps_what_it_will_use_and_a_killed_one_reads_interrupted(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flow run records its writer and the outputs it plans to use from its first moment: while
    it runs, cleaning an older run keeps those (pretrain/p1, which it is about to reuse); once its
    process is gone without finishing, `bertflow runs` says interrupted, not running forever. The
    record is the one `write_record` writes, from the flow run's own process."""
    killed = _stage(root, "pretrain", "p3", complete=False)  # a pretraining killed earlier
    (killed / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 1, "host": os.uname().nodename}))
    planned = [str(root / "tokenizer" / "t1"), str(root / "pretrain" / "p1"), str(killed)]
    code = (
        "import json, sys, time; from pathlib import Path; "
        "from pipelines.flow_records import stage_record, write_record; root = Path(sys.argv[1]); "
        "tok = stage_record('tokenizer', root / 'tokenizer' / 't1', 'cached', 1.0, 0.0); "
        "write_record(root, 'third-run', 'g', [tok], 1767434400.0, planned=json.loads(sys.argv[2])); "
        "print('up', flush=True); time.sleep(60)"
    )  # started 2026-01-03 10:00 UTC: the newest run
    live = subprocess.Popen(
        [sys.executable, "-c", code, str(root), json.dumps(planned)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout.readline() == "up\n"
        assert cli(["runs", "--run-dir", str(root)]) == 0
        assert re.search(r"third-run .* running", capsys.readouterr().out)
        assert cli(["runs", "clean", "first-run", "--run-dir", str(root), "--yes"]) == 0
        assert (root / "pretrain" / "p1" / MARKER_NAME).is_file()  # the live run will reuse it
        assert cli(["runs", "clean", "--incomplete", "--run-dir", str(root), "--yes"]) == 0
        assert killed.is_dir()  # and resume this one
    finally:
        live.kill()
        live.wait()
    assert cli(["runs", "--run-dir", str(root)]) == 0
    assert re.search(r"third-run .* interrupted", capsys.readouterr().out)
    assert cli(["runs", "clean", "--incomplete", "--run-dir", str(root), "--yes"]) == 0
    assert not killed.exists()


@pytest.mark.parametrize("status", ["completed", "failed"])
def test_cleaning_a_finished_run_keeps_what_it_only_planned(
    root: Path, status: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record keeps its planned outputs after the run ends (a failed run, or `--only verify`,
    plans every stage but uses few): only a live run's plan counts, so cleaning a finished run
    deletes what it used, never an output it merely planned."""
    from pipelines.flow_records import stage_record, write_record

    planned_only = _stage(root, "pretrain", "p3")  # used by no flow run
    tok = stage_record("tokenizer", root / "tokenizer" / "t1", "cached", 1.0, 0.0)
    own = _stage(root, "preprocess", "s3")
    shards = stage_record("preprocess", own, "ran", 1.0, 1.0)
    planned = [str(root / "tokenizer" / "t1"), str(own), str(planned_only)]
    write_record(root, "third-run", "g", [tok, shards], 1767434400.0, status=status, planned=planned)
    assert cli(["runs", "clean", "third-run", "--run-dir", str(root), "--yes"]) == 0
    assert not own.exists() and (root / "tokenizer" / "t1" / MARKER_NAME).is_file()
    assert (planned_only / MARKER_NAME).is_file()


def test_cleaning_a_killed_run_keeps_the_output_it_was_writing(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed flow run's record holds the stage it was in as running (for `runs show`); cleaning
    that record must not take the interrupted output with it: a rerun resumes from its checkpoints.
    `runs stages` names that run beside the output (it said "used by —", as of an orphan)."""
    from pipelines.flow_records import stage_record, write_record

    interrupted = _stage(root, "pretrain", "p4", complete=False)
    own = _stage(root, "preprocess", "s4")
    rows = [
        stage_record("preprocess", own, "ran", 1.0, 1.0),
        stage_record("pretrain", interrupted, "running", 0, 0),
    ]
    write_record(root, "killed-run", "g", rows, 1767434400.0, status="failed")
    assert cli(["runs", "stages", "--run-dir", str(root)]) == 0
    listed = {
        line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("pre")
    }
    assert listed["p4"].endswith("— (killed-run ended while writing it; rerunning its command finishes it)")
    assert listed["s9"].endswith("—")  # interrupted too, but no flow run recorded writing it
    assert listed["s4"].endswith("killed-run")
    assert cli(["runs", "clean", "killed-run", "--run-dir", str(root), "--yes"]) == 0
    assert not own.exists() and (interrupted / "payload.bin").is_file()


def test_a_killed_runs_stage_shows_how_long_it_ran_not_0_s(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed flow run's record keeps the stage it was in as running at 0.0 s (its process died
    before it could write more), which `runs show` printed as the stage's time. What is known is
    shown: at least until its output was last written; — for a record without the stage's start."""
    from pipelines.flow_records import stage_record, write_record

    out = _stage(root, "pretrain", "p4", complete=False)
    rows = [stage_record("pretrain", out, "running", 0, 0)]
    t0 = rows[0]["started"]
    path = write_record(root, "killed-run", "g", rows, t0 - 60.0)  # its first minute went on other stages
    record = json.loads(path.read_text())
    record["writer"]["pid"] = 2**22 + 1  # its process is gone
    path.write_text(json.dumps(record))
    os.utime(path, (t0, t0))
    os.utime(out / "payload.bin", (t0 + 600, t0 + 600))  # the stage wrote for ten minutes more
    assert cli(["runs", "show", "killed-run", "--run-dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("flow run killed-run: interrupted") and "UTC, ≥ 11 min 00 s;" in shown
    assert re.search(r"\npretrain +interrupted +≥ 10 min 00 s +unfinished ", shown)
    assert cli(["runs", "--run-dir", str(root)]) == 0
    assert re.search(r"killed-run .* interrupted +≥ 11 min 00 s ", capsys.readouterr().out)
    # a rerun five minutes in resumed in that output and wrote to it until t0 + 600: the killed run's
    # time ends where the rerun began (it read '≥ 11 min' up to the end of the rerun)
    write_record(
        root, "rerun", "g", [stage_record("pretrain", out, "ran", 300, 300)], t0 + 300, status="completed"
    )
    assert cli(["runs", "show", "killed-run", "--run-dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"UTC, ≥ (5 min 59|6 min 00) s;", shown), shown
    assert re.search(r"\npretrain +interrupted +≥ (4 min 59|5 min 00) s +unfinished ", shown), shown
    del record["stages"][0]["started"]  # a record written before rows had their start
    path.write_text(json.dumps(record))
    assert cli(["runs", "show", "killed-run", "--run-dir", str(root)]) == 0
    assert re.search(r"\npretrain +interrupted +— +unfinished ", capsys.readouterr().out)


def test_a_stopped_runs_stage_time_is_what_its_record_knows(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM (or Ctrl-C) of `bertflow run` during pretraining ended the flow run failed, its record
    keeping the stage it was in as running at 0.0 s. `runs show` took that stage's time from its
    output's last write, which a later `bertflow pretrain` resuming there moved on: '≥ 2 min 27 s' in
    a flow run of 30.4 s. Now the flow writes, as it stops, how long the stage ran (shown as is), and
    an older record's stage ran at least until its flow run ended, never past it. Such a run and its
    stage read `stopped` (they read failed and interrupted, though the user had stopped it)."""
    import calendar

    out = _stage(root, "pretrain", "p5", complete=False)
    started = "2026-01-03 10:00:00"
    t0 = calendar.timegm(time.strptime(started, "%Y-%m-%d %H:%M:%S"))
    row = {"stage": "pretrain", "key": "p5", "out_dir": str(out), "status": "running", "started": t0 + 14.0,
           "seconds": 0.0, "compute_seconds": 0.0}  # fmt: skip
    path = root / "flow_runs" / "20260103T100000-stopped-run.json"
    record = {"flow_run": "stopped-run", "started_utc": started, "seconds": 30.4, "status": "failed"}
    path.write_text(json.dumps({**record, "stages": [row]}))
    os.utime(out / "payload.bin", (t0 + 161, t0 + 161))  # `bertflow pretrain` wrote there later
    assert cli(["runs", "show", "stopped-run", "--run-dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("flow run stopped-run: failed") and "UTC, 30.4 s;" in shown
    assert re.search(r"\npretrain +interrupted +≥ 16.4 s +unfinished ", shown), shown
    # as the flow writes it now: the run and its stage read stopped, saying how, not failed
    stopped = {**record, "status": "stopped", "stopped_by": "SIGTERM to bertflow"}
    path.write_text(json.dumps({**stopped, "stages": [{**row, "seconds": 15.9, "stopped": True}]}))
    assert cli(["runs", "show", "stopped-run", "--run-dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("flow run stopped-run: stopped (SIGTERM to bertflow), started"), shown
    assert re.search(r"\npretrain +stopped +15.9 s +unfinished ", shown), shown
    assert cli(["runs", "--run-dir", str(root)]) == 0
    assert re.search(r"\nstopped-run +2026-01-03 10:00:00 +stopped +30.4 s ", capsys.readouterr().out)


def test_clean_leaves_no_dangling_latest_links(root: Path) -> None:
    """`latest/` links to the newest run's outputs; cleaning that run removes the links that would
    point at nothing (a broken `latest/model` reads as a missing file, not a cleaned run)."""
    (root / "pretrain" / "p2" / "model").mkdir()
    record = next((root / "flow_runs").glob("*second-run.json"))
    dirs = {s: root / s / k for s, k in (("tokenizer", "t1"), ("pretrain", "p2"), ("finetune", "f2"))}
    latest = update_latest(root, dirs, record)
    assert (latest / "model").is_dir()
    assert cli(["runs", "clean", "second-run", "--run-dir", str(root), "--yes"]) == 0
    assert not (root / "pretrain" / "p2").exists()
    assert not [p.name for p in latest.iterdir() if p.is_symlink() and not p.exists()]
    assert (latest / "tokenizer").is_dir()  # still used by first-run, and still linked


def test_cleaning_the_newest_run_points_latest_at_the_newest_run_left(root: Path) -> None:
    """`latest/` links to the newest flow run's outputs. Cleaning that run used to leave `latest/`
    holding what survived of it (its shared outputs, no flow_run.json) and its `report.html`, a page
    opening a deleted report; now `latest/` links the newest flow run left, and with none left, nothing."""
    report = _stage(root, "report", "r2")
    (report / "report.html").write_text("<p>second</p>")
    second = next((root / "flow_runs").glob("*second-run.json"))
    data = json.loads(second.read_text())
    row = {"stage": "report", "key": "r2", "out_dir": str(report), "status": "ran", "seconds": 1.0}
    second.write_text(json.dumps({**data, "stages": [*data["stages"], row]}))
    dirs = {s: root / s / k for s, k in (("tokenizer", "t1"), ("pretrain", "p2"), ("finetune", "f2"))}
    latest = update_latest(root, {**dirs, "report": report}, second)
    assert (latest / "report.html").is_file()

    assert cli(["runs", "clean", "second-run", "--run-dir", str(root), "--yes"]) == 0
    first = next((root / "flow_runs").glob("*first-run.json"))
    assert (latest / "flow_run.json").resolve() == first.resolve()
    assert (latest / "pretrain").resolve() == (root / "pretrain" / "p1").resolve()
    assert not (latest / "report.html").exists() and not (latest / "finetune").exists()
    assert not [p.name for p in latest.iterdir() if p.is_symlink() and not p.exists()]

    assert cli(["runs", "clean", "first-run", "--run-dir", str(root), "--yes"]) == 0
    assert not list(latest.iterdir())


def test_latest_links_follow_the_newest_flow_run(root: Path) -> None:
    (root / "pretrain" / "p2" / "model").mkdir()
    record = next((root / "flow_runs").glob("*second-run.json"))
    dirs = {"tokenizer": root / "tokenizer" / "t1", "pretrain": root / "pretrain" / "p2",
            "report": root / "report" / "missing"}  # fmt: skip
    latest = update_latest(root, dirs, record)
    assert (latest / "model").resolve() == (root / "pretrain" / "p2" / "model").resolve()
    assert (latest / "flow_run.json").resolve() == record.resolve()
    assert not (latest / "report").exists() and not (latest / "report.html").exists()  # not complete
    assert not os.path.isabs(os.readlink(latest / "pretrain"))  # relative: the run dir can move
    # the report: `report.html` is a page opening report/report.html, not a link to the page (whose
    # relative image and model links a browser would resolve against latest/)
    report = _stage(root, "report", "r2")
    (report / "report.html").write_text("<img src='loss.png'>")
    update_latest(root, {**dirs, "report": report}, record)
    assert not (latest / "report.html").is_symlink()
    [target] = re.findall(r'url=([^"]+)"', (latest / "report.html").read_text())
    assert (latest / target).resolve() == (report / "report.html").resolve()
    assert (latest / target).parent.joinpath("loss.png").resolve() == (report / "loss.png").resolve()
    update_latest(root, {"tokenizer": root / "tokenizer" / "t1"}, None)
    assert not (latest / "model").exists() and (latest / "tokenizer").is_dir()
    assert not (latest / "report.html").exists()


def test_latest_links_a_runs_phases_and_drops_those_it_does_not_have(root: Path) -> None:
    dirs = {"pretrain@seq32": root / "pretrain" / "p1", "pretrain": root / "pretrain" / "p2"}
    latest = update_latest(root, dirs, None)
    assert (latest / "pretrain@seq32").resolve() == (root / "pretrain" / "p1").resolve()
    assert (latest / "pretrain").resolve() == (root / "pretrain" / "p2").resolve()
    update_latest(root, {"pretrain": root / "pretrain" / "p2"}, None)  # a config without the phase
    assert not (latest / "pretrain@seq32").is_symlink() and (latest / "pretrain").is_dir()


def test_clean_deletes_a_runs_own_finetuning_units_and_keeps_shared_ones(tmp_path: Path) -> None:
    """Fine-tuning units are recorded per flow run (`units`); one that another run also used (the
    same unit key: same checkpoint, task, lr and seed) stays when the first run is cleaned."""
    root = tmp_path / "runs"
    shared, own = (
        _stage(root, "finetune/units", "sst2-s1-aaaa"),
        _stage(root, "finetune/units", "sst2-s2-bbbb"),
    )
    fin1, fin2 = _stage(root, "finetune", "f1"), _stage(root, "finetune", "f2")
    first = _record(root, "first-run", "2026-01-01 10:00:00", {"finetune": fin1})
    second = _record(root, "second-run", "2026-01-02 10:00:00", {"finetune": fin2})
    for record, units in ((first, [shared, own]), (second, [shared])):
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "units": [str(u) for u in units]}))
    assert cli(["runs", "clean", "first-run", "--run-dir", str(root), "--yes"]) == 0
    assert not own.exists() and not fin1.exists()
    assert (shared / MARKER_NAME).is_file() and (fin2 / MARKER_NAME).is_file()


def _followed(hint: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The output of the `bertflow runs ...` command quoted in `hint`, run as printed."""
    import shlex

    command = re.search(r"`(bertflow runs[^`]*)`", hint)
    assert command, hint
    assert cli(shlex.split(command.group(1))[1:]) == 0
    return capsys.readouterr().out


def test_hints_followed_as_printed_look_at_the_same_run_directory(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hints of `runs show nosuch`, `runs clean /nonexist` and the list's footer said `bertflow
    runs ...` without the --run-dir given: followed, they listed ./runs ("no flow runs yet")."""
    assert cli(["runs", "show", "nosuch", "--run-dir", str(root)]) == 2
    assert "second-run" in _followed(capsys.readouterr().err, capsys)
    assert cli(["runs", "clean", "/nonexist", "--run-dir", str(root)]) == 2
    assert "second-run, first-run" in _followed(capsys.readouterr().err, capsys)  # runs stages
    assert cli(["runs", "--run-dir", str(root)]) == 0
    assert _followed(capsys.readouterr().out, capsys).startswith("flow run second-run: completed")


def test_show_sizes_the_units_the_run_used_not_the_whole_units_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs show` gave `finetune-units` the size of all of `finetune/units/` (1.1 MiB for a run of
    2 units beside another run's 28): now the size of this run's units, how many are left."""
    root = tmp_path / "runs"
    mine = [_stage(root, "finetune/units", f"rte-s{i}-aaaa") for i in (1, 2)]
    other = _stage(root, "finetune/units", "sst2-s1-bbbb")
    (other / "model.bin").write_bytes(b"x" * 100_000)
    record = _record(
        root, "small-run", "2026-01-01 10:00:00", {"finetune-units": root / "finetune" / "units"}
    )
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "units": [str(u) for u in mine]}))
    assert cli(["runs", "show", "--run-dir", str(root)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("finetune-units"))
    assert f"{byte_size(dir_size(mine[0]) + dir_size(mine[1]))} " in row and "(2 units)" in row, row
    shutil.rmtree(mine[0])
    assert cli(["runs", "show", "--run-dir", str(root)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("finetune-units"))
    assert "1 of 2 present" in row, row


def test_a_flow_run_stopped_while_its_units_train_has_a_stopped_units_row(
    tmp_path: Path, data_dir: Path, capsys
) -> None:
    """A flow run stopped (Ctrl-C, SIGTERM) while its fine-tuning units trained left no
    `finetune-units` row: its record ended at the stage before, so `runs show` could not say what
    it was doing. The units now have a row from their start, as every stage has (`FlowRun._row`),
    which a stop leaves `stopped` with the seconds they ran, and a failure leaves failed."""
    from pipelines.config import load_config
    from pipelines.flow_run import FlowRun
    from tests.flow_support import tiny_config

    cfg = load_config(tiny_config(tmp_path, data_dir))
    run = FlowRun(cfg, "stopped-in-units", None, None, None)
    units = run.root / "finetune" / "units"
    with pytest.raises(KeyboardInterrupt), run.recorded(), run._row("finetune-units", units, key="-"):
        [row] = json.loads(run.record_path.read_text())["stages"]
        assert row["stage"] == "finetune-units" and row["status"] == "running", row  # a kill -9 here
        raise KeyboardInterrupt
    record = json.loads(run.record_path.read_text())
    assert record["status"] == "stopped" and record["stopped_by"] == "Ctrl-C", record
    [row] = record["stages"]
    assert row["status"] == "running" and row["stopped"] and row["key"] == "-", row
    assert cli(["runs", "show", "stopped-in-units", "--run-dir", str(run.root)]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"\nfinetune-units +stopped +\d", shown), shown


def test_the_no_flow_runs_hint_names_a_flow_run_that_writes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bertflow runs --run-dir R` of an empty R said "`bertflow run CONFIG` writes R/flow_runs/" (and
    `runs show`: "run `bertflow run CONFIG` first"): a config's flow run writes into its run_dir, ./runs
    for the shipped ones, not R. The hint now sets run_dir=R, or is the --config given when its
    run_dir is R; parsed by the CLI and loaded (CONFIG: a shipped config), its run directory is R."""
    import shlex

    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.stage_keys import run_root

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    Path("c.yaml").write_text("run_dir: mine\n")
    default = str(PROJECT_ROOT / "configs" / "default.yaml")
    for argv, root in (
        (["runs", "--run-dir", "empty"], tmp_path / "empty"),
        (["runs", "show", "--run-dir", "empty"], tmp_path / "empty"),
        (["runs", "--config", "c.yaml"], tmp_path / "mine"),
        (["runs", "show", "--config", "c.yaml", "--run-dir", "empty"], tmp_path / "empty"),
        (["runs"], tmp_path / "runs"),
    ):
        cli(argv)
        said = capsys.readouterr()
        command = re.search(r"`(bertflow run [^`]*)`", said.out + said.err)
        assert command, said
        words = [default if w == "CONFIG" else w for w in shlex.split(command.group(1))]
        args = build_parser("run").parse_args(words[1:])
        assert run_root(load_config(args.config, args.overrides)) == root, (argv, command.group(1))
        if "show" in argv:  # it said "this run directory has no flow runs yet": which one, unsaid
            assert f"{root} has no flow runs yet (no records in {root / 'flow_runs'})" in said.err, said
    # cleaning a run directory without flow runs: nothing to clean there (it said "run `bertflow run
    # CONFIG --set run_dir=R` first", a flow run to make something to clean; and --incomplete said
    # "every output of these runs is still used by another flow run", of no runs and no outputs)
    assert cli(["runs", "clean", "latest", "--yes", "--run-dir", "empty"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'empty'} has no flow runs" in err and "nothing deleted" in err, err
    assert "bertflow run " not in err and "first" not in err, err
    assert cli(["runs", "clean", "--incomplete", "--yes", "--run-dir", "empty"]) == 0
    out = capsys.readouterr().out
    said = f"nothing to delete: {tmp_path / 'empty'} holds no interrupted or unfinished stage output"
    assert said in out, out


def test_runs_show_names_the_command_of_each_flow_runs_settings(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two flow runs of one config with different settings (`--set pretrain.max_steps=...`) looked
    the same in `bertflow runs` and `runs show`: no record said what either was run with. The record
    now keeps the `bertflow run` command of its settings, and `runs show` prints it."""
    import shlex

    from pipelines.config import load_config
    from pipelines.flow_run import FlowRun
    from tests.flow_support import tiny_config

    config = tiny_config(tmp_path, data_dir)
    for name, steps in (("twenty-steps", 20), ("thirty-steps", 30)):
        cfg = load_config(config, [f"pretrain.max_steps={steps}"])
        run = FlowRun(cfg, name, None, None, ["report"])
        with run.recorded():
            pass
    for name, steps in (("twenty-steps", 20), ("thirty-steps", 30)):
        assert cli(["runs", "show", name, "--run-dir", str(run.root)]) == 0
        [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("command: ")]
        flags = ["--force", "report", "--set", f"pretrain.max_steps={steps}"]
        assert shlex.split(line.removeprefix("command: ")) == ["bertflow", "run", str(config), *flags]


def test_runs_show_of_a_killed_or_stopped_flow_run_says_how_to_resume_it(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flow run killed midway (kill -9: `interrupted`) or stopped (Ctrl-C) is resumed by rerunning
    the same command (README), but `runs show` said only `interrupted`, and the command, --set items
    and all, was nowhere. It now ends with the command to resume it; a completed run has no such line."""
    from pipelines.config import load_config
    from pipelines.flow_run import FlowRun
    from tests.flow_support import tiny_config

    cfg = load_config(tiny_config(tmp_path, data_dir), ["pretrain.max_steps=400"])
    killed = FlowRun(cfg, "killed-run", None, None, None)
    record = killed.write_record()  # status running, as a kill -9 leaves it
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "writer": {**data["writer"], "pid": 2**22 + 12345}}))
    stopped = FlowRun(cfg, "stopped-run", None, None, None)
    with pytest.raises(KeyboardInterrupt), stopped.recorded():
        raise KeyboardInterrupt
    done = FlowRun(cfg, "done-run", None, None, None)
    with done.recorded():
        pass
    for name, status in (("killed-run", "interrupted"), ("stopped-run", "stopped (Ctrl-C)")):
        assert cli(["runs", "show", name, "--run-dir", str(killed.root)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"flow run {name}: {status},"), out
        assert f"to resume: rerun the same command, `{killed.command}`; its complete stages are reused" in out
        assert "--set pretrain.max_steps=400" in killed.command
    assert cli(["runs", "show", "done-run", "--run-dir", str(killed.root)]) == 0
    assert "to resume" not in capsys.readouterr().out


def test_a_stage_output_named_from_the_current_directory_is_the_one_cleaned(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bertflow runs clean runs/pretrain/KEY` (the path as the shell completes it, from the project)
    was refused, "runs/pretrain/KEY is not a stage output of .../runs": a relative path was read
    from the run directory only (runs/runs/pretrain/KEY). It is now read from either."""
    monkeypatch.chdir(tmp_path)  # the run directory is ./runs, the default
    assert cli(["runs", "clean", "runs/pretrain/p1", "tokenizer/t1"]) == 0
    out = capsys.readouterr().out
    assert (
        f"{root / 'pretrain' / 'p1'}  (used by" in out and f"{root / 'tokenizer' / 't1'}  (used by" in out
    ), out
    assert cli(["runs", "clean", "runs/pretrain/p1", "--yes"]) == 0
    assert not (root / "pretrain" / "p1").exists() and (root / "pretrain" / "p2").is_dir()
    (tmp_path / "pretrain" / "p2").mkdir(parents=True)  # not a stage output of ./runs
    assert cli(["runs", "clean", str(tmp_path / "pretrain" / "p2"), "--yes"]) == 2
    assert "is not a stage output of" in capsys.readouterr().err


def test_clean_all_deletes_every_run_and_output_but_never_one_being_written(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make clean` was `rm -rf runs`: every output went, a live pretraining's from under it too. It
    is now `bertflow runs clean --all --yes`: refused while an output's writer or a flow run runs;
    else every flow run and stage output goes, and the layout's folders that are left empty."""
    (root / "notes.txt").write_text("mine")
    writing = _stage(root, "pretrain", "p3", complete=False)
    mark_in_progress(writing)  # this very process: alive
    assert cli(["runs", "clean", "--all", "--yes", "--run-dir", str(root)]) == 2
    assert "is being written by a running process; nothing deleted" in capsys.readouterr().err
    write_marker(writing)
    live = _record(root, "live-run", "2026-01-03 10:00:00", {"pretrain": writing})
    data = json.loads(live.read_text())
    live.write_text(
        json.dumps({**data, "status": "running", "writer": {"pid": os.getpid(), "host": os.uname().nodename}})
    )
    assert cli(["runs", "clean", "--all", "--yes", "--run-dir", str(root)]) == 2
    assert "flow run live-run is running" in capsys.readouterr().err and writing.is_dir()
    live.unlink()
    assert cli(["runs", "clean", "--all", "--yes", "--run-dir", str(root)]) == 0
    assert "freed" in capsys.readouterr().out
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]  # the user's file, and nothing else


def test_clean_all_deletes_the_locks_of_outputs_never_made_unless_held(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stage refused or killed after it took its lock and before it made its output leaves
    `.KEY.lock` beside no `KEY`: `clean --all` kept that lock, and with it the stage's folder. It
    now deletes such locks, but never one a live process holds (a stage about to make its output)."""
    for stage in ("pretrain", "finetune"):
        (root / stage / ".never-made.lock").write_text("12345\n")
    with exclusive_dir(root / "preprocess" / "about-to-be-made", "preprocess"):
        assert cli(["runs", "clean", "--all", "--yes", "--run-dir", str(root)]) == 0
        assert "freed" in capsys.readouterr().out
        assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
            "preprocess",
            "preprocess/.about-to-be-made.lock",
        ]
    assert cli(["runs", "clean", "--all", "--yes", "--run-dir", str(root)]) == 0
    assert not root.exists()


def test_a_writer_whose_pid_another_process_took_reads_as_interrupted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a reboot (or pids wrapping round) the pid that an output's _IN_PROGRESS.json or a flow
    run's record names can be another live process's: the killed run read `running` for good, `runs
    clean` refused its output, and a rerun was refused ("being written by another process"), so it
    could not resume. The records now hold their writer's boot and start time, which a process that
    only reuses the pid does not have."""
    from common.atomic import refuse_other_writer

    other = os.getppid()  # alive, not this process
    started = int(Path(f"/proc/{other}/stat").read_text().rsplit(")", 1)[1].split()[19])  # ticks since boot
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    out = _stage(tmp_path / "runs", "pretrain", "k", complete=False)
    writer = {"pid": other, "host": os.uname().nodename, "boot_id": boot}
    (out / IN_PROGRESS_NAME).write_text(json.dumps({**writer, "start": started}))
    assert progress_state(out) == "running"  # that very process
    with pytest.raises(UserError, match="being written by another process"):
        refuse_other_writer(out)
    for reused in (
        {"start": started - 1},
        {"start": started, "boot_id": "an-earlier-boot"},
    ):
        (out / IN_PROGRESS_NAME).write_text(json.dumps({**writer, **reused}))
        assert progress_state(out) == "interrupted", reused
        refuse_other_writer(out)  # a rerun takes it over
        record = _record(tmp_path / "runs", "killed-run", "2026-01-01 10:00:00", {"pretrain": out})
        record.write_text(
            json.dumps(
                {**json.loads(record.read_text()), "status": "running", "writer": {**writer, **reused}}
            )
        )
        assert cli(["runs", "--run-dir", str(tmp_path / "runs")]) == 0
        assert re.search(r"killed-run +2026-01-01 10:00:00 +interrupted", capsys.readouterr().out)
    mark_in_progress(out)  # this process's own record holds its identity
    assert {"boot_id", "start"} <= json.loads((out / IN_PROGRESS_NAME).read_text()).keys()


def test_the_resume_command_leaves_out_the_force_of_the_stages_the_run_began(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bertflow run C --from pretrain` stopped in pretraining: rerunning that same command would
    force pretraining again, from scratch, its checkpoints deleted. The resume command `runs show`
    gives keeps --force for the stages the run had not begun only."""
    import shlex

    from pipelines.config import load_config
    from pipelines.flow_run import FlowRun
    from tests.flow_support import tiny_config

    config = tiny_config(tmp_path, data_dir)
    run = FlowRun(load_config(config, ["pretrain.max_steps=400"]), "from-pretrain", None, "pretrain", None)
    with pytest.raises(KeyboardInterrupt), run.recorded(), run._row("pretrain", run.dirs["pretrain"]):
        raise KeyboardInterrupt
    assert cli(["runs", "show", "from-pretrain", "--run-dir", str(run.root)]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("to resume: ")]
    resume = shlex.split(line.split("`")[1])
    flags = ["--force", "finetune", "--force", "report", "--set", "pretrain.max_steps=400"]
    assert resume == ["bertflow", "run", str(config), *flags], line
    assert "its own --force/--from would recompute the stages it began from scratch" in line
