"""Units of fine-tuning work: one per (task, lr, seed) and checkpoint, each runnable alone, each
with its own result file. A unit whose completion marker exists is never recomputed.

`finetuning/fanout.py` plans the units (`Job`: what to run and where) and runs them in worker
processes; `run_finetune_unit` is what one worker does with one job.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.atomic import (
    MARKER_NAME,
    TMP_PREFIX,
    atomic_write_json,
    read_marker,
    remove_temp_files,
    write_marker,
)
from common.dir_lock import exclusive_dir
from common.errors import UserError, did_you_mean
from common.tracking import METRICS_FILE, Tracker, WandbTarget
from common.version import source_digests
from finetuning.config import UNIT_CODE, FinetuneConfig
from finetuning.keep import (
    MODEL_DIR,
    PREDICTIONS_FILE,
    missing_model,
    prediction_rows,
    save_unit_model,
    write_predictions,
)
from finetuning.tasks import TASK_CONFIG, TaskSpec, get_task, load_task_specs
from finetuning.trainer import TrainStats, predict, train
from model.config import BertConfig
from preprocessing.wordpiece import load_tokenizer, pad_id

RESULT_FILE = "result.json"


@dataclass(frozen=True, order=True)
class FinetuneUnit:
    task: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task}-lr{self.lr:g}-s{self.seed}"


@dataclass(frozen=True)
class Job:
    """One unit of one checkpoint, as planned by `finetuning.fanout.plan`."""

    unit: FinetuneUnit
    checkpoint: str  # normalized (finetuning.checkpoints.normalize_checkpoint)
    label: str  # the checkpoint's name in the scorecard and in the unit's W&B run
    tokenizer_dir: Path
    out_dir: Path  # ROOT/units/<unit>__<label>-<key>
    key: str  # digest of everything that determines the result
    # random:DIR only: the key without DIR's path and weights (a random model takes DIR's
    # architecture alone), shared by the units of every DIR of that architecture
    random_init_key: str | None = None
    # keep the fine-tuned model in out_dir/model/ (finetuning/keep.py); a finished unit without
    # one trains again
    keep_model: bool = False

    @property
    def name(self) -> str:
        return f"{self.unit.name} [{self.label}]"


def failed_result(job: Job, error: str, *, bad_input: bool = False) -> dict[str, Any]:
    """A unit's failure; `bad_input`: a UserError (the flow does not retry it, as it would a lost
    worker)."""
    failed = {"unit": job.unit.name, "task": job.unit.task, "checkpoint_label": job.label, "error": error}
    return {**failed, "bad_input": True} if bad_input else failed


def finetune_units(cfg: FinetuneConfig) -> list[FinetuneUnit]:
    """One unit per (task, lr, seed) in config order. Unknown task names are a UserError."""
    specs = load_task_specs(cfg.task_config)
    unknown = [t for t in cfg.tasks if t not in specs]
    if unknown:
        named = ", ".join(f"{t!r}{did_you_mean(t, specs)}" for t in unknown)
        raise UserError(
            f"{cfg.tasks_from}: unknown task(s) {named}.",
            fix=f"use some of {', '.join(sorted(specs))}, or define them in a task file ({TASK_CONFIG}).",
        )
    if not cfg.tasks:
        raise UserError("no tasks to run.", fix="name at least one task, e.g. --tasks sst2.")
    return [FinetuneUnit(t, float(lr), int(s)) for t in cfg.tasks for lr in cfg.lrs for s in cfg.seeds]


def find_unit(cfg: FinetuneConfig, name: str) -> FinetuneUnit:
    units = {u.name: u for u in finetune_units(cfg)}
    if name not in units:
        raise UserError(
            f"no unit named {name!r} in this configuration.", fix=f"use one of {', '.join(units)}."
        )
    return units[name]


def _task_class(spec: TaskSpec):
    if spec.format == "tsv":
        from finetuning.glue import SequenceTask

        return SequenceTask
    if spec.format == "conll":
        from finetuning.ner import TokenTask

        return TokenTask
    from finetuning.squad import SquadTask

    return SquadTask


def build_model(task: Any, checkpoint: str, vocab_size: int, dropout: float, seed: int) -> torch.nn.Module:
    """The task model with a fresh head (seeded) and, unless `random:PRESET`, the checkpoint's encoder."""
    if checkpoint.startswith("random:"):
        target = checkpoint.split(":", 1)[1]
        if "/" in target:  # the architecture of a model directory, fresh weights
            from model.hf_io import read_config

            config = read_config(Path(target))
        else:
            config = BertConfig.from_preset(target, vocab_size=vocab_size)
        encoder_state = None
    else:
        from model.hf_io import load_pretraining_model, tokenizer_fit_problem

        pretrained, fresh = load_pretraining_model(checkpoint)
        config = pretrained.config
        # weights the file did not hold (a pooler, for a checkpoint saved without one, as
        # transformers' BertForMaskedLM saves) are not taken: the task model's own, seeded below
        encoder_state = {k: v for k, v in pretrained.bert.state_dict().items() if f"bert.{k}" not in fresh}
        if problem := tokenizer_fit_problem(vocab_size, config.vocab_size):
            raise UserError(
                f"checkpoint {checkpoint}: {problem}.",
                fix=f"read it with the tokenizer it was trained with: `bertflow finetune --checkpoint {checkpoint} "
                "--tokenizer DIR`; for a finetune.baselines model of a config (no --tokenizer there), put "
                f"that tokenizer's vocab.txt into {checkpoint}: a model with tokenizer files is read with them.",
            )
    config = dataclasses.replace(config, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(seed)
    model = task.make_model(config)
    if encoder_state is not None:
        own = model.bert.state_dict()
        missing = [k for k in own if k not in encoder_state]
        if [k for k in missing if not k.startswith("pooler.")]:
            raise UserError(f"checkpoint {checkpoint} lacks encoder weights {missing[:3]}.")
        if missing:
            task.notes["pooler"] = "not in the checkpoint: a new layer initialized with the unit's seed"
        model.bert.load_state_dict({k: encoder_state.get(k, v) for k, v in own.items()})
    return model


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run_finetune_unit(
    cfg: FinetuneConfig, job: Job, data_root: str | None = None, wandb: WandbTarget | None = None
) -> dict[str, Any]:
    """Fine-tune `job.checkpoint` on one unit, evaluate on the dev split and write
    `job.out_dir/result.json` plus a completion marker; with `job.keep_model` also its model and
    dev predictions (`finetuning.keep`). A finished unit returns its stored result (`as_job_result`),
    unless it should keep a model it does not have: then it trains again."""
    if (done := stored_result(job)) is not None:
        return done
    job.out_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_dir(job.out_dir, f"unit {job.unit.name}", inside=True):
        return _run_locked(cfg, job, data_root, wandb or WandbTarget())


def stored_result(job: Job) -> dict[str, Any] | None:
    """`job`'s result when its unit is finished (`as_job_result`), None when it must train (not
    finished, or it should keep a model it does not have). A finished result of other settings in
    its directory is refused."""
    out_dir = job.out_dir
    marker = read_marker(out_dir)
    if marker is None or not (out_dir / RESULT_FILE).is_file():
        return None
    if marker.get("key") != job.key:
        raise UserError(
            f"{out_dir} holds a finished result of unit {job.unit.name} made with different settings.",
            fix="use another --output directory, or delete that unit directory to recompute it.",
        )
    if missing_model(out_dir, job.keep_model):
        return None
    return as_job_result(job, json.loads((out_dir / RESULT_FILE).read_text()))


def unit_score(metrics: dict[str, float | None]) -> float | None:
    """The mean of a unit's metrics; None (undefined) when any of them is."""
    values = list(metrics.values())
    return None if any(v is None for v in values) else sum(values) / len(values)


def finished_result(out_dir: Path) -> dict[str, Any] | None:
    """The stored result of a unit directory that finished (marker and result written), else None."""
    if read_marker(out_dir) is None or not (out_dir / RESULT_FILE).is_file():
        return None
    return json.loads((out_dir / RESULT_FILE).read_text())


def finished_results(unit_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """The stored results of those of `unit_dirs` that finished, in their order."""
    return [r for r in (finished_result(d) for d in unit_dirs) if r is not None]


def as_job_result(job: Job, result: dict[str, Any]) -> dict[str, Any]:
    """A finished unit's stored `result` as `job`'s, under `job`'s checkpoint and label: the unit
    may have been made for the same weights at another path (a run directory moved or copied
    since; its key holds the checkpoint's content), or, copied by `adopt_result`, for another
    random:DIR of the same architecture."""
    return {**result, "checkpoint": job.checkpoint, "checkpoint_label": job.label}


def _run_locked(cfg: FinetuneConfig, job: Job, data_root: str | None, wandb: WandbTarget) -> dict[str, Any]:
    out_dir, unit = job.out_dir, job.unit
    if (done := finished_result(out_dir)) is not None and not missing_model(out_dir, job.keep_model):
        return as_job_result(job, done)  # finished meanwhile
    # a finished unit trained again for its model stops being finished until it has one
    (out_dir / MARKER_NAME).unlink(missing_ok=True)
    _clear_attempt(out_dir)

    wall_start = time.perf_counter()
    device = pick_device()
    spec = get_task(unit.task, cfg.task_config)
    tok, _ = load_tokenizer(job.tokenizer_dir)
    task = _task_class(spec)(
        spec, tok, cfg.max_seq_length, cfg.max_train_examples, cfg.max_eval_examples, data_root
    )
    model = build_model(task, job.checkpoint, tok.get_vocab_size(), cfg.dropout, unit.seed).to(device)
    tracker = _unit_tracker(cfg, job, wandb)
    try:
        stats = train(
            model,
            task.train_features,
            lr=unit.lr,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            weight_decay=cfg.weight_decay,
            warmup_proportion=cfg.warmup_proportion,
            seed=unit.seed,
            device=device,
            pad_token_id=pad_id(tok),
            group_by_length=cfg.group_by_length,
            log=tracker.log,
        )
        eval_start = time.perf_counter()
        per_feature = predict(model, task.eval_features, task.eval_outputs, device, pad_id(tok))
        metrics = task.metrics(per_feature)
        eval_seconds = time.perf_counter() - eval_start
        tracker.log({f"eval/{k}": v for k, v in metrics.items()}, stats.steps)
        result = _unit_result(cfg, job, spec, task, metrics, stats) | {
            "eval_time_s": eval_seconds,
            "wall_time_s": time.perf_counter() - wall_start,
            "device": str(device),
            "torch_threads": torch.get_num_threads(),
            "notes": task.notes,
        }
        tracker.summary(
            {f"eval/{k}": v for k, v in metrics.items()} | {"train_examples_per_s": stats.examples_per_s}
        )
    finally:
        tracker.finish()
    if job.keep_model:  # before the marker: a finished unit that keeps its model has it
        write_predictions(out_dir, prediction_rows(spec, task, per_feature))
        save_unit_model(model, spec, out_dir, job.tokenizer_dir, cfg.max_seq_length, result)
    atomic_write_json(out_dir / RESULT_FILE, result)
    _write_unit_marker(job)
    return result


def _unit_tracker(cfg: FinetuneConfig, job: Job, wandb: WandbTarget) -> Tracker:
    """The unit's curve (out_dir/metrics) and W&B run, named `<label>/<unit>`."""
    unit = job.unit
    return Tracker(
        job.out_dir,
        wandb,
        name=f"{job.label}/{unit.name}",
        job_type="finetune",
        config={
            **cfg.model_dump(),
            "task": unit.task,
            "lr": unit.lr,
            "seed": unit.seed,
            "checkpoint": job.checkpoint,
        },
    )


def _unit_result(
    cfg: FinetuneConfig, job: Job, spec: TaskSpec, task: Any, metrics: dict[str, Any], stats: TrainStats
) -> dict[str, Any]:
    """What result.json says of a trained and evaluated unit, up to its timings (the caller's)."""
    unit, checkpoint = job.unit, job.checkpoint
    return {
        "unit": unit.name,
        "task": unit.task,
        "kind": spec.kind,
        "glue": spec.glue,
        "metric_names": list(spec.metrics),
        "metrics": metrics,
        "score": unit_score(metrics),
        "diverged": not math.isfinite(stats.final_loss),
        "chance_metrics": task.chance_metrics(),
        "chance_prediction": task.chance_prediction(),
        "lr": unit.lr,
        "seed": unit.seed,
        "checkpoint": checkpoint,
        "checkpoint_label": job.label,
        "checkpoint_kind": "random" if checkpoint.startswith("random:") else "pretrained",
        "epochs": cfg.epochs,
        "batch_size": cfg.batch_size,
        "max_seq_length": cfg.max_seq_length,
        "n_train": task.n_train,
        "n_eval": task.n_eval,
        "n_train_features": len(task.train_features),
        "train_steps": stats.steps,
        "final_train_loss": stats.final_loss,
        "train_examples_per_s": stats.examples_per_s,
        "train_time_s": stats.seconds,
    }


def _write_unit_marker(job: Job) -> None:
    """The completion marker, written last: the unit's key and the digests of its code."""
    marker = {"unit": job.unit.name, "key": job.key, "code": source_digests(UNIT_CODE)}
    if job.random_init_key is not None:
        marker["random_init_key"] = job.random_init_key
    write_marker(job.out_dir, marker)


def _clear_attempt(out_dir: Path) -> None:
    """An interrupted earlier attempt: its partial curve and W&B files are stale."""
    if out_dir.is_dir():
        remove_temp_files(out_dir)
        for stale in (f"{TMP_PREFIX}{MODEL_DIR}", MODEL_DIR):  # a model of another training
            shutil.rmtree(out_dir / stale, ignore_errors=True)
        (out_dir / PREDICTIONS_FILE).unlink(missing_ok=True)
        (out_dir / METRICS_FILE).unlink(missing_ok=True)
        shutil.rmtree(out_dir / "wandb_files", ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def adopt_result(job: Job, source: Path) -> bool:
    """Fill `job.out_dir` with the finished result of `source`, a unit directory whose result is
    `job`'s own (the same `random_init_key`), under `job`'s checkpoint and label, with its curve;
    its W&B run stays in `source`. False when `job.out_dir` is busy in another process or finished."""
    try:
        with exclusive_dir(job.out_dir, f"unit {job.unit.name}", inside=True):
            source_marker = read_marker(source)
            if finished_result(job.out_dir) is not None or source_marker is None:
                return False  # finished meanwhile, or the source was cleaned meanwhile
            _clear_attempt(job.out_dir)
            result = json.loads((source / RESULT_FILE).read_text())
            origin = result.get("reused_from", str(source))
            if (source / METRICS_FILE).is_file():
                shutil.copyfile(source / METRICS_FILE, job.out_dir / METRICS_FILE)
            atomic_write_json(
                job.out_dir / RESULT_FILE, {**as_job_result(job, result), "reused_from": origin}
            )
            write_marker(job.out_dir, {**source_marker, "key": job.key, "reused_from": origin})
    except (UserError, FileNotFoundError):  # another process holds the unit; the source went
        return False
    return True
