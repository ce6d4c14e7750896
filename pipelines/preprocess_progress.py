"""Progress of a running preprocessing job, read from the files its workers leave behind: how many
input files are tokenized (one record per file under the work folder) and how many shards are
written, every `every` seconds, with the time left at the rate so far. A Beam job reports nothing
while it runs, and on a large corpus it runs for hours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common.progress import duration_text, eta_seconds

EVERY_S = 30.0


def files_read(work_dir: Path) -> int:
    """Input files tokenized so far: `stats/read-<file>.json`, else the files with doc chunks."""
    records = list((work_dir / "stats").glob("read-*.json"))
    if records:
        return len(records)
    return len({p.name.rsplit("-", 1)[0] for p in (work_dir / "docs").glob("*.arrow")})


def shards_written(work_dir: Path, out_dir: Path) -> int:
    entries = list((work_dir / "entries").glob("*.json"))
    if entries:
        return len(entries)
    return sum(1 for split in ("train", "validation") for _ in (out_dir / split).glob("shard-*.parquet"))


def progress_line(work_dir: Path, out_dir: Path, n_files: int, n_shards: int, elapsed: float) -> str:
    read, written = files_read(work_dir), shards_written(work_dir, out_dir)
    line = (
        f"preprocess: {duration_text(elapsed)}: {read}/{n_files} input files tokenized, "
        f"{written}/{n_shards} shards written"
    )
    # reading the corpus is most of the work: its rate is the estimate until the shards start
    left = eta_seconds(read, n_files, elapsed) if read < n_files else None
    return line + (f", about {duration_text(left)} left to read the corpus" if left else "")


@contextmanager
def watch_preprocess(
    work_dir: Path | str, out_dir: Path | str, n_files: int, n_shards: int, log: Callable[[str], None],
    every: float = EVERY_S,
) -> Iterator[None]:  # fmt: skip
    """Log a progress line every `every` seconds while the block runs (local folders only)."""
    if "://" in f"{work_dir}{out_dir}":
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def report() -> None:
        while not stop.wait(every):
            log(progress_line(Path(work_dir), Path(out_dir), n_files, n_shards, time.monotonic() - started))

    thread = threading.Thread(target=report, name="preprocess-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
