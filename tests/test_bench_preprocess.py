"""The preprocess benchmark's profile (benchmarks/bench_preprocess.py): it runs the job's own DoFns
in one process, so it must keep working as the job changes (it once broke on a tokenizer call the
wrapper did not pass through)."""

from __future__ import annotations

import sys

from common.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))

from bench_preprocess import minilm_vocab, profile_split, wiki_files  # noqa: E402

STEPS = {
    "WordPiece encoding",
    "sentence splitting",
    "reading, packing, work files",
    "example creation (A/B pairs)",
    "masking",
    "Arrow/Parquet writing",
    "example stage: reading docs, building rows, counters",
    "merge: reading parts, sorting",
}


def test_profile_times_every_step_of_the_job_on_one_wikipedia_file(data_dir):
    seconds, total = profile_split(wiki_files(["AA"], 1), minilm_vocab())
    assert set(seconds) == STEPS
    assert all(spent > 0 for spent in seconds.values()), seconds
    assert sum(seconds.values()) <= total  # steps exclude each other's time, so they never add up to more
