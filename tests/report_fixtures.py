"""A run directory as the flow leaves it, for the tests of what reads one (the report, the
deployment's report artifact) without running the stages."""

from __future__ import annotations

import json
import math
from pathlib import Path

from common.atomic import write_marker
from common.tracking import Tracker, WandbTarget
from finetuning.scorecard import build_scorecard
from pipelines.config import PipelineConfig
from pipelines.stage_keys import stage_dirs
from tests.shard_fixtures import make_shards, make_tokenizer_dir


def _logged_rows(steps: int = 300) -> list[dict]:
    """Rows named as training/train.py logs them (training every 10 steps, held-out every 100)."""
    rows = []
    for step in range(10, steps + 1, 10):
        rows.append(
            {"step": step, "loss": 10.0 * math.exp(-step / 100) + 1, "mlm_loss": 9.0 * math.exp(-step / 100),
             "nsp_loss": 0.69, "mlm_acc": 0.3 * (1 - math.exp(-step / 150)), "nsp_acc": 0.6, "lr": 5e-4,
             "tokens_per_s": 11139.2, "samples_per_s": 114.4, "data_wait_fraction": 0.01, "memory_mb": 2010.0,
             "consumed_samples": step * 64}
        )  # fmt: skip
        if step % 100 == 0:
            rows.append({"step": step, "val_mlm_acc": 0.25, "val_mlm_loss": 5.0, "val_nsp_acc": 0.63})
    return rows


def _unit_result(label: str, checkpoint: str, kind: str, task: str, metrics: dict) -> dict:
    return {
        "unit": f"{task}-lr0.0001-s42", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": sum(metrics.values()) / len(metrics), "lr": 1e-4, "seed": 42, "checkpoint": checkpoint,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": True, "n_train": 100, "n_eval": 408,
        "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 9.0, "notes": {},
        "chance_metrics": {m: 50.0 for m in metrics},
    }  # fmt: skip


def make_stage_outputs(cfg: PipelineConfig, minilm_dir: Path, data_dir: Path) -> dict[str, Path]:
    """Complete tokenizer, preprocess, pretrain and finetune outputs where the flow looks for them
    for `cfg` (small real shards, a pretraining metrics log written through W&B, a model config and
    run spec, a scorecard of two fine-tuning results), as the report stage finds them after a run."""
    dirs = stage_dirs(cfg)
    tok = make_tokenizer_dir(minilm_dir, dirs["tokenizer"])
    make_shards(dirs["preprocess"], tok, data_dir, num_docs=200, max_seq_length=64)
    (dirs["preprocess"] / "stats.json").write_text(json.dumps({
        "examples": 180, "documents_used": {"train": 170, "validation": 30}, "is_next_ratio": 0.496,
        "masked_replacement_split": {"mask_token": 0.8, "random_token": 0.1, "unchanged": 0.1},
        "skipped": {"files_empty": 1}, "input_files": 2, "files_skipped": ["empty.txt"], "input_bytes": 3 * 2**20,
        "warnings": ["5 of 45 documents repeat an earlier one: deduplicate the corpus."],
    }))  # fmt: skip
    pre = dirs["pretrain"]
    tracker = Tracker(pre, WandbTarget(project="bertflow-test"), name="pretrain")
    for row in _logged_rows():
        step = row.pop("step")
        tracker.log(row, step=step)
    tracker.finish()
    (pre / "model").mkdir()
    (pre / "model" / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512,
         "vocab_size": 30522, "model_type": "bert"}
    ))  # fmt: skip
    (pre / "run_spec.json").write_text(json.dumps({
        "shards_dir": str(dirs["preprocess"]), "tokenizer_dir": str(tok), "world_size": 1,
        "pretrain": {"micro_batch_size": 8, "eval_batches": 2, "lr": 5e-4, "warmup_steps": 30, "max_steps": 300},
        "ds_config": {"train_batch_size": 64, "zero_optimization": {"stage": 2}},
    }))  # fmt: skip
    write_marker(pre, {"max_steps": 300})
    results = [
        _unit_result("abc/model", str(pre / "model"), "pretrained", "mrpc", {"accuracy": 70.0, "f1": 80.0}),
        _unit_result("random:tiny", "random:tiny", "random", "mrpc", {"accuracy": 60.0, "f1": 70.0}),
    ]
    build_scorecard(results, dirs["finetune"])
    for stage in ("tokenizer", "preprocess", "finetune"):
        write_marker(dirs[stage], {"stage": stage})
    return dirs
