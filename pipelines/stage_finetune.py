"""Stage 4, `bertflow finetune [CONFIG] [--checkpoint DIR|random:PRESET ...] [--output DIR]`.

Fine-tunes every (task, lr, seed) unit of each checkpoint (plus the config's baselines, random
init of the same shape by default) in worker processes (`finetuning/fanout.py`), prints the
scorecard and writes it under --output; units go to `--output/units/<unit>__<label>-<key>/` and
finished ones are reused on a rerun. Without --checkpoint it fine-tunes the flow's own model for
CONFIG exactly as the flow does (`flow_plan`), writing where the flow looks: its units into
`run_dir/finetune/units/` and the scorecard into the finetune stage directory, so the flow reuses
them and vice versa. Exit code 1 when any unit failed (the others still ran and their results are
kept), 2 when every failed unit failed on bad input (a rerun as it is would fail again).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from common.atomic import read_marker, write_marker
from common.console import warning_line
from common.dir_lock import LOCK_FILE
from common.errors import UserError
from common.paths import check_output_dir
from common.stage_output import check_own_output, refuse_foreign_files
from finetuning.config import FinetuneConfig
from finetuning.keep import MODEL_DIR
from pipelines.config import PipelineConfig, bad_flag_value, flag_items, load_config, validation_message
from pipelines.stage_keys import (
    code_change_note,
    run_root,
    stage_code,
    stage_dir,
    stage_key_inputs,
    write_stage_key,
)

if TYPE_CHECKING:
    from common.tracking import WandbTarget
    from finetuning.units import Job

# what `finetune --output DIR` writes there (`refuse_foreign_files`), and the sign that an earlier
# `finetune --output DIR` wrote it (--checkpoint writes no marker): a unit's lock, which stays
OUTPUT_NAMES = ("scorecard.json", "scorecard.md", "scorecard_run", "units")
OWN_SIGNS = (f"units/*/{LOCK_FILE}",)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument

    p.add_argument("config", nargs="?", help="pipeline YAML (its finetune: section); optional")
    p.add_argument(
        "--checkpoint",
        action="append",
        help="model directory (ours or any Hugging Face BERT), random:PRESET or random:DIR; repeatable "
        "(default: the flow's pretrained model for CONFIG)",
    )
    p.add_argument("--tasks", help="comma-separated task names, e.g. sst2,mrpc,stsb,conll2003,squad")
    p.add_argument(
        "--task-config", help="YAML with extra task definitions (same schema as finetuning/tasks.yaml)"
    )
    p.add_argument(
        "--tokenizer", help="directory with tokenizer.json or vocab.txt (default: the checkpoint's)"
    )
    p.add_argument(
        "--baselines",
        help="comma-separated extra checkpoints, 'random' = random init of the "
        "first checkpoint's shape; 'none' for no baseline (default: the config's finetune.baselines)",
    )
    p.add_argument(
        "--max-train-examples",
        type=int,
        help="train on at most N examples per task (= finetune.max_train_examples)",
    )
    p.add_argument(
        "--max-eval-examples",
        type=int,
        help="evaluate on at most N dev examples (= finetune.max_eval_examples)",
    )
    p.add_argument(
        "--max-seq-length",
        type=int,
        help="tokens per example, longer ones truncated (= finetune.max_seq_length)",
    )
    p.add_argument("--epochs", type=float, help="passes over the training examples, may be fractional")
    p.add_argument("--batch-size", type=int, help="examples per optimizer step (= finetune.batch_size)")
    p.add_argument("--lr", help="learning rate, or a comma-separated sweep such as 5e-5,3e-5,2e-5")
    p.add_argument("--seed", help="seed, or comma-separated seeds")
    p.add_argument("--unit", help="run only this unit (e.g. sst2-lr5e-05-s42)")
    p.add_argument(
        "--workers",
        type=int,
        help="concurrent units (default: finetune.concurrency; on a GPU machine finetune.units_per_gpu per GPU, "
        "and N rounded up to whole units per GPU)",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads per unit on CPU (default 1; a set count is in the unit key: it changes float sums)",
    )
    p.add_argument("--group", help="W&B group for the unit runs (default: the output directory name)")
    p.add_argument(
        "--output", help="output directory (needed with --checkpoint; default: the flow's finetune stage)"
    )
    add_set_argument(p, dest="set")


def _units_per_gpu(workers: int) -> int:
    """--workers N shared among the GPUs (N units at a time on CPU: finetune.concurrency)."""
    from training.ranks import visible_gpus

    return -(-workers // max(visible_gpus(), 1))


# finetune.<setting>: the flag (argparse dest) that sets it, and how the flag's text becomes the
# setting's value (None: as argparse typed it). --workers N sets both concurrency (units at a time
# on CPU) and units_per_gpu.
SETTING_FLAGS: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "tasks": ("tasks", _csv),
    "task_config": ("task_config", None),
    "max_train_examples": ("max_train_examples", None),
    "max_eval_examples": ("max_eval_examples", None),
    "max_seq_length": ("max_seq_length", None),
    "epochs": ("epochs", None),
    "batch_size": ("batch_size", None),
    "lrs": ("lr", lambda text: [float(x) for x in _csv(text)]),
    "seeds": ("seed", lambda text: [int(x) for x in _csv(text)]),
    "concurrency": ("workers", None),
    "units_per_gpu": ("workers", _units_per_gpu),
    "threads": ("threads", None),
}


def _flag_values(args: argparse.Namespace) -> dict:
    """The settings that the flags given set (`SETTING_FLAGS`)."""
    values = {}
    for setting, (flag, parse) in SETTING_FLAGS.items():
        if (given := getattr(args, flag)) is not None:
            try:
                values[setting] = parse(given) if parse else given
            except ValueError as exc:
                raise UserError(f"--{flag}: {exc}", fix="e.g. --lr 5e-5,3e-5 --seed 42,43.") from None
    return values


def flow_config(args: argparse.Namespace) -> PipelineConfig:
    """The config of this command's flow with the flags as `--set finetune.*` items: the flow command
    that makes or recomputes its units (`bertflow run` has no finetune flags). Call after
    `apply_flags`, which names a bad flag as the flag's."""
    items = flag_items({f"finetune.{setting}": value for setting, value in _flag_values(args).items()})
    return load_config(args.config, [*args.set, *items])


def apply_flags(cfg: FinetuneConfig, args: argparse.Namespace) -> FinetuneConfig:
    """The command-line flags win over the config file's finetune: section (already valid, so a
    refusal here is a flag's: each is checked alone, and the first bad one is named)."""
    flags = _flag_values(args)
    for setting, value in flags.items():
        try:
            FinetuneConfig.model_validate({**cfg.model_dump(), setting: value})
        except ValidationError as exc:
            arg = SETTING_FLAGS[setting][0]
            flag = f"--{arg.replace('_', '-')}"
            raise bad_flag_value(
                flag, getattr(args, arg), exc, f"finetune.{setting}", getattr(cfg, setting)
            ) from None
    try:
        out = FinetuneConfig.model_validate({**cfg.model_dump(), **flags})
    except ValidationError as exc:  # flags valid alone but not together
        raise UserError(f"bad flag values: {validation_message(exc, 'finetune')}.") from None
    out.tasks_from = "--tasks" if "tasks" in flags else cfg.tasks_from
    return out


def check_flow_finetune(cfg: PipelineConfig) -> None:
    """The flow's fine-tuning settings that cannot work, refused before its first stage instead
    of after pretraining: unknown tasks, settings the pretrained model's shape cannot serve, and
    baselines (Hugging Face BERTs) that are missing or cannot serve them. (A baseline's weights are
    not read here, on every run: NaN or Inf in them is refused before its units run.)"""
    from finetuning.checkpoints import normalize_checkpoint, with_baselines
    from finetuning.fanout import check_architecture, check_model_limits
    from finetuning.units import finetune_units
    from pipelines.stage_pretrain import model_shape

    tasks = {u.task for u in finetune_units(cfg.finetune)}
    check_architecture(cfg.finetune, model_shape(cfg), "the pretrained model", tasks)
    others = [b for b in cfg.finetune.baselines if b != "random"]
    for baseline in with_baselines([], others, cfg.data_root):
        try:
            check_model_limits(cfg.finetune, normalize_checkpoint(baseline), tasks)
        except UserError as err:
            raise UserError(f"finetune.baselines: {err}") from None


def flow_plan(cfg: PipelineConfig, model_dir: Path, tokenizer_dir: Path) -> list[Job]:
    """The flow's fine-tuning plan for `cfg`: the pretrained model plus the configured baselines,
    read with the flow's tokenizer, except a baseline (a Hugging Face BERT) whose own tokenizer reads
    text otherwise, which is read with its own; units under `run_dir/finetune/units/`."""
    from finetuning.checkpoints import with_baselines
    from finetuning.fanout import plan

    checkpoints = with_baselines([str(model_dir)], cfg.finetune.baselines, cfg.data_root)
    theirs = [c for c in checkpoints if c != str(model_dir) and _reads_otherwise(c, tokenizer_dir)]
    ours = [c for c in checkpoints if c not in theirs]
    root = run_root(cfg) / "finetune"
    jobs = plan(cfg.finetune, ours, root, tokenizer_dir=tokenizer_dir, data_root=cfg.data_root)
    return jobs + (plan(cfg.finetune, theirs, root, data_root=cfg.data_root) if theirs else [])


def check_finetune_output(out: str, checkpoints: list[str], tokenizer: str | None) -> None:
    """`--output` neither a checkpoint's or the tokenizer's folder nor inside one, nor another stage's
    output: units and scorecards were written into the model, the shards or the vocabulary."""
    from finetuning.checkpoints import checkpoint_target

    inputs = [
        ("checkpoint", checkpoint_target(c)) for c in checkpoints if Path(checkpoint_target(c)).is_dir()
    ]
    for what, path in [*inputs, *([("tokenizer", tokenizer)] if tokenizer else [])]:
        check_own_output(out, "finetune", {what: path})
    check_own_output(out, "finetune", {})


def _reads_otherwise(checkpoint: str, tokenizer_dir: Path) -> bool:
    """A model directory with a tokenizer of its own that tokenizes unlike `tokenizer_dir` (random
    weights and a model without tokenizer files are read with the flow's)."""
    from finetuning.checkpoints import is_random
    from model.hf_io import has_tokenizer
    from preprocessing.wordpiece import tokenizer_difference

    if is_random(checkpoint) or not has_tokenizer(Path(checkpoint)):
        return False
    return (
        tokenizer_difference(Path(checkpoint), tokenizer_dir, "finetune.baselines", "tokenizer") is not None
    )


def _plan_from_args(
    cfg_all: PipelineConfig, cfg: FinetuneConfig, args: argparse.Namespace
) -> tuple[list[Job], Path]:
    """The jobs of this command (all units, or the plan's --unit) and the scorecard directory."""
    from finetuning.checkpoints import with_baselines
    from finetuning.fanout import plan

    cfg_all = cfg_all.model_copy(update={"finetune": cfg})
    if not args.checkpoint:
        if args.output or args.tokenizer or args.baselines is not None:
            raise UserError(
                "--output, --tokenizer and --baselines go with --checkpoint.",
                fix="pass --checkpoint DIR, or none of them to fine-tune the flow's model for the config.",
            )
        model_dir, tokenizer_dir = stage_dir(cfg_all, "pretrain") / "model", stage_dir(cfg_all, "tokenizer")
        if read_marker(model_dir.parent) is None or read_marker(tokenizer_dir) is None:
            raise UserError(
                f"the flow has no pretrained model for this config ({model_dir}).",
                fix=f"run `{cfg_all.command_line('run', '--only', 'pretrain')}` (or the stages before it) first, "
                "or pass --checkpoint DIR.",
            )
        return flow_plan(cfg_all, model_dir, tokenizer_dir), stage_dir(cfg_all, "finetune")
    if not args.output:
        raise UserError(
            "--checkpoint needs --output DIR.",
            fix="pass --output DIR (without --checkpoint the command fine-tunes the flow's own model).",
        )
    check_output_dir(args.output, "--output")
    baselines = _csv(args.baselines) if args.baselines is not None else cfg.baselines
    checkpoints = with_baselines(args.checkpoint, baselines, cfg_all.data_root)
    check_finetune_output(args.output, checkpoints, args.tokenizer)
    refuse_foreign_files(args.output, "finetune", OUTPUT_NAMES, own=OWN_SIGNS)
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    jobs = plan(cfg, checkpoints, Path(args.output), tokenizer_dir=tokenizer, data_root=cfg_all.data_root)
    return jobs, Path(args.output)


def result_line(job: Job, result: dict, save_models: str = "none") -> str:
    """A finished unit as the command prints it: its metrics and speed, or its error; the model it
    wrote, which under `save_models` `best` is removed later unless its lr is the best (the command
    ends with the models kept, `keep.kept_models_note`)."""
    if "error" in result:
        return f"FAILED {job.name}: {result['error']}"
    shown = ", ".join(f"{k} {'undefined' if v is None else f'{v:.1f}'}" for k, v in result["metrics"].items())
    shown += " (DIVERGED: the training loss is NaN)" if result.get("diverged") else ""
    line = f"done   {job.name}: {shown} ({result['train_examples_per_s']:.1f} train ex/s)"
    if not job.keep_model:
        return line
    if save_models == "best":
        return line + f"; model saved, kept if its lr is the best: {job.out_dir / MODEL_DIR}"
    return line + f"; model kept: {job.out_dir / MODEL_DIR}"


def _keep_models(
    cfg: FinetuneConfig, jobs: list[Job], results: list[dict], others: list[dict], **run_options: Any
) -> list[dict]:
    """`finetune.save_models: best`, once every unit is done: the best lr's units without a model
    train again keeping it, and the others' models are removed (`finetuning.keep`). `others`: the
    finished results of the plan's units not run here (`--unit`), which the best lr is chosen among
    too, as the scorecard does."""
    from finetuning import fanout, keep

    again = keep.to_retrain(cfg, jobs, results, among=results + others)
    if again:
        print(f"bertflow finetune: {keep.retrain_best_note(len(again))}", flush=True)
        report = run_options.pop("report")
        redone = dict(zip(again, fanout.run(cfg, again, **run_options, on_result=report), strict=True))
        by_dir = {j.out_dir: r for j, r in redone.items()}
        results = [by_dir.get(j.out_dir, r) for j, r in zip(jobs, results, strict=True)]
    if removed := keep.prune(cfg, jobs, results + others):
        print(f"bertflow finetune: {keep.removed_note(removed)}", flush=True)
    return results


def main(args: argparse.Namespace) -> int:
    cfg_all = load_config(args.config, args.set)  # a config mistake is said before torch loads
    cfg = apply_flags(cfg_all.finetune, args)

    from common.progress import Progress
    from finetuning import fanout, keep
    from finetuning.units import as_job_result, find_unit, finished_result

    jobs, output = _plan_from_args(cfg_all, cfg, args)
    jobs = keep.first_pass(cfg, jobs)
    unit = find_unit(cfg, args.unit) if args.unit else None  # reads the task definitions once
    selected = [j for j in jobs if j.unit == unit] if unit else jobs
    group = args.group or output.resolve().name
    wandb = cfg_all.wandb.target(group)
    reused = fanout.reuse_random_init_units(selected)
    fanout.refuse_nonfinite_encoders(cfg, selected)
    _print_task_notes(cfg, selected, cfg_all.data_root)  # a task file's data mistake, before any unit
    complete = {j.out_dir for j in selected if keep.unit_complete(j)}
    _print_plan(cfg, selected, complete, reused, output, None if args.checkpoint else flow_config(args))
    progress = Progress(len(selected) - len(complete), "units to run")

    def report(job: Job, result: dict) -> None:
        print(
            f"  {result_line(job, result, cfg.save_models)}"
            + ("" if job.out_dir in complete else f"  [{progress.step()}]"),
            flush=True,
        )

    try:
        results = fanout.run(cfg, selected, data_root=cfg_all.data_root, wandb=wandb, on_result=report)
        others = [j for j in jobs if j not in selected]  # --unit: the plan's others, finished ones as theirs
        others_done = [as_job_result(j, r) for j in others if (r := finished_result(j.out_dir)) is not None]
        keep_options = {"data_root": cfg_all.data_root, "wandb": wandb, "report": report}
        results = _keep_models(cfg, selected, results, others_done, **keep_options) + others_done
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what is kept and how to go on, then cli's 'interrupted.'
        print(f"bertflow finetune: {_stopped_note(selected, output)}", file=sys.stderr, flush=True)
        raise
    _build_scorecard(cfg, results, output, wandb, group)
    print()
    print((output / "scorecard.md").read_text())
    if note := keep.kept_models_note(jobs, cfg.save_models):  # `best` removed some the unit lines named
        print(f"bertflow finetune: {note}", flush=True)
    failed = [r for r in results if "error" in r]
    if failed:
        print(
            f"bertflow finetune: {len(failed)} of {len(results)} unit(s) failed (see above).", file=sys.stderr
        )
        return 2 if all(r.get("bad_input") for r in failed) else 1  # 2: a rerun as it is fails again
    if not args.checkpoint and not args.unit:  # the flow's finetune stage, complete
        write_marker(output, {"stage": "finetune", "by": "bertflow finetune", "code": stage_code("finetune")})
        write_stage_key(output, stage_key_inputs(cfg_all.model_copy(update={"finetune": cfg}))["finetune"])
    return 0


def _stopped_note(jobs: list[Job], output: Path) -> str:
    """What a stopped command leaves: its complete units (a rerun reuses them) and those still to run."""
    from finetuning import keep

    done = sum(keep.unit_complete(j) for j in jobs)
    return (
        f"stopped with {done} of {len(jobs)} unit(s) complete in {output}; rerun the same command to run the "
        f"other {len(jobs) - done} (complete units are reused, the stopped ones train again)."
    )


def _print_task_notes(cfg: FinetuneConfig, jobs: list[Job], data_root: str | None) -> None:
    """Warnings about the tasks' data (`check_requested_tasks`) and about checkpoints whose position
    embeddings the tasks' sequence length reaches past what they were trained on."""
    from finetuning import fanout
    from finetuning.tasks import check_requested_tasks

    tasks = [j.unit.task for j in jobs]
    for note in check_requested_tasks(
        tasks, cfg.task_config, data_root, cfg.max_train_examples, cfg.max_eval_examples
    ):
        print(f"bertflow finetune: {warning_line(note)}", flush=True)
    for note in fanout.untrained_positions_notes(cfg, jobs):
        print(f"bertflow finetune: {warning_line(note)}", flush=True)


def _print_plan(
    cfg: FinetuneConfig,
    jobs: list[Job],
    complete: set[Path],
    reused: int,
    output: Path,
    flow: PipelineConfig | None,
) -> None:
    """The line saying how many units run on how many workers, and the notes on reused outputs
    made by other code (`flow`: the config whose flow recomputes them) and on finished units that
    train again to keep their model."""
    from finetuning import fanout, keep
    from training.ranks import visible_gpus

    gpus = visible_gpus()
    workers = fanout.worker_count(cfg, len(jobs), gpus)
    print(
        f"bertflow finetune: {len(jobs)} unit(s), {len(complete)} already complete"
        + (f" ({reused} random-init units copied from a model of the same shape)" if reused else "")
        + f", {workers} worker(s) of {fanout.unit_threads(cfg, workers, gpus)} torch thread(s) -> {output}",
        flush=True,
    )
    if note := code_change_note("finetune", sorted(complete), cfg=flow, own_output=None if flow else output):
        print(f"bertflow finetune: {note}", flush=True)
    if note := keep.retrain_note(jobs, cfg.save_models):
        print(f"bertflow finetune: {note}", flush=True)


def _build_scorecard(
    cfg: FinetuneConfig, results: list[dict], output: Path, wandb: WandbTarget, group: str
) -> None:
    """output/scorecard.md and .json, and the scorecard's W&B run `<group>/scorecard`."""
    from common.tracking import Tracker
    from finetuning.scorecard import build_scorecard

    tracker = Tracker(
        output / "scorecard_run",
        wandb,
        name=f"{group}/scorecard",
        job_type="finetune-scorecard",
        config=cfg.model_dump(mode="json"),
    )
    try:
        build_scorecard(results, output, tracker)
    finally:
        tracker.finish()
