"""The largest micro batch that fits: one DeepSpeed engine as the pretraining stage builds it, fed
ever larger batches of the longest carried examples (the worst case for memory).

    python benchmarks/gpu_batch_probe.py --shards DIR --tokenizer DIR --preset base \
        --precision bf16 --zero-stage 2 --candidates 64,128,256,512,1024 --result probe.json

The model, optimizer, scheduler and DeepSpeed JSON come from the stage's own code
(`training.preflight.build_spec`, `training.train.build_model`, `training.optim`) for one process.
Candidates run in ascending order, `--steps` full training steps each; the probe stops at the first
out-of-memory error, or before a candidate whose peak memory, extrapolated linearly from the last
two, would pass `--memory-fraction` of the device. It runs in its own process so that every byte
it allocated is returned before the stage starts. Writes JSON: rows (micro batch, peak GB,
samples/s of the probe steps, or the error) and `chosen`, the largest that ran within the fraction.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def longest_examples(store, count: int):
    """Indices of the `count` longest examples (ties by index), cycled if there are fewer."""
    import numpy as np

    lengths = store.offsets[1:] - store.offsets[:-1]
    order = np.argsort(-lengths, kind="stable")
    return np.resize(order, count)


def peak_gb(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def total_gb(device) -> float:
    import psutil
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return psutil.virtual_memory().total / 2**30


def probe(args: argparse.Namespace) -> dict:
    import deepspeed
    import torch

    from common.tracking import WandbTarget
    from pipelines.config import load_config
    from training import preflight
    from training.build_ops import leave_out_cpu_inference_op
    from training.data import collate, load_split
    from training.launch import free_port
    from training.optim import build_optimizer, build_scheduler
    from training.train import build_model

    on_gpu = torch.cuda.is_available()
    bf16_ok = bool(on_gpu and torch.cuda.is_bf16_supported())
    candidates = sorted(int(c) for c in args.candidates.split(","))
    cfg = load_config(
        None,
        [f"model.preset={args.preset}", "pretrain.num_processes=1", f"pretrain.zero_stage={args.zero_stage}",
         f"pretrain.precision={args.precision}", f"pretrain.micro_batch_size={candidates[0]}"],
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="batch-probe-") as tmp:
        spec = preflight.build_spec(
            cfg,
            Path(args.shards),
            Path(args.tokenizer),
            Path(tmp),
            on_gpu,
            bf16_ok,
            1,
            WandbTarget(mode="disabled"),
        )
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    leave_out_cpu_inference_op()
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    pcfg = spec.pretrain
    store = load_split(args.shards, "train")
    model = build_model(spec.bert_config, pcfg, resuming=False, store=store)
    optimizer = build_optimizer(model, pcfg.optimizer, pcfg.lr, pcfg.weight_decay, on_gpu=on_gpu)
    scheduler = build_scheduler(optimizer, pcfg.warmup_steps, 10**6)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=spec.ds_config)  # fmt: skip
    if spec.zero_stage == 0:
        engine.enable_backward_allreduce = False  # as the stage does with one process
    limit = args.memory_fraction * total_gb(device)
    rows: list[dict] = []
    for micro in candidates:
        if len(rows) >= 2 and "peak_gb" in rows[-1] and "peak_gb" in rows[-2]:
            a, b = rows[-2], rows[-1]
            slope = (b["peak_gb"] - a["peak_gb"]) / (b["micro_batch"] - a["micro_batch"])
            predicted = b["peak_gb"] + slope * (micro - b["micro_batch"])
            if predicted > limit:
                rows.append(
                    {"micro_batch": micro, "skipped": f"predicted {predicted:.1f} GB > {limit:.1f} GB"}
                )
                break
        batch = collate(store, longest_examples(store, micro))
        batch = {k: v.to(device) for k, v in batch.items()}
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
        try:
            seconds = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                engine.backward(engine(**batch).loss)
                engine.step()
                if on_gpu:
                    torch.cuda.synchronize(device)
                seconds.append(time.perf_counter() - t0)
        except torch.cuda.OutOfMemoryError as exc:
            rows.append({"micro_batch": micro, "error": f"out of memory: {str(exc).splitlines()[0][:200]}"})
            break
        best = min(seconds[1:] or seconds)
        rows.append({"micro_batch": micro, "peak_gb": peak_gb(device), "samples_per_s": micro / best,
                     "seq": int(batch["input_ids"].shape[1])})  # fmt: skip
    fitting = [r["micro_batch"] for r in rows if "peak_gb" in r and r["peak_gb"] <= limit]
    return {"rows": rows, "chosen": max(fitting) if fitting else None, "memory_limit_gb": limit,
            "device_memory_gb": total_gb(device), "zero_stage": spec.zero_stage,
            "precision": args.precision}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--precision", required=True)
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--candidates", required=True, help="comma-separated micro batch sizes")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--memory-fraction", type=float, default=0.9)
    ap.add_argument("--result", required=True, help="write the JSON here")
    args = ap.parse_args()
    Path(args.result).write_text(json.dumps(probe(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
