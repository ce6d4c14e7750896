"""How ranks are counted and launched, without launching a run: hostfiles, world size, the
launcher chosen, the ranks' thread share, a launcher killed by a signal; and where W&B runs go."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from common.errors import UserError
from common.paths import PROJECT_ROOT
from common.tracking import Tracker, WandbTarget, read_metrics
from training import launch
from training.config import PretrainConfig


def test_a_hostfile_counts_every_hosts_slots_and_skips_comments(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(
        "# two nodes, the second with fewer GPUs\nnode-a slots=8\nnode-b slots=4  # older\n\n"
    )
    assert launch.hostfile_slots(hostfile) == 12
    assert launch.world_size(PretrainConfig(hostfile=str(hostfile))) == 12
    assert launch.world_size(PretrainConfig(num_processes=2, nnodes=3)) == 6  # without a hostfile


def test_auto_launches_a_hostfile_with_deepspeeds_runner_and_one_node_with_torchrun(tmp_path: Path) -> None:
    spec = tmp_path / "run_spec.json"
    with_hosts = launch.build_command("auto", 12, spec, 29500, hostfile="/etc/hosts12")
    assert (
        "deepspeed.launcher.runner" in with_hosts
        and with_hosts[with_hosts.index("--hostfile") + 1] == "/etc/hosts12"
    )
    assert "torch.distributed.run" in launch.build_command("auto", 2, spec, 29500)


def test_cpu_ranks_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert launch.child_env(4, on_gpu=False, stop_grace_s=30)["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting wins
    assert launch.child_env(4, on_gpu=False, stop_grace_s=30)["OMP_NUM_THREADS"] == "3"
    # the ranks do not log through the launching process's W&B service (it dies with a kill -9 of it)
    monkeypatch.setenv("WANDB_SERVICE", "3-1234-unix-/tmp/wandb-1234.sock")
    assert "WANDB_SERVICE" not in launch.child_env(4, on_gpu=False, stop_grace_s=30)


def test_a_launcher_killed_by_a_signal_is_a_failed_run() -> None:
    """An OOM killer's SIGKILL gives a negative exit code: not a success."""
    cmd = [
        sys.executable,
        "-c",
        "import os, signal; print('rank 0 started', flush=True); os.kill(os.getpid(), signal.SIGKILL)",
    ]
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="launcher exit code -9"):
        launch.run_launcher(cmd, dict(os.environ), lines.append, stop_grace_s=1)
    assert "rank 0 started" in lines


def test_a_failure_no_rank_explains_names_the_last_exception_printed() -> None:
    """A launch that failed without a rank's own error said only 'launcher exit code 1; see the log
    lines above', which a Prefect UI watcher does not have: the exception line that ended the
    launcher's or a rank's traceback is now in the message (and in Prefect's state)."""
    printed = "Traceback (most recent call last):\n  File x\ntorch.distributed.DistNetworkError: port: 4277, EADDRINUSE"
    with pytest.raises(
        RuntimeError, match=r"exit code 1\): torch.distributed.DistNetworkError: port: 4277, EADDRINUSE; "
    ):
        launch.run_launcher(_launcher_printing(printed), dict(os.environ), lambda _: None, stop_grace_s=1)


def _launcher_printing(text: str) -> list[str]:
    """A stand-in launcher command that prints `text` and exits 1, as torchrun or DeepSpeed's do."""
    return [sys.executable, "-c", f"import sys; print({text!r}, flush=True); sys.exit(1)"]


def test_what_a_launcher_or_its_ranks_say_when_ranks_or_nodes_are_lost_is_named() -> None:
    """The failures of a run across processes and nodes that are not a bug of bertflow's, each one
    paragraph with its fix: a rank that lost the others (a TransientError, which a flow retries),
    nodes that did not all join, a hostfile host without ssh (the user's to fix)."""
    from common.errors import TransientError, UserError
    from training.lost_ranks import LOST_PREFIX

    lost = f"rank 0: error: {LOST_PREFIX}: a collective timed out waiting for another rank (...)"
    with pytest.raises(TransientError, match="pretraining stopped: lost contact with the other ranks"):
        launch.run_launcher(_launcher_printing(lost), dict(os.environ), lambda _: None, stop_grace_s=1)
    # a rank's own error is the cause, whatever the others say after it
    both = f"rank 1: error: shard val-00000.parquet is damaged\n{lost}"
    with pytest.raises(UserError, match="pretraining stopped: shard val-00000.parquet is damaged$"):
        launch.run_launcher(_launcher_printing(both), dict(os.environ), lambda _: None, stop_grace_s=1)
    joined = "torch.distributed.DistStoreError: Timed out after 21 seconds waiting for clients. 1/2 clients joined."
    with pytest.raises(TransientError, match="did not start: only 1 of 2 nodes joined in 21 s.*--node-rank"):
        launch.run_launcher(_launcher_printing(joined), dict(os.environ), lambda _: None, stop_grace_s=1)
    ssh = "RuntimeError: Using hostfile at /h but host=node-7 was not reachable via ssh. If you are ..."
    with pytest.raises(UserError, match="pretrain.hostfile names host node-7.*`ssh node-7 true`.*--nnodes"):
        launch.run_launcher(_launcher_printing(ssh), dict(os.environ), lambda _: None, stop_grace_s=1)


def test_a_peer_failure_is_told_from_other_errors_and_names_the_way_on(tmp_path: Path) -> None:
    from training.lost_ranks import lost_ranks_message, peer_failure

    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39333."
    assert peer_failure(RuntimeError(gloo)) == "another rank closed its connection"
    assert peer_failure(RuntimeError("CUDA out of memory")) is None and peer_failure(ValueError(gloo)) is None
    (tmp_path / "checkpoints" / "global_step8").mkdir(parents=True)
    text = lost_ranks_message("x", 60, 2, tmp_path / "checkpoints")
    assert "rerun the same command on every node to resume from the newest checkpoint (global_step8)" in text
    assert "resume from the start (no checkpoint" in lost_ranks_message("x", 60, 1, tmp_path / "none")


def test_an_api_key_turns_only_the_default_offline_mode_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """A WANDB_API_KEY in the environment never uploads a run the config keeps local."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbTarget().resolved_mode() == "online"
    assert WandbTarget(mode="disabled").resolved_mode() == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")  # the environment's mode wins
    assert WandbTarget().resolved_mode() == "offline"


def test_a_disabled_tracker_writes_metrics_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode disabled: metrics.jsonl, no W&B files, and wandb is not imported (a GPU image may lack it)."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", None)  # importing it would raise ImportError
    tracker = Tracker(tmp_path, WandbTarget(mode="disabled"), name="n")
    tracker.log({"loss": 1.5}, 1)
    tracker.finish()
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "wandb_files").exists()


def _run_tracker_script(script: str, folder: Path) -> None:
    """`script` in a fresh process (W&B's service is per process) with `folder` as sys.argv[1],
    W&B in the offline mode the Trackers ask for (not the suite's WANDB_MODE)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    env.pop("WANDB_MODE", None)
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, env=env, timeout=180)


def test_a_finished_w_and_b_run_folder_holds_its_own_files_so_it_copies_alone(tmp_path: Path) -> None:
    """W&B links each run's logs/debug-core.log to its process's service log, which sits in the W&B
    cache of the first run that process made: a second output's run folder pointed into the first
    output's, and once that was moved or deleted, copying the second output failed on the link."""
    import shutil

    script = (
        "import sys; from pathlib import Path; from common.tracking import Tracker, WandbTarget\n"
        "for name in ('first', 'second'):\n"
        "    t = Tracker(Path(sys.argv[1]) / name, WandbTarget(mode='offline'), name=name)\n"
        "    t.log({'loss': 1.0}, 1)\n"
        "    t.finish()\n"
    )
    _run_tracker_script(script, tmp_path)
    logs = list((tmp_path / "second").glob("wandb_files/wandb/offline-run-*/logs"))
    assert logs and all(not p.is_symlink() for p in logs[0].iterdir())
    shutil.rmtree(tmp_path / "first")
    shutil.copytree(tmp_path / "second", tmp_path / "copy")  # nothing points outside it


def test_metrics_rows_carry_their_wall_time_and_a_replay_into_w_and_b_keeps_it(tmp_path: Path) -> None:
    """Each metrics.jsonl row carries its wall time (`_timestamp`, unix seconds, as in W&B). A resumed
    pretraining replays the rows before its checkpoint into its new W&B run: they were all stamped
    with the time of the replay, which collapsed W&B's wall-time charts; they keep their own now."""
    import time

    from tests.wandb_records import history

    script = (
        "import sys, time; from pathlib import Path\n"
        "from common.tracking import Tracker, WandbTarget, read_metrics\n"
        "first = Tracker(Path(sys.argv[1]) / 'first', WandbTarget(mode='offline'), name='first')\n"
        "first.log({'loss': 2.0}, 1)\n"
        "time.sleep(1.5)\n"
        "first.log({'loss': 1.0}, 2)\n"
        "first.finish()\n"
        "again = Tracker(Path(sys.argv[1]) / 'again', WandbTarget(mode='offline'), name='again')\n"
        "again.replay(read_metrics(Path(sys.argv[1]) / 'first'))\n"
        "again.finish()\n"
    )
    start = time.time()
    _run_tracker_script(script, tmp_path)
    rows = read_metrics(tmp_path / "first")
    assert [r["step"] for r in rows] == [1, 2] and start < rows[0]["_timestamp"] < rows[1]["_timestamp"] - 1
    for run in ("first", "again"):
        assert [(h["_step"], h["_timestamp"]) for h in history(tmp_path / run)] == [
            (r["step"], r["_timestamp"]) for r in rows
        ]


def test_a_hostfile_line_that_is_not_host_and_slots_is_refused(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=8\nnode-b 4\n")
    with pytest.raises(UserError, match="hostfile:2: expected 'HOSTNAME slots=N'"):
        launch.hostfile_slots(hostfile)


def test_shared_memory_buffers_of_runs_that_are_over_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    """DeepSpeed's CPU all-reduce buffers (67 MB of RAM per rank in /dev/shm) outlived every killed
    run: 311 of them, 20 GB, filled this machine's memory after a day of tests, until a `make run`
    stalled. Before each CPU launch this user's buffers that no process maps and that are older than
    a minute are removed; a mapped one (a live run's), a fresh one (a rank between creating and
    mapping it) and another user's stay."""
    import mmap
    import time

    uid = os.getuid()
    names = {
        "dead": f"{launch.SHM_BUFFER}_{uid}_127.0.0.1_29500_0",
        "live": f"{launch.SHM_BUFFER}_{uid}_127.0.0.1_29501_0",
        "fresh": f"{launch.SHM_BUFFER}_{uid}_127.0.0.1_29502_1",
        "other user": f"{launch.SHM_BUFFER}_{uid + 1}_127.0.0.1_29500_0",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"\0" * 4096)
    old = time.time() - 3600
    for key in ("dead", "live", "other user"):
        os.utime(tmp_path / names[key], (old, old))
    with open(tmp_path / names["live"], "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        assert launch.remove_stale_shm_buffers(tmp_path) == 4096
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")
