"""SIGTERM during the step loop: finish the step, save it, stop (what a preempted job needs).

A scheduler that takes the machine back (Slurm's preemption or time limit with `--signal`, a
Kubernetes eviction, a spot instance's notice), `kill PID`, Ctrl-C of `bertflow`: each sends the
ranks SIGTERM. Dying at once loses every step since the last periodic checkpoint. Instead the
handler only notes the signal; the note travels with the step's sums, which every rank reduces
anyway (`StepStats.stop_requests`, and `launcher_deaths` when a launcher died), so all ranks see it at
the same step, finish that step, save a checkpoint of it and stop with `PretrainingStopped`. A rerun resumes from that step, exactly.

Every SIGTERM only notes the request: a stop usually delivers two (the process group's, then
torchrun's own to its workers, milliseconds apart). A rank stuck in a collective whose peer is gone
never reaches the next step; the sender's SIGKILL after its grace period ends it (`bertflow` and
torchrun wait `pretrain.stop_grace_s`, DeepSpeed's launcher 30 s, Slurm its KillWait).
"""

from __future__ import annotations

import os
import signal
from types import FrameType, TracebackType

from common.errors import UserError


class PretrainingStopped(UserError):
    """The run stopped on request after saving the step it reached (exit 143, as SIGTERM's)."""

    exit_code = 143


# how a rank's stop after its launcher died begins (`training.launch` raises it as a TransientError)
LAUNCHER_DIED = "the launcher of the ranks"


class LauncherDied(PretrainingStopped):
    """The launcher died under the ranks (kill -9, the kernel's OOM killer) and they stopped as on
    SIGTERM, after saving the step they reached: a failure of the machine, which a flow retries."""


_launcher_died: list[int] = []  # its pid, once this rank's watch has seen it gone


def stop_when_launcher_dies() -> None:
    """kill -9 of the launcher alone: its ranks, in sessions of their own, get no signal. Each
    watches it (`common.child_process.watch_parent`) and, once it is gone, stops as on SIGTERM, its
    stop saying so (`stop_error`)."""
    from common.child_process import watch_parent

    launcher = os.getppid()

    def died() -> None:
        _launcher_died.append(launcher)
        os.kill(os.getpid(), signal.SIGTERM)

    watch_parent(launcher, died)


def launcher_died() -> bool:
    """This rank's launcher is gone (`stop_when_launcher_dies` saw it)."""
    return bool(_launcher_died)


def stop_error(nnodes: int, after: str, launcher_deaths: float = 0.0) -> PretrainingStopped:
    """The error of a stop (`after`: the step reached, its checkpoint and the way on). Every rank
    learns with the step's sums how many ranks saw their launcher die (`launcher_deaths`): a stop
    after a launcher died is said as such on every node, a TransientError for `training.launch`
    (until 2026-11-28 the other nodes said 'stopped by a stop request', which a flow does not retry)."""
    killed = (
        "(killed; the kernel's OOM killer does that when memory runs out: `dmesg` then says 'Killed process')"
    )
    if _launcher_died:
        return LauncherDied(
            f"{LAUNCHER_DIED} (pid {_launcher_died[0]}) died {killed}, so they stopped {after}"
        )
    if launcher_deaths:  # another node's (or this node's, seen by another rank first)
        where = f" on another of the {nnodes} nodes" if nnodes > 1 else ""
        return LauncherDied(f"{LAUNCHER_DIED}{where} died {killed}, so they stopped {after}")
    where = f" on one of the {nnodes} nodes" if nnodes > 1 else ""
    return PretrainingStopped(f"stopped by a stop request (Ctrl-C or SIGTERM{where}) {after}")


class StopRequest:
    """Within `with StopRequest() as stop:`, SIGTERM sets `stop.requested` instead of killing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: signal.Handlers | None = None

    def __enter__(self) -> StopRequest:
        self._previous = signal.signal(signal.SIGTERM, self._note)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
