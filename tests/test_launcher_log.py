"""The ranks' output in the log: lines about the run at INFO, DeepSpeed's and torch's talk about
themselves at DEBUG, every line kept in launcher.log; and where DeepSpeed's GPU ops are compiled."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from common.paths import PROJECT_ROOT, torch_extensions_dir
from pipelines.launcher_log import LauncherLog

# lines as a 2-rank CPU run prints them (torch 2.13, DeepSpeed 0.19)
RANK_OUTPUT = """\
[2026-11-22 21:30:26,607] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.
DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully
data cache ready in 0.7s: /tmp/pt/data_cache/vm
ready to train after 9.4s: 15754 examples, world 2, global batch 32, 492 steps/epoch, fp32, ZeRO 2, start step 0
/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
  return func(*args, **kwargs)
step 2/4 loss 9.7161 mlm_acc 0.000 lr 1.00e-05 7543 tok/s data_wait 0.2%

[2026-11-22 21:30:40,001] [ERROR] [engine.py:10:step] something real went wrong
Loading checkpoint shards: 100%|██████████| 2/2 [00:00<00:00, 306.85it/s]
wrote the final model to /tmp/pt/model (from global_step4)
"""


def test_run_lines_at_info_self_talk_at_debug_all_in_the_file(tmp_path: Path) -> None:
    info: list[str] = []
    debug: list[str] = []
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    for line in RANK_OUTPUT.splitlines():
        log(line)
    log.close()
    assert [line.split(":")[0].split(" ")[0] for line in info] == [
        "data",
        "ready",
        "step",
        "[2026-11-22",
        "wrote",
    ]
    assert "[ERROR]" in info[3]  # errors stay visible
    assert len(debug) == 5 and any("FutureWarning" in d for d in debug) and "  return func" in debug[3]
    assert (tmp_path / "launcher.log").read_text() == RANK_OUTPUT


def test_deepspeeds_errors_and_critical_lines_stay_visible(tmp_path: Path) -> None:
    info: list[str] = []
    log = LauncherLog(info.append, None, tmp_path / "launcher.log")
    for level in ("INFO", "WARNING", "ERROR", "CRITICAL"):
        log(f"[2026-11-22 21:30:40,001] [{level}] [engine.py:10:step] a {level.lower()} line")
    log.close()
    assert [line.split("] [")[1] for line in info] == ["ERROR", "CRITICAL"]


def test_the_compiled_op_lives_outside_the_checkout_one_per_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = torch_extensions_dir()
    assert directory.parent == tmp_path / "bertflow" / "torch_extensions"  # outside the checkout
    assert not directory.is_relative_to(PROJECT_ROOT)
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    assert directory.name.startswith(f"{python}-torch{metadata.version('torch')}-")  # per Python and torch
    assert torch_extensions_dir() == directory  # stable: the next run finds the built op
    # another environment (a second venv, or the same one reached through a symlink) compiles with
    # other include paths, so it gets its own folder instead of rebuilding this one's op
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    assert torch_extensions_dir() != directory


def test_torchruns_report_of_a_rank_that_reported_its_error_is_debug(tmp_path: Path) -> None:
    info: list[str] = []
    debug: list[str] = []
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    lines = [
        "step 4/8 loss 6.6993",
        "rank 0: error: the disk is full: no space left to write /out/checkpoints/global_step4",
        "E1122 23:55:37.607000 7707 /venv/torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        "(exitcode: 2) local_rank: 0 (pid: 7710) of binary: /venv/bin/python",
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "training.train FAILED",
    ]
    for line in lines:
        log(line)
    log.close()
    assert info == lines[:2] and debug == lines[2:]
    # a failure without a rank's error line (a crash): torchrun's report stays visible
    info.clear()
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    log(lines[2])
    log.close()
    assert info == [lines[2]]


def test_an_error_every_rank_printed_is_shown_once(tmp_path: Path) -> None:
    """A NaN loss is all-reduced, so every rank stops with the same paragraph: it was shown once per
    rank, then by Prefect and the CLI. Another rank's own error stays visible."""
    info: list[str] = []
    debug: list[str] = []
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    nan = "loss is nan at step 85; stopping before the update is applied (last good checkpoint: ...)"
    lines = [f"rank 0: error: {nan}", f"rank 1: error: {nan}", "rank 1: error: shard X is damaged"]
    for line in lines:
        log(line)
    log.close()
    assert info == [lines[0], lines[2]] and debug == [lines[1]]
    assert (tmp_path / "launcher.log").read_text().splitlines()[-3:] == lines  # the file keeps each


def test_torchruns_talk_after_a_stop_signal_is_debug_the_ranks_last_lines_info(tmp_path: Path) -> None:
    info: list[str] = []
    debug: list[str] = []
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    torchrun = [
        "W1125 10:14:17.386000 13193 /venv/torch/distributed/elastic/agent/server/api.py:753] Received 15 "
        "death signal, shutting down workers",
        "W1125 10:14:17.388000 13193 /venv/torch/distributed/elastic/multiprocessing/api.py:1028] Sending "
        "process 13197 closing signal SIGTERM",
    ]
    ranks = [
        "saved checkpoint /out/checkpoints/global_step36",
        "rank 0: error: stopped by a stop request (Ctrl-C or SIGTERM) after step 36 of 300; its checkpoint is saved (global_step36). "
        "Rerun the same command to resume from it.",
    ]
    traceback = [
        "Traceback (most recent call last):",
        '  File "/venv/torch/distributed/elastic/agent/server/api.py", line 923, in _invoke_run',
        "    time.sleep(monitor_interval)",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 13193 got signal: 15",
    ]
    for line in ["step 30/300 loss 7.7058", *torchrun, *ranks, *traceback]:
        log(line)
    log.close()
    assert info == ["step 30/300 loss 7.7058", *ranks]
    assert debug == torchrun + traceback
    # the signal cut a rank's progress line short: torchrun's warning follows it on the same line
    # (seen in a test run: its traceback then reached the console)
    info.clear()
    debug.clear()
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    cut = "step 16/2000 loss 7.1452 ETA 43.0 s" + torchrun[0]
    for line in [cut, *torchrun[1:], *ranks, *traceback]:
        log(line)
    log.close()
    assert info == [cut, *ranks] and debug == torchrun[1:] + traceback
    # before any stop signal, a traceback is not hidden (a rank's crash)
    info.clear()
    log = LauncherLog(info.append, debug.append, tmp_path / "launcher.log")
    for line in traceback:
        log(line)
    log.close()
    assert info == traceback


def test_a_launchers_traceback_that_bertflow_explains_stays_in_the_file_others_are_shown(
    tmp_path: Path,
) -> None:
    """DeepSpeed's launcher without ssh to the hostfile's host, or torchrun's rendezvous timeout:
    bertflow ends with its own paragraph, so their chained tracebacks go to launcher.log only; a
    rank's traceback, a bug, is shown whole, chained part included."""
    explained = """\
Traceback (most recent call last):
  File "runner.py", line 489, in main
    subprocess.check_call(safe_ssh_cmd)
subprocess.CalledProcessError: Command '['ssh', 'localhost', 'hostname']' returned non-zero exit status 255.

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "runner.py", line 491, in main
RuntimeError: Using hostfile at /h but host=localhost was not reachable via ssh. If you are running ...
"""
    bug = """\
Traceback (most recent call last):
  File "train.py", line 1, in <module>
KeyError: 'x'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train.py", line 2, in <module>
ValueError: bad
step 3/4 loss 7.1
"""
    info: list[str] = []
    log = LauncherLog(info.append, None, tmp_path / "launcher.log")
    for line in (explained + bug).splitlines():
        log(line)
    log.close()
    assert info == [line for line in bug.splitlines() if line.strip()]
    assert (tmp_path / "launcher.log").read_text() == explained + bug
