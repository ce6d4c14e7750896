"""Progress of a running preprocessing job, read from the files its workers leave behind: how many
input files are tokenized (one record per file under the work folder) and how many shards are
written, every `every` seconds, with the time left at the rate so far. A Beam job reports nothing
while it runs, and on a large corpus it runs for hours. The folders are listed through
`preprocessing.storage`, so this works on any runner whose work folder the driver can list: local,
a shared mount or an object store (a Dask cluster's `s3://` temp location).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common.progress import duration_text, eta_seconds
from preprocessing import storage

EVERY_S = 30.0


def files_read(work_dir: Path | str) -> int:
    """Input files tokenized so far: `stats/read-<file>.json`, else the files with doc chunks."""
    records = storage.match(storage.join(str(work_dir), "stats", "read-*.json"))
    if records:
        return len(records)
    chunks = storage.match(storage.join(str(work_dir), "docs", "*.arrow"))
    return len({storage.basename(p).rsplit("-", 1)[0] for p, _ in chunks})


def shards_written(work_dir: Path | str, out_dir: Path | str) -> int:
    entries = storage.match(storage.join(str(work_dir), "entries", "*.json"))
    if entries:
        return len(entries)
    return sum(
        len(storage.match(storage.join(str(out_dir), split, "shard-*.parquet")))
        for split in ("train", "validation")
    )


def progress_line(
    work_dir: Path | str, out_dir: Path | str, n_files: int, n_shards: int, elapsed: float
) -> str:
    """`n_shards`: the training shards and the one validation shard."""
    read, written = files_read(work_dir), shards_written(work_dir, out_dir)
    line = (
        f"preprocess: {duration_text(elapsed)}: {read}/{n_files} input files tokenized, "
        f"{written}/{n_shards} shards written ({n_shards - 1} training + 1 validation)"
    )
    if read >= n_files:  # the shuffle: no shard is done until its examples are all built
        return line + "; building the examples and writing the shards"
    # reading the corpus is most of the work: its rate is the estimate until the shards start
    left = eta_seconds(read, n_files, elapsed)
    return line + (f", about {duration_text(left)} left to read the corpus" if left else "")


@contextmanager
def watch_preprocess(
    work_dir: Path | str, out_dir: Path | str, n_files: int, n_shards: int, log: Callable[[str], None],
    every: float = EVERY_S,
) -> Iterator[None]:  # fmt: skip
    """Log a progress line every `every` seconds while the block runs (a listing that fails, e.g. an
    object store's hiccup, skips that line)."""
    stop = threading.Event()
    started = time.monotonic()

    def report() -> None:
        while not stop.wait(every):
            try:
                line = progress_line(work_dir, out_dir, n_files, n_shards, time.monotonic() - started)
            except OSError:  # (Beam's BeamIOError is one)
                continue
            log(line)

    thread = threading.Thread(target=report, name="preprocess-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
