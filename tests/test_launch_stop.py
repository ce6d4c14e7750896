"""Stopping the pretraining launcher's process group (Ctrl-C, SIGTERM): the ranks get
`pretrain.stop_grace_s` to save the step they reached, from bertflow and from torchrun alike, and a
second interrupt kills them at once. The "ranks" here are real processes that take a set time to
save on SIGTERM, as training/stop_request.py does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

from common.errors import DEPLOYMENT_SIGTERM, Terminated
from training import launch

# on SIGTERM: "save" for argv[2] seconds into argv[1], then exit 143
SAVING_RANK = textwrap.dedent(
    """
    import os, signal, sys, time

    open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))

    def save(*_):
        time.sleep(float(sys.argv[2]))
        open(sys.argv[1], "w").write("saved")
        sys.exit(143)

    signal.signal(signal.SIGTERM, save)
    print("ready", flush=True)
    time.sleep(120)
    """
)


def start_group(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # torchrun prints its own lines first
        if line.strip().endswith("ready"):
            return proc
    raise AssertionError(f"the rank did not start (exit {proc.wait()})")


def rank(saved: Path, save_s: float) -> list[str]:
    return [sys.executable, "-c", SAVING_RANK, str(saved), str(save_s)]


def test_the_ranks_get_stop_grace_s_to_save_then_are_killed(tmp_path: Path) -> None:
    saved, lines = tmp_path / "saved", []
    proc = start_group(rank(saved, save_s=1))
    launch._stop_group(proc, lines.append, grace_s=30)
    assert proc.returncode == 143 and saved.read_text() == "saved"
    assert "up to 30 s" in lines[0] and "interrupt again" in lines[0]

    saved.unlink()
    proc = start_group(rank(saved, save_s=30))
    launch._stop_group(proc, lines.append, grace_s=1)
    assert proc.wait(timeout=5) == -signal.SIGKILL and not saved.exists()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def stop_with_a_second_interrupt(proc: subprocess.Popen) -> None:
    """`_stop_group` with bertflow's generous grace, cut short by a second Ctrl-C after 0.5 s."""
    previous = signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)  # the second Ctrl-C, while the ranks save
    try:
        with pytest.raises(KeyboardInterrupt):
            launch._stop_group(proc, lambda _: None, grace_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "stop,reason,flow_run_id",
    [
        (KeyboardInterrupt(), "Ctrl-C", None),
        (Terminated(), "SIGTERM to bertflow", None),
        (TerminationSignal(signal.SIGTERM), "SIGTERM to bertflow", None),  # in a flow: Prefect's own
        (TerminationSignal(signal.SIGTERM), DEPLOYMENT_SIGTERM, "0c7f6a1e-7c1d-4f1e-9a55-3f0f0b6a2d10"),
    ],
    ids=["ctrl-c", "sigterm", "sigterm-in-a-flow", "sigterm-in-a-deployment"],
)
def test_the_stop_line_names_what_the_user_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: BaseException, reason: str, flow_run_id: str | None
) -> None:
    """The ranks only see the SIGTERM bertflow passes on; after a Ctrl-C the log read as if someone
    had sent one. The launcher knows which it got and says so before the ranks' last lines (a
    SIGTERM to `bertflow run` read 'stopping (TerminationSignal in bertflow)'). A deployment's flow
    run (its worker sets PREFECT__FLOW_RUN_ID) stopped by a Cancel from Prefect read 'SIGTERM to
    bertflow', in the log and in `bertflow runs show`, though no bertflow command ran."""
    if flow_run_id:
        monkeypatch.setenv("PREFECT__FLOW_RUN_ID", flow_run_id)
    else:
        monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)

    def interrupt(*_: object) -> None:
        raise stop

    lines: list[str] = []
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # Ctrl-C (or SIGTERM) while the rank runs
    try:
        with pytest.raises(type(stop)):
            launch.run_launcher(rank(tmp_path / "saved", save_s=0), dict(os.environ), lines.append, 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert any(line.startswith(f"pretrain: stopping ({reason}); the ranks save") for line in lines), lines


def test_a_pretraining_stopped_in_a_deployment_says_to_run_its_deployment_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cancel in Prefect of a deployment's flow run during pretraining: the ranks' last line said
    "Rerun the same command to resume from it.", though no command of the user's started the run."""
    from pipelines.config import load_config
    from training.train import stopped_after

    pretrain = load_config(None, []).pretrain
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    said = str(stopped_after(pretrain, 30, tmp_path / "global_step30", 0.0))
    assert said.endswith("its checkpoint is saved (global_step30). Rerun the same command to resume from it.")
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "0c7f6a1e-7c1d-4f1e-9a55-3f0f0b6a2d10")
    said = str(stopped_after(pretrain, 30, tmp_path / "global_step30", 0.0))
    assert said.endswith(
        "(global_step30). Run its deployment again with the same parameters (`prefect deployment run`, "
        "or Run in the UI) to resume from it."
    )


def start_torchrun(tmp_path: Path, saved: Path, save_s: float, torchrun_grace_s: int) -> subprocess.Popen:
    """torchrun with one saving rank (which it starts in a session of its own)."""
    script = tmp_path / "rank.py"
    script.write_text(SAVING_RANK)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        f"--master_port={launch.free_port()}",
    ]
    # its own temp directory: torchrun leaves its `torchelastic_*` log tree there (bertflow's launch
    # gives it one, test_a_launch_leaves_nothing_in_the_temp_directory; this is torchrun alone)
    env = {**launch.child_env(1, False, torchrun_grace_s), "TMPDIR": str(tmp_path)}
    return start_group([*cmd, str(script), str(saved), str(save_s)], env=env)


def test_a_second_interrupt_kills_the_ranks_at_once(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    proc = start_group(rank(saved, save_s=30))
    stop_with_a_second_interrupt(proc)
    assert proc.wait(timeout=5) == -signal.SIGKILL and not saved.exists()


@pytest.mark.parametrize("grace_s,saves", [(2, False), (20, True)])
def test_torchrun_waits_stop_grace_s_before_it_kills_its_ranks(
    tmp_path: Path, grace_s: int, saves: bool
) -> None:
    """torchrun's own wait (30 s by default) follows the setting: a rank that needs 5 s to save
    is killed by torchrun after 2 s, and saves with 20 s (bertflow itself waits 60 s here)."""
    saved = tmp_path / "saved"
    proc = start_torchrun(tmp_path, saved, save_s=5, torchrun_grace_s=grace_s)
    launch._stop_group(proc, lambda _: None, grace_s=60)
    assert saved.exists() == saves


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("second_interrupt", [False, True])
def test_ranks_in_sessions_of_their_own_are_killed_too(tmp_path: Path, second_interrupt: bool) -> None:
    """torchrun starts each rank in a session of its own, out of reach of a signal to the launcher's
    group: when the grace ends (or a second Ctrl-C comes) the rank was left running, still writing
    into the output, which a rerun then shared. The rank is dead when `_stop_group` returns."""
    saved = tmp_path / "saved"
    proc = start_torchrun(tmp_path, saved, save_s=60, torchrun_grace_s=120)
    rank_pid = int(Path(f"{saved}.pid").read_text())
    assert os.getsid(rank_pid) != os.getsid(proc.pid)  # the reason a group signal missed it
    if second_interrupt:
        stop_with_a_second_interrupt(proc)
    else:
        launch._stop_group(proc, lambda _: None, grace_s=1)
    proc.wait(timeout=5)
    deadline = time.monotonic() + 5
    while _alive(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank_pid) and not saved.exists()


def test_a_launch_leaves_nothing_in_the_temp_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pretraining left torchrun's `torchelastic_*` log tree in /tmp (thousands on a machine
    that has run a while), and the ranks' imports (W&B's modules) folders of their own: the launcher
    and its ranks now get a temp directory of the launch's, removed when it ends."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    script = tmp_path / "rank.py"  # a rank that leaves a folder in its temp directory, as W&B's imports do
    script.write_text("import tempfile; print('rank tmp', tempfile.mkdtemp(), flush=True)\n")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=1",
        "--max_restarts=0",
        str(script),
    ]
    # a kill -9 of bertflow leaves its launch's folder: the next launch removes it once stale, and
    # never one of a live bertflow, nor one its killed bertflow's ranks may still be saving into
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    left = {name: tmp / f"bertflow-launch-{pid}-x{name}" for name, pid in (
        ("stale", dead.stdout.strip()), ("fresh", dead.stdout.strip()), ("alive", os.getpid()))}  # fmt: skip
    for name, path in left.items():
        (path / "torchelastic_x").mkdir(parents=True)
        if name != "fresh":
            os.utime(path, (time.time() - 7200, time.time() - 7200))
    lines: list[str] = []
    launch.run_launcher(cmd, launch.child_env(1, on_gpu=False, stop_grace_s=5), lines.append, stop_grace_s=5)
    [made] = [line.split("rank tmp ")[1] for line in lines if "rank tmp " in line]
    assert Path(made).parent.parent == tmp and Path(made).parent.name.startswith("bertflow-launch-"), lines
    assert sorted(tmp.iterdir()) == sorted([left["fresh"], left["alive"]]), list(tmp.iterdir())
