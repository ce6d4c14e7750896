"""Progress lines: done/total, elapsed, and the time left at the rate so far."""

from __future__ import annotations

import time

from common.progress import Progress, duration_text, eta_seconds


def test_eta_at_the_rate_so_far() -> None:
    assert eta_seconds(0, 10, 5.0) is None  # nothing done: no estimate
    assert eta_seconds(4, 10, 60.0) == 90.0
    assert eta_seconds(10, 10, 60.0) == 0.0


def test_progress_line_and_durations() -> None:
    progress = Progress(10, "units", start=time.monotonic() - 120.0)  # started two minutes ago
    line = progress.step(4)
    assert line.startswith("4/10 units done, 2 min 00 s elapsed, about 3 min 00 s left"), line
    progress.done = 9
    assert progress.step().startswith("10/10 units done") and "left" not in progress.line()
    assert [duration_text(s) for s in (12.34, 245, 7620)] == ["12.3 s", "4 min 05 s", "2 h 07 min"]
