"""Beam's start-up chatter, printed by its worker processes to the stderr they inherit, goes to a
log file; everything else a process writes to stderr still reaches the console."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.beam_console import quiet_beam


def test_chatter_goes_to_the_log_the_rest_to_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "beam.log"
    worker = (
        "import sys; "
        "sys.stderr.write('WARNING:root:apitools not found, and bigquery client libraries are not available\\n'); "
        "sys.stderr.write('INFO:__main__:Logging handler created.\\n'); "
        "sys.stderr.write('Traceback (most recent call last): a real worker error\\n')"
    )
    with quiet_beam(log):
        subprocess.run([sys.executable, "-c", worker], check=True)  # inherits fd 2, as Beam's workers do
        logging.getLogger("apache_beam.runners.portability.local_job_service").warning(
            'Worker: severity: WARN message: "Discarding unparseable args: [...]"'
        )
        print("our own progress line", file=sys.stderr)
    err = capfd.readouterr().err
    assert "a real worker error" in err and "our own progress line" in err
    assert "apitools" not in err and "Logging handler created" not in err and "Discarding" not in err
    text = log.read_text()
    assert (
        "apitools not found" in text
        and "Logging handler created." in text
        and "Discarding unparseable" in text
    )
    print("after the block", file=sys.stderr)  # stderr is the console again
    assert "after the block" in capfd.readouterr().err


@pytest.mark.parametrize("drop", [False, True])
def test_beams_import_time_warning_is_dropped_in_our_processes(drop: bool) -> None:
    code = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        + ("from pipelines.beam_console import drop_import_chatter; drop_import_chatter()\n" if drop else "")
        + "import apache_beam.io.gcp.internal.clients.bigquery\n"
        "logging.getLogger().warning('a real warning')\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "a real warning" in err
    assert ("apitools not found" in err) is not drop  # without the filter Beam does print it here


def test_beams_error_records_and_their_tracebacks_go_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A failing DoFn is logged by the worker and relayed by the driver (200+ lines for one full
    disk); the job raises that error, which the command reports once."""
    log = tmp_path / "beam.log"
    record = (
        "ERROR:apache_beam.runners.common:OSError: [Errno 28] No space left on device [while running 'X']\n"
        "Traceback (most recent call last):\n"
        '  File "storage.py", line 115, in write\n'
        "    self.raw.write(data)\n"
        "OSError: [Errno 28] No space left on device\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "storage.py", line 152, in _atomic_writer\n'
        "OSError: [Errno 28] No space left on device\n"
    )
    worker = f"import sys; sys.stderr.write({record!r} + 'WARNING:corpus:a.txt: a real warning\\n')"
    with quiet_beam(log):
        subprocess.run([sys.executable, "-c", worker], check=True)
        logging.getLogger("apache_beam.runners.portability.local_job_service").error(
            "Worker: severity: ERROR"
        )
    err = capfd.readouterr().err
    assert "a real warning" in err
    assert "Errno 28" not in err and "Traceback" not in err and "During handling" not in err, err
    text = log.read_text()
    assert text.count("No space left on device") == 3 and "Worker: severity: ERROR" in text


def test_the_tracebacks_of_an_interrupted_job_go_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C: each worker prints its KeyboardInterrupt tracebacks (two workers' lines interleave),
    then the driver's threads print theirs (~140 lines); the command says 'interrupted.' once. A
    traceback that ends in anything else, before the interrupt, still reaches the console."""
    log = tmp_path / "beam.log"
    frame = (
        '  File "sdk_worker.py", line 265, in run\n    for work_request in self._control_stub.Control():\n'
    )
    real_error = "Traceback (most recent call last):\n" + frame + "ValueError: a real error\n"
    worker = "CRITICAL:__main__:Python sdk harness failed: \nTraceback (most recent call last):\n" + frame
    transcript = (
        real_error + "our own line\n" + worker + worker + "KeyboardInterrupt\n" + frame + "KeyboardInterrupt\n"
        + "Exception in thread beam_control_read:\nTraceback (most recent call last):\n" + frame + "grpc.RpcError\n"
        + "Exception in thread run_worker:\nTraceback (most recent call last):\n" + frame
        + "RuntimeError: Worker subprocess exited with return code -2\n" + "our line after\n"
    )  # fmt: skip
    with quiet_beam(log):
        subprocess.run([sys.executable, "-c", f"import sys; sys.stderr.write({transcript!r})"], check=True)
    err = capfd.readouterr().err
    assert err == real_error + "our own line\n" + "our line after\n", err
    text = log.read_text()
    assert text.count("KeyboardInterrupt") == 2 and "grpc.RpcError" in text and "return code -2" in text


def test_the_flow_log_keeps_prefects_format_when_its_checks_import_beam(tmp_path: Path) -> None:
    """`bertflow run` checks the preprocess settings before Prefect starts, which imports Beam, whose
    import warning gave the root logger Python's default handler: Prefect then left its console
    unset and every flow line read `INFO:prefect.flow_runs:...`."""
    from common.paths import PROJECT_ROOT
    from pipelines.config import load_config

    sums = tmp_path / "SHA256SUMS"  # a corpus unlike its checksum stops the flow at its first stage
    sums.write_text(f"{'0' * 64}  {load_config(None).data_path('data:wiki/summaries_en.txt')}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", "--only", "verify", "--only",
         "tokenizer", "--only", "preprocess", "--set", f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled",
         "verify.checksums=true", f"verify.checksum_file={sums}"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "summaries_en.txt is corrupt" in said, said[-3000:]
    assert "| INFO    | Flow run '" in said and "INFO:prefect" not in said, said[-3000:]
