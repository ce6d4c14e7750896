"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """`preexec_fn` for subprocess.Popen (Linux): the child gets SIGTERM when the thread that
    started it ends, so even `kill -9` of its parent leaves no orphan. Start such children from
    the main thread (it lives as long as the process)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
