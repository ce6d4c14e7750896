"""Progress of countable work for logs (not a terminal bar): how much is done, for how long, and
about how long is left at the rate so far. Used where work is long: the fine-tuning units, the
pretraining steps, the preprocessing job."""

from __future__ import annotations

import time


def duration_text(seconds: float) -> str:
    """12.3 s · 4 min 05 s · 2 h 07 min."""
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 90:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def eta_seconds(done: float, total: float, elapsed: float) -> float | None:
    """Time left at the average rate so far; None before anything is done."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return elapsed * (total - done) / done


class Progress:
    """`done` of `total` items since construction; `line()` says it in words."""

    def __init__(self, total: int, what: str, start: float | None = None) -> None:
        self.total, self.what = total, what
        self.started = time.monotonic() if start is None else start
        self.done = 0

    def step(self, n: int = 1) -> str:
        self.done += n
        return self.line()

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        text = f"{self.done}/{self.total} {self.what} done, {duration_text(elapsed)} elapsed"
        left = eta_seconds(self.done, self.total, elapsed)
        if left is not None and self.done < self.total:
            text += f", about {duration_text(left)} left"
        return text
