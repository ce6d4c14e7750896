"""When a rank loses the others: which collective failures mean a peer died, hung or was stopped,
and the one paragraph that says so.

A rank whose collective fails this way prints `rank R: error: lost contact with ...` (the same text
on every rank, so the launcher shows it once) instead of a traceback, and `training.launch` raises
it as a `TransientError`: one paragraph naming the way on, retried by a flow stage. Each collective
waits at most `pretrain.dist_timeout_s` (`training.train.time_out_every_group`), and nodes wait as
long for each other at the start (`training.launch.build_command`).
"""

from __future__ import annotations

from pathlib import Path

LOST_PREFIX = "lost contact with the other ranks"

# text of torch's gloo / NCCL / store errors -> what happened, in a user's words
PEER_FAILURES: tuple[tuple[str, str], ...] = (
    ("Timed out waiting", "a collective timed out waiting for another rank"),
    ("collective operation timeout", "a collective timed out waiting for another rank"),
    ("Connection closed by peer", "another rank closed its connection"),
    ("Connection reset by peer", "another rank's connection was reset"),
    ("Broken pipe", "another rank's connection broke"),
    ("NCCL communicator was aborted", "the NCCL communicator was aborted"),
)


def peer_failure(exc: BaseException) -> str | None:
    """What a collective's error says happened to the other ranks; None for any other error."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    return next((what for marker, what in PEER_FAILURES if marker in text), None)


def lost_ranks_message(what: str, timeout_s: float, nnodes: int, checkpoints_dir: Path) -> str:
    """The paragraph a rank prints when `peer_failure` named `what`."""
    from training import checkpoint  # torch: not for the launcher's import of LOST_PREFIX

    tags = checkpoint.tag_dirs(checkpoints_dir)
    resume = f"the newest checkpoint ({tags[0].name})" if tags else "the start (no checkpoint was saved yet)"
    logs = "the other ranks' lines and the other nodes' logs" if nnodes > 1 else "the other ranks' lines"
    rerun = "the same command on every node" if nnodes > 1 else "the same command"
    return (
        f"{LOST_PREFIX}: {what} (a rank or node died, hung or was stopped, or the network dropped; "
        f"a collective waits at most pretrain.dist_timeout_s, {timeout_s:g} s). Fix: see which in "
        f"{logs} (OUT/launcher.log), then rerun {rerun} to resume from {resume}."
    )
