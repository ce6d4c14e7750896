"""Kept fine-tuned models (`finetune.save_models`): a unit's model as a Hugging Face directory.

A kept unit's directory holds `model/`: config.json (the transformers architecture of its task:
BertForSequenceClassification, BertForTokenClassification or BertForQuestionAnswering; the task's
id2label/label2id, num_labels, problem_type "regression" for scores), model.safetensors, the
tokenizer files and a model card (README.md: task, dev score, lr, seed, the checkpoint it started
from), written by `model.hf_io.write_hf_dir`, plus `predictions.jsonl` next to result.json (one row
per dev example: id, gold, prediction; a TSV task's also its `line`, `prediction_rows`), from which the
unit's dev score can be recomputed.

The setting is run-only (not in the unit key: it adds files, it changes no result). So a finished
unit made without it has no model; one that should be kept then trains again (its result is
rewritten by that training, so result.json, predictions.jsonl and model/ always come from one
training). `all` keeps every unit's model. `best` keeps, for each checkpoint and task, the units of
the lr the scorecard picks (best mean dev score over seeds), one per seed: the units that train
write their model, and once every unit is done the others' models are removed; a unit that became
the best lr later (after a sweep grew) and has no model trains again (`to_retrain`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.atomic import TMP_PREFIX, atomic_write_text, read_marker
from finetuning.config import FinetuneConfig
from finetuning.tasks import TaskSpec

if TYPE_CHECKING:  # torch is not imported before a command's arguments are read
    import torch

MODEL_DIR = "model"
PREDICTIONS_FILE = "predictions.jsonl"

# our task model class -> the transformers architecture with the same module names
ARCHITECTURES = {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "token_classification": "BertForTokenClassification",
    "span_extraction": "BertForQuestionAnswering",
}


def kept_model(out_dir: Path) -> Path | None:
    """The kept model of a finished unit directory, else None."""
    model = Path(out_dir) / MODEL_DIR
    if read_marker(out_dir) is None or not (model / "model.safetensors").is_file():
        return None
    return model


def missing_model(out_dir: Path, keep: bool) -> bool:
    """A unit that should keep its model (`keep`) but whose directory has none."""
    return keep and not (Path(out_dir) / MODEL_DIR / "model.safetensors").is_file()


def unit_complete(job: Any) -> bool:
    """Whether `job` has nothing left to do: finished, with its model where it keeps one."""
    return read_marker(job.out_dir) is not None and not missing_model(job.out_dir, job.keep_model)


def retrain_note(jobs: Iterable[Any], setting: str) -> str | None:
    """What to say before the units run when finished ones train again only to keep their model."""
    again = sum(read_marker(j.out_dir) is not None and missing_model(j.out_dir, j.keep_model) for j in jobs)
    if not again:
        return None
    return (
        f"{again} finished unit(s) have no kept model (finetune.save_models: {setting}; they were made "
        "without it) and train again to keep it; their results are rewritten by that training"
    )


def task_config(spec: TaskSpec) -> dict[str, Any]:
    """The config.json entries of a fine-tuned model of `spec` beyond the encoder's."""
    entries: dict[str, Any] = {"architectures": [ARCHITECTURES[spec.kind]], "finetuning_task": spec.name}
    if spec.kind == "regression":
        return {**entries, "num_labels": 1, "problem_type": "regression", "id2label": {"0": "score"}}
    if spec.labels:
        return {
            **entries,
            "num_labels": len(spec.labels),
            "id2label": {str(i): name for i, name in enumerate(spec.labels)},
            "label2id": {name: i for i, name in enumerate(spec.labels)},
            **({"problem_type": "single_label_classification"} if spec.kind == "classification" else {}),
        }
    return entries


def save_unit_model(
    model: torch.nn.Module,
    spec: TaskSpec,
    out_dir: Path,
    tokenizer_dir: Path,
    max_seq_length: int,
    result: dict[str, Any],
) -> Path:
    """Write `model` (a fine-tuned task model) as `out_dir/model/`, built under a temporary name
    and renamed into place, so a killed unit leaves no half-written model."""
    from model.hf_io import write_hf_dir

    final = Path(out_dir) / MODEL_DIR
    tmp = Path(out_dir) / f"{TMP_PREFIX}{MODEL_DIR}"
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf_dir(model, tmp, tokenizer_dir, model_max_length=max_seq_length, hf_config=task_config(spec))
    atomic_write_text(tmp / "README.md", model_card(spec, result))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def model_card(spec: TaskSpec, result: dict[str, Any]) -> str:
    """A short model card: what the model was fine-tuned on and how well it did."""
    metrics = ", ".join(
        f"{name} {'undefined' if value is None else f'{value:.2f}'}"
        for name, value in result["metrics"].items()
    )
    labels = f"labels: {', '.join(spec.labels)}" if spec.labels else f"kind: {spec.kind}"
    return "\n".join(
        [
            "---",
            "library_name: transformers",
            "---",
            "",
            f"# {result['checkpoint_label']} fine-tuned on {spec.name}",
            "",
            f"A `{ARCHITECTURES[spec.kind]}` fine-tuned by bertflow (unit `{result['unit']}`).",
            "",
            f"- task: {spec.name} ({labels})",
            f"- dev score: {metrics} on {result['n_eval']} dev examples (0-100; predictions.jsonl in the "
            "unit directory holds them)",
            f"- lr {result['lr']:g}, seed {result['seed']}, {result['epochs']:g} epochs over "
            f"{result['n_train']} training examples, batch {result['batch_size']}, "
            f"max_seq_length {result['max_seq_length']}",
            f"- started from: `{result['checkpoint']}`",
            "",
        ]
    )


def write_predictions(out_dir: Path, rows: Iterable[dict[str, Any]]) -> None:
    """`out_dir/predictions.jsonl`: one JSON object per dev example (id, gold, prediction)."""
    atomic_write_text(Path(out_dir) / PREDICTIONS_FILE, "".join(json.dumps(r) + "\n" for r in rows))


def prediction_rows(spec: TaskSpec, task: Any, per_feature: list[Any]) -> list[dict[str, Any]]:
    """The dev predictions of a unit by example, labels by name. Classification and regression:
    one row per example, `id` its 0-based position among the dev file's examples and `line` its
    line in the file (1-based, the header being line 1); SQuAD: one per question (`id` its question
    id, its gold answers, the predicted text); NER: one per sentence (`id` its 0-based position,
    gold and predicted tag per word, `task.word_tags`)."""
    if spec.kind in ("classification", "regression"):
        named = (lambda label: spec.labels[label]) if spec.kind == "classification" else (lambda v: v)
        rows = zip(task.dev_examples, task.eval_features, per_feature, strict=True)
        return [
            {"id": i, "line": ex.line, "gold": named(f["label"]), "prediction": named(p)}
            for i, (ex, f, p) in enumerate(rows)
        ]
    if spec.kind == "span_extraction":
        predicted = task.predictions(per_feature)
        return [{"id": ex.qid, "gold": list(ex.answers), "prediction": predicted[ex.qid]} for ex in task.dev]
    return [
        {"id": i, "words": list(words), "gold": list(tags), "prediction": predicted}
        for i, ((words, tags), predicted) in enumerate(
            zip(task.dev, task.word_tags(per_feature), strict=True)
        )
    ]


def retrain_best_note(count: int) -> str:
    return (
        f"{count} unit(s) of the best lr have no kept model (made without finetune.save_models, or not "
        "the best lr when they trained); training them again to keep it"
    )


def kept_models_note(jobs: Iterable[Any], setting: str) -> str | None:
    """The fine-tuned models the units keep now (`best`'s others removed), one directory a line, for
    the end of `bertflow finetune` and of the flow's units; None when none is kept."""
    kept = [job.out_dir / MODEL_DIR for job in jobs if kept_model(job.out_dir)]
    if not kept:
        return None
    shown = "\n  ".join(map(str, kept))
    return f"{len(kept)} fine-tuned model(s) kept (finetune.save_models: {setting}):\n  {shown}"


def removed_note(count: int) -> str:
    return f"removed the models of {count} unit(s) that are not the best lr"


def best_units(results: list[dict[str, Any]]) -> set[tuple[str, str, float]]:
    """(checkpoint label, task, lr) of the lr the scorecard picks for each checkpoint and task."""
    from finetuning.scorecard import best_per_task

    ok = [r for r in results if "error" not in r]
    best = set()
    for label in {r["checkpoint_label"] for r in ok}:
        for task, info in best_per_task([r for r in ok if r["checkpoint_label"] == label]).items():
            best.add((label, task, info["lr"]))
    return best


def wanted(cfg: FinetuneConfig, job: Any, best: set[tuple[str, str, float]]) -> bool:
    """Whether `job`'s model is to be kept under `cfg.save_models` (`best`: from `best_units`)."""
    if cfg.save_models == "all":
        return True
    return cfg.save_models == "best" and (job.label, job.unit.task, job.unit.lr) in best


def first_pass(cfg: FinetuneConfig, jobs: list[Any]) -> list[Any]:
    """The jobs as they first run: under `all` each keeps its model (a finished unit without one
    trains again); under `best` the units still to train keep theirs (which lr wins is known only
    once all are done)."""
    if cfg.save_models == "none":
        return jobs
    if cfg.save_models == "all":
        return [dataclasses.replace(j, keep_model=True) for j in jobs]
    return [dataclasses.replace(j, keep_model=read_marker(j.out_dir) is None) for j in jobs]


def to_retrain(
    cfg: FinetuneConfig,
    jobs: list[Any],
    results: list[dict[str, Any]],
    among: list[dict[str, Any]] | None = None,
) -> list[Any]:
    """Under `best`, once every unit is done: the best lr's units that have no model (made before,
    without the setting, or not the best when they trained), to train again keeping it. The best lr
    is chosen among `among` (default `results`; `bertflow finetune --unit`: the plan's finished units)."""
    if cfg.save_models != "best":
        return []
    best = best_units(results if among is None else among)
    return [
        dataclasses.replace(j, keep_model=True)
        for j, r in zip(jobs, results, strict=True)
        if "error" not in r and wanted(cfg, j, best) and missing_model(j.out_dir, True)
    ]


def prune(cfg: FinetuneConfig, jobs: list[Any], results: list[dict[str, Any]]) -> int:
    """Under `best`, remove the models of units that are not (or no longer) the best lr's; returns
    how many were. Their results and predictions stay."""
    if cfg.save_models != "best":
        return 0
    best = best_units(results)
    removed = 0
    for job in jobs:
        if not wanted(cfg, job, best) and (job.out_dir / MODEL_DIR).is_dir():
            shutil.rmtree(job.out_dir / MODEL_DIR)
            removed += 1
    return removed
