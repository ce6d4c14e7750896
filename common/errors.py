"""The one exception type for mistakes a user can fix (bad file, bad config, bad flag).

The CLI prints a UserError as one paragraph with no traceback and exits non-zero; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import os
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A problem with the user's input. The message names the file/key and says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, fix: str | None = None) -> None:
        parts = [message]
        if path is not None and str(path) not in message:
            parts.append(f"(file: {path})")
        if fix:
            parts.append(f"Fix: {fix}")
        super().__init__(" ".join(parts))


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """' (did you mean PREFIX+X?)' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


class TransientError(Exception):
    """A failure of the machines, not of the input (a node or rank lost or hung): said as one
    paragraph naming the way on, like a UserError, but a flow stage retries it (`flow.retries`)."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(f"{message} Fix: {fix}" if fix else message)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs (child
    processes stopped, the flow's end recorded); the CLI exits 143 (128 + SIGTERM)."""

    exit_code = 143


# what a SIGTERM is in a deployment's flow run: the process its worker started (PREFECT__FLOW_RUN_ID)
DEPLOYMENT_SIGTERM = "SIGTERM to the deployment's flow run: a Cancel in Prefect, or its worker or pod stopped"


def stop_request(exc: BaseException) -> str | None:
    """How the user stopped a command, when `exc` is such a stop: "SIGTERM to bertflow" (`Terminated`,
    or Prefect's flow engine's own TerminationSignal, which has the signal; in a deployment's flow run
    `DEPLOYMENT_SIGTERM`) or "Ctrl-C"; else None."""
    if isinstance(exc, Terminated) or getattr(exc, "signal", None) == signal.SIGTERM:
        return DEPLOYMENT_SIGTERM if os.environ.get("PREFECT__FLOW_RUN_ID") else "SIGTERM to bertflow"
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C"
    return None


def go_on_after_a_stop(deployment: bool | None = None) -> str:
    """How to go on from where a stop left off: "rerun the same command", or in a deployment's flow
    run (`deployment`; None: this process is one, PREFECT__FLOW_RUN_ID), which no command of the
    user's started, run its deployment again."""
    if deployment is None:
        deployment = bool(os.environ.get("PREFECT__FLOW_RUN_ID"))
    if deployment:
        return (
            "run its deployment again with the same parameters (`prefect deployment run`, or Run in the UI)"
        )
    return "rerun the same command"


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler (`signal.signal(signal.SIGTERM, raise_terminated)`)."""
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises `Terminated`, so a command unwinds as on Ctrl-C (its children are
    stopped, pretraining ranks save the step they reached); the previous handler after."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
