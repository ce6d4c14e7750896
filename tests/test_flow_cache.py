"""Real Prefect flow runs (ephemeral API) of the cheap verify stage: the completion marker is the
source of truth, Prefect's cache mirrors it (a rerun is `Cached`), a deleted marker or --force
recomputes, a stage whose inputs are missing is refused with a clear message, and a stage that
fails is retried (flow.retries) unless it failed on bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.atomic import MARKER_NAME
from common.errors import TransientError, UserError


def _statuses(summary: dict) -> dict[str, str]:
    return {r["stage"]: r["status"] for r in summary["stages"]}


def test_verify_stage_cache_marker_and_force(tmp_path: Path, data_dir: Path) -> None:
    from pipelines.flow import bert_pipeline

    overrides = [f"run_dir={tmp_path}"]
    first = bert_pipeline(config=None, overrides=overrides, only="verify")
    assert _statuses(first) == {"verify": "ran"}
    out = Path(first["stages"][0]["out_dir"])
    marker = out / MARKER_NAME
    assert marker.is_file() and (out / "stage_key.json").is_file()
    stamp = marker.stat().st_mtime_ns

    second = bert_pipeline(config=None, overrides=overrides, only="verify")
    assert _statuses(second) == {"verify": "cached"}
    assert marker.stat().st_mtime_ns == stamp  # not recomputed

    marker.unlink()  # the marker is the source of truth: without it the stage recomputes
    third = bert_pipeline(config=None, overrides=overrides, only="verify")
    assert _statuses(third) == {"verify": "ran"} and marker.is_file()
    stamp = marker.stat().st_mtime_ns

    forced = bert_pipeline(config=None, overrides=overrides, only="verify", force=["verify"])
    assert _statuses(forced) == {"verify": "ran"} and marker.stat().st_mtime_ns != stamp

    # every flow run left a record of what it did (the report's timing / cache-hit table)
    records = sorted((tmp_path / "flow_runs").glob("*.json"))
    assert len(records) == 4
    assert [json.loads(p.read_text())["stages"][0]["status"] for p in records].count("cached") == 1

    # a stage whose inputs were never computed is refused, naming the missing stage, before the
    # flow run records anything (a deployment's run; `bertflow run` refuses it before Prefect starts)
    with pytest.raises(
        UserError,
        match="--only preprocess needs stages that have no complete output for this config: tokenizer",
    ):
        bert_pipeline(config=None, overrides=overrides, only="preprocess")
    assert len(list((tmp_path / "flow_runs").glob("*.json"))) == 4


def test_stage_command_alone_writes_where_the_flow_looks(tmp_path: Path, data_dir: Path) -> None:
    """`bertflow tokenizer CONFIG` alone → the flow finds that output and reuses it."""
    import os
    import subprocess
    import sys

    from common.paths import PROJECT_ROOT
    from pipelines.config import load_config
    from pipelines.flow import bert_pipeline
    from pipelines.stage_keys import stage_dir
    from tests.flow_support import tiny_config

    config = tiny_config(tmp_path, data_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "tokenizer", str(config)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    expected = stage_dir(load_config(config), "tokenizer")
    assert proc.stdout.strip().splitlines()[-1] == str(expected)
    from pipelines.stage_keys import stage_key_inputs  # what its key hashes, beside it as in the flow

    written = json.loads((expected / "stage_key.json").read_text())
    assert written == stage_key_inputs(load_config(config))["tokenizer"]
    stamp = (expected / MARKER_NAME).stat().st_mtime_ns
    summary = bert_pipeline(config=str(config), only="tokenizer")
    assert _statuses(summary) == {"tokenizer": "reused"}
    assert (expected / MARKER_NAME).stat().st_mtime_ns == stamp


class FailingVerify:
    """A stand-in for the verify stage's body (`pipelines.verify_data.verify_data`) that raises
    `errors` in turn, then succeeds, counting its calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self, _cfg: object) -> dict[str, int]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"files": 0}


def _run_verify_with_one_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: FailingVerify) -> dict:
    from pipelines.flow import bert_pipeline

    monkeypatch.setattr("pipelines.verify_data.verify_data", body)
    overrides = [f"run_dir={tmp_path}", "flow.retries=1", "flow.retry_delay_seconds=0", "wandb.mode=disabled"]
    return bert_pipeline(config=None, overrides=overrides, only="verify")


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("rank 1 lost"),
        # what a pretraining that lost a node raises (training.launch), said without a traceback
        TransientError("pretraining stopped: lost contact with the other ranks: ..."),
    ],
)
def test_a_transient_stage_failure_is_retried_by_the_flow(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    body = FailingVerify(failure)
    summary = _run_verify_with_one_retry(tmp_path, monkeypatch, body)
    assert body.calls == 2  # failed once, retried once (flow.retries=1), then succeeded
    assert _statuses(summary) == {"verify": "ran"}
    assert (Path(summary["stages"][0]["out_dir"]) / MARKER_NAME).is_file()


def test_bad_input_found_by_a_stage_is_not_retried_by_the_flow(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = FailingVerify(UserError("bad shard"), UserError("bad shard"))
    with pytest.raises(UserError, match="bad shard"):
        _run_verify_with_one_retry(tmp_path, monkeypatch, body)
    assert body.calls == 1  # flow.retries=1 allowed a retry; a UserError skips it


def test_a_stage_that_fails_leaves_its_output_unfinished_not_interrupted(tmp_path: Path) -> None:
    """A stage refused for bad input mid-flow is not a killed one: its directory loses the writer's
    `_IN_PROGRESS.json` (`bertflow runs stages` says unfinished; interrupted is for kills)."""
    from common.atomic import IN_PROGRESS_NAME, progress_state
    from pipelines.config import load_config
    from pipelines.flow import bert_pipeline
    from pipelines.stage_keys import stage_dir

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"\x00\x01binary\x00" * 100)
    overrides = [f"run_dir={tmp_path / 'runs'}", f"tokenizer.input=[{corpus}]", "flow.retries=0"]
    with pytest.raises(UserError, match="no documents|binary"):
        bert_pipeline(config=None, overrides=overrides, only="tokenizer")
    out = stage_dir(load_config(None, overrides), "tokenizer")
    assert out.is_dir() and not (out / IN_PROGRESS_NAME).exists()
    assert progress_state(out) == "unfinished"
    # the run's record names the stage that failed and why, for `bertflow runs show`
    from pipelines.runs_command import show_run

    shown = show_run(tmp_path / "runs", None)
    assert shown.startswith("flow run ") and ": failed," in shown.splitlines()[0]
    (row,) = [line for line in shown.splitlines() if line.startswith("tokenizer ") and "failed:" not in line]
    assert row.split()[:2] == ["tokenizer", "failed"]
    assert f"tokenizer failed: the corpus {corpus} holds no documents" in shown


def test_bad_input_found_by_a_stage_is_printed_by_the_failed_task_and_once_at_the_end(tmp_path: Path) -> None:
    """The message with its fix, not four copies of it: the flow run logged it twice more
    ("Encountered exception", "Finished in state Failed") between the task's line and the end."""
    import os
    import subprocess
    import sys

    from common.paths import PROJECT_ROOT

    corpus = tmp_path / "corpus.txt"
    # text without a document: refused by the stage (a binary file is refused by the preflight)
    corpus.write_text("\n" * 100)
    sets = [f"run_dir={tmp_path / 'runs'}", f"tokenizer.input=[{corpus}]", f"preprocess.input=[{corpus}]"]
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", "--only", "tokenizer",
         "--set", *sets, "wandb.mode=disabled"],
        capture_output=True, text=True, cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    said = f"the corpus {corpus} holds no documents"
    assert output.count(said) == 2, output[-3000:]
    assert "Task run 'tokenizer'" in output.split(said)[0].splitlines()[-1]  # the first names the stage
    assert f"bertflow run: error: {said}" in output and "Traceback" not in output


def test_the_flow_log_filter_drops_repeats_of_user_error_subclasses() -> None:
    """PretrainingStopped is a UserError: the flow run's "Finished in state Failed(...)" line names
    the subclass, which a match on 'UserError:' missed (printed three times)."""
    import logging

    from pipelines.prefect_logging import _UserErrorWithoutTraceback
    from training.stop_request import PretrainingStopped

    def kept(name: str, message: str) -> bool:
        record = logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)
        return _UserErrorWithoutTraceback().filter(record)

    said = f"Finished in state Failed('Flow run encountered an exception: {PretrainingStopped.__name__}: stopped')"
    assert not kept("prefect.flow_runs", said)
    assert kept("prefect.task_runs", said)  # the failed task's line names the stage
    assert kept("prefect.flow_runs", "Finished in state Failed('RuntimeError: rank 1 lost')")


def test_a_killed_flow_run_left_running_in_prefect_is_set_crashed_by_the_next_one(tmp_path: Path) -> None:
    """A flow run killed with kill -9 stayed Running in Prefect forever, its stage's task run too,
    after a rerun had finished that stage. The next flow run of the run directory sees the killed
    one's writer gone and sets both Crashed, saying so; a run Prefect holds as final is left. Each
    flow run publishes its end summary as an artifact (a watcher of an --only run saw none)."""
    import socket
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Running

    from pipelines.flow import bert_pipeline

    overrides = [f"run_dir={tmp_path}", "wandb.mode=disabled"]
    first = bert_pipeline(config=None, overrides=overrides, only="verify")
    killed_id = UUID(first["flow_run_id"])
    (task_id,) = first["task_run_ids"]
    with get_client(sync_client=True) as client:  # as Prefect holds a run whose process was killed
        client.set_task_run_state(UUID(task_id), Running(), force=True)
        client.set_flow_run_state(killed_id, Running(), force=True)
    record = Path(first["record"])
    data = json.loads(record.read_text())
    gone = {"pid": 2**22 + 1, "host": socket.gethostname()}  # its process is gone
    record.write_text(json.dumps({**data, "status": "running", "writer": gone}))
    killed_at = record.stat().st_mtime_ns  # `bertflow runs` reads a killed run's time from it

    rerun = bert_pipeline(config=None, overrides=overrides, only="verify")
    with get_client(sync_client=True) as client:
        flow_state = client.read_flow_run(killed_id).state
        task_state = client.read_task_run(UUID(task_id)).state
    assert flow_state.is_crashed() and task_state.is_crashed()
    assert f"it was killed. Flow run {rerun['flow_run']} of the same run directory" in flow_state.message
    assert json.loads(record.read_text())["prefect_crashed"] is True  # not asked again
    assert record.stat().st_mtime_ns == killed_at
    with get_client(sync_client=True) as client:  # the rerun's own run, final, is not touched
        assert client.read_flow_run(UUID(rerun["flow_run_id"])).state.is_completed()
        # what `bertflow run` prints at its end is the flow run's artifact too (an --only run had none)
        by_run = FlowRunFilter(id=FlowRunFilterId(any_=[UUID(rerun["flow_run_id"])]))
        (artifact,) = client.read_artifacts(flow_run_filter=by_run)
    assert artifact.key == "bert-run-default"
    assert re.search(r"\n  verify +cached ", artifact.data) and "Latest: " in artifact.data

    # a Cancel from Prefect (UI, `prefect flow-run cancel`) of a deployment's run: Prefect sets the
    # flow run Cancelled, the SIGTERM its worker sends leaves the stopped stage's task run Crashed
    # and the record `stopped`; the next flow run sets that task run Cancelled too
    from prefect.states import Cancelled, Crashed

    from pipelines.prefect_killed_runs import cancel_stopped_runs

    (rerun_task,) = rerun["task_run_ids"]
    with get_client(sync_client=True) as client:
        client.set_task_run_state(UUID(rerun_task), Crashed(), force=True)
        client.set_flow_run_state(UUID(rerun["flow_run_id"]), Cancelled(), force=True)
    rerun_record = Path(rerun["record"])
    from common.errors import DEPLOYMENT_SIGTERM

    stopped = {"status": "stopped", "stopped_by": DEPLOYMENT_SIGTERM}  # a Cancel of a deployment's run
    rerun_record.write_text(json.dumps({**json.loads(rerun_record.read_text()), **stopped}))
    assert cancel_stopped_runs(tmp_path, lambda line: None) == [rerun["flow_run"]]
    with get_client(sync_client=True) as client:
        state = client.read_task_run(UUID(rerun_task)).state
    assert state.is_cancelled()
    # no command of the user's ran it: its deployment runs again (it said "rerun the same command")
    assert "; run its deployment again with the same parameters (`prefect deployment run`" in state.message


def test_a_fine_tuning_unit_stopped_with_its_flow_run_is_no_error() -> None:
    """A Ctrl-C, SIGTERM or Cancel in Prefect during fine-tuning: the units in flight stop with their
    workers (`UnitPool.stop`) and their task runs end Cancelled, which Prefect logs at ERROR; a
    stopped run prints no ERROR line (before: the units trained on to their end, then Completed)."""
    import logging

    from finetuning.fanout import UNITS_STOPPED
    from pipelines.prefect_logging import _StopNotCrash

    said = f"Finished in state Cancelled('fine-tuning unit rte-lr5e-05-s42 [tiny]: {UNITS_STOPPED}')"
    record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, said, None, None)
    assert _StopNotCrash().filter(record) and record.levelno == logging.INFO
    failed = logging.LogRecord(
        "prefect.task_runs", logging.ERROR, __file__, 1, "Finished in state Failed('x')", None, None
    )
    assert _StopNotCrash().filter(failed) and failed.levelno == logging.ERROR


def test_a_keepalive_ping_on_a_closed_api_connection_is_no_error_and_has_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kill -9 test's rerun ended, its flow done, with websockets' "keepalive ping failed" at
    ERROR and a ConnectionClosedError traceback, printed as the temporary API server stopped (a
    ping sent between the server's end and the connection's cleanup). Said at DEBUG without the
    traceback; another websockets error keeps both."""
    import logging
    import sys

    from websockets.exceptions import ConnectionClosedError, InvalidURI

    from pipelines.prefect_logging import WEBSOCKETS_CLIENT, install_log_filters

    install_log_filters()
    install_log_filters()  # idempotent
    logger = logging.getLogger(WEBSOCKETS_CLIENT)
    assert len(logger.filters) == len({type(f) for f in logger.filters})
    for error in (ConnectionClosedError(None, None), InvalidURI("ws://x", "no host")):
        try:
            raise error
        except Exception:
            with caplog.at_level(logging.DEBUG, logger=WEBSOCKETS_CLIENT):
                logging.LoggerAdapter(logger, {}).error("keepalive ping failed", exc_info=sys.exc_info())
    closed, other = caplog.records[-2:]
    assert closed.levelno == logging.DEBUG and closed.exc_info is None
    assert other.levelno == logging.ERROR and isinstance(other.exc_info[1], InvalidURI)
    try:
        raise ConnectionClosedError(None, None)
    except ConnectionClosedError:
        with caplog.at_level(logging.WARNING, logger=WEBSOCKETS_CLIENT):  # as Prefect configures it
            caplog.clear()
            logger.error("keepalive ping failed", exc_info=True)
    assert caplog.records == []  # Prefect's console handler, of no level, would print a DEBUG record


def test_a_deployment_run_cancelled_in_prefect_does_not_say_it_finished_running() -> None:
    """A Cancel in Prefect (the UI, `prefect flow-run cancel`) of a deployment's flow run: its log
    ended "Flow run was cancelled." then "Finished in state Running()", Prefect's engine logging the
    state it held, since the worker sets the final one (Cancelled) once the process is gone."""
    import logging

    from pipelines.prefect_logging import WORKER_SETS_STATE, _StopNotCrash

    def said(name: str, message: str) -> str:
        record = logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)
        _StopNotCrash().filter(record)
        return record.getMessage()

    assert said("prefect.flow_runs", "Finished in state Running()") == WORKER_SETS_STATE
    assert "sets the flow run Cancelled" in WORKER_SETS_STATE
    assert said("prefect.flow_runs", "Finished in state Completed()") == "Finished in state Completed()"


def test_a_flow_run_stopped_as_it_starts_is_cancelled_not_crashed() -> None:
    """Ctrl-C or SIGTERM in a flow run's first instant (Prefect's engine beginning it, before bertflow
    wrote its record): Prefect set it Crashed ("Crash detected!" at ERROR) and no record named it for
    `bertflow run` or the next flow run to set it Cancelled. The flow's on_crashed hook now does; a
    crash that is no stop stays Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from pipelines.flow import bert_pipeline
    from pipelines.prefect_killed_runs import cancel_a_stop_before_its_record
    from pipelines.prefect_logging import STOPS

    assert cancel_a_stop_before_its_record in bert_pipeline.on_crashed_hooks
    states = []
    with get_client(sync_client=True) as client:
        for said in (STOPS[0], "Execution was aborted by Python system exit call."):
            flow_run = client.create_flow_run(bert_pipeline, state=Crashed(message=said))
            cancel_a_stop_before_its_record(bert_pipeline, flow_run, flow_run.state)
            states.append(client.read_flow_run(flow_run.id).state)
    assert states[0].is_cancelled(), states[0]
    assert states[0].message.startswith(
        "bertflow: stopped on request (Ctrl-C) as it started, before any stage;"
    )
    assert states[1].is_crashed()
    # Prefect's lines around the hook, on every stop, said "Crashed": left out
    import logging

    from pipelines.prefect_logging import _StopNotCrash

    for said in (
        "Running hook 'cancel_a_stop_before_its_record' in response to entering state 'Crashed'",
        "Hook 'cancel_a_stop_before_its_record' finished running successfully",
    ):
        record = logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, said, None, None)
        assert not _StopNotCrash().filter(record)
