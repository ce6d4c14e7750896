"""Preprocessing progress from the files its workers leave: input files tokenized, shards written,
reported while the job runs."""

from __future__ import annotations

import time
from pathlib import Path

from pipelines.preprocess_progress import progress_line, watch_preprocess


def test_progress_lines_while_the_job_runs(tmp_path: Path) -> None:
    work, out = tmp_path / "_work", tmp_path
    (work / "stats").mkdir(parents=True)
    (work / "entries").mkdir()
    lines: list[str] = []
    with watch_preprocess(work, out, n_files=4, n_shards=3, log=lines.append, every=0.05):
        (work / "stats" / "read-a.json").write_text("{}")  # a worker finished its first file
        deadline = time.monotonic() + 30
        while not any("1/4" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "1/4 input files tokenized, 0/3 shards written" in lines[-1]
    assert "left to read the corpus" in lines[-1]
    count = len(lines)
    time.sleep(0.2)
    assert len(lines) == count  # the reporter was stopped and joined with the block


def test_counts_from_doc_chunks_and_shard_files(tmp_path: Path) -> None:
    work = tmp_path / "_work"
    (work / "docs").mkdir(parents=True)
    for name in ("f0-00000.arrow", "f0-00001.arrow", "f1-00000.arrow"):
        (work / "docs" / name).write_bytes(b"")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "shard-00000-of-00002.parquet").write_bytes(b"")
    line = progress_line(work, tmp_path, n_files=2, n_shards=3, elapsed=12.0)
    # all read: the line says what the job does now (it looked stalled for minutes on a large corpus)
    assert line == (
        "preprocess: 12.0 s: 2/2 input files tokenized, 1/3 shards written (2 training + 1 validation); "
        "building the examples and writing the shards"
    )


def test_the_command_shows_the_jobs_log_lines(tmp_path: Path, minilm_dir: Path) -> None:
    """`bertflow preprocess` prints the job's INFO lines, where the progress lines go: Beam's import
    had given the root logger Python's default handler (WARNING and up), so the command's own
    console log was never set up and only the closing line appeared."""
    from tests.test_preprocess import cli

    (tmp_path / "a.txt").write_text("One sentence here. And another one.\n\nA second document. It ends.\n")
    out = tmp_path / "o"
    r = cli(
        "preprocess", "--input", str(tmp_path / "a.txt"), "--vocab", str(minilm_dir), "--output", str(out)
    )
    assert r.returncode == 0, r.stderr
    assert " bertflow.preprocess: preprocess: 1 file(s), " in r.stderr, r.stderr
    assert f" bertflow.preprocess: wrote {r.stdout.split()[1]} examples " in r.stderr, r.stderr
