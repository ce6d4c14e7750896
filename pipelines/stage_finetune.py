"""`bertflow finetune [CONFIG] --checkpoint DIR|random:PRESET --tasks sst2,mrpc --output DIR`.

Fine-tunes every (task, lr, seed) unit of each checkpoint (plus the config's baselines, random
init of the same shape by default) in worker processes, prints the scorecard and writes it under
--output; unit results go to `--output/units/<unit>/`. Finished units are reused on a rerun.
Exit code 1 when any unit failed (the others still ran and their results are kept).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from common.errors import UserError
from finetuning.config import FinetuneConfig


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="pipeline YAML (its finetune: section); optional")
    p.add_argument(
        "--checkpoint",
        action="append",
        help="model directory (ours or any Hugging Face BERT), random:PRESET or random:DIR; repeatable",
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
    p.add_argument("--max-train-examples", type=int)
    p.add_argument("--max-eval-examples", type=int)
    p.add_argument("--max-seq-length", type=int)
    p.add_argument("--epochs", type=float)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", help="learning rate, or a comma-separated sweep such as 5e-5,3e-5,2e-5")
    p.add_argument("--seed", help="seed, or comma-separated seeds")
    p.add_argument("--unit", help="run only this unit (e.g. sst2-lr5e-05-s42)")
    p.add_argument("--workers", type=int, help="concurrent units (default: finetune.concurrency)")
    p.add_argument("--threads", type=int, help="torch threads per CPU worker (default: cores // workers)")
    p.add_argument("--group", help="W&B group for the unit runs (default: the output directory name)")
    p.add_argument("--output", help="output directory (default: <run_dir>/finetune)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")


def _flag_values(args: argparse.Namespace) -> dict:
    try:
        flags = {
            "tasks": args.tasks and _csv(args.tasks),
            "task_config": args.task_config,
            "max_train_examples": args.max_train_examples,
            "max_eval_examples": args.max_eval_examples,
            "max_seq_length": args.max_seq_length,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lrs": args.lr and [float(x) for x in _csv(args.lr)],
            "seeds": args.seed and [int(x) for x in _csv(args.seed)],
            "concurrency": args.workers,
            "threads": args.threads,
        }
    except ValueError as exc:
        raise UserError(f"--lr / --seed: {exc}", fix="e.g. --lr 5e-5,3e-5 --seed 42,43.") from None
    return {k: v for k, v in flags.items() if v is not None}


def apply_flags(cfg: FinetuneConfig, args: argparse.Namespace) -> FinetuneConfig:
    """The command-line flags win over the config file's finetune: section."""
    try:
        return FinetuneConfig.model_validate({**cfg.model_dump(), **_flag_values(args)})
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise UserError(f"bad flag value: {msgs}") from None


def finished_results(jobs: list) -> list[dict]:
    import json

    from common.atomic import read_marker
    from finetuning.units import RESULT_FILE

    return [
        json.loads((j.out_dir / RESULT_FILE).read_text())
        for j in jobs
        if read_marker(j.out_dir) is not None and (j.out_dir / RESULT_FILE).is_file()
    ]


def main(args: argparse.Namespace) -> int:
    from finetuning.fanout import plan_jobs, run_jobs
    from finetuning.scorecard import build_scorecard
    from finetuning.units import find_unit, finetune_units, normalize_checkpoint, with_baselines
    from pipelines.config import load_config

    cfg_all = load_config(args.config, args.set)
    cfg = apply_flags(cfg_all.finetune, args)
    if not args.checkpoint:
        raise UserError(
            "no checkpoint given.", fix="pass --checkpoint DIR (or random:PRESET with --tokenizer)."
        )
    baselines = _csv(args.baselines) if args.baselines is not None else cfg.baselines
    checkpoints = [normalize_checkpoint(c) for c in with_baselines(args.checkpoint, baselines)]
    units = [find_unit(cfg, args.unit)] if args.unit else finetune_units(cfg)
    output = Path(args.output) if args.output else Path(cfg_all.run_dir) / "finetune"
    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else None
    data_root = cfg_all.data_root
    group = args.group or output.resolve().name
    wandb = cfg_all.wandb.target(group)
    jobs = plan_jobs(checkpoints, units, output)
    print(
        f"bertflow finetune: {len(jobs)} unit(s), {min(cfg.concurrency, len(jobs))} worker(s) -> {output}",
        flush=True,
    )

    def report(job, result) -> None:
        if "error" in result:
            print(f"  FAILED {job.unit.name} [{result['checkpoint_label']}]: {result['error']}", flush=True)
        else:
            shown = ", ".join(f"{k} {v:.1f}" for k, v in result["metrics"].items())
            print(
                f"  done   {job.unit.name} [{result['checkpoint_label']}]: {shown} "
                f"({result['train_examples_per_s']:.1f} train ex/s)",
                flush=True,
            )

    results = run_jobs(
        cfg,
        jobs,
        workers=cfg.concurrency,
        tokenizer_dir=tokenizer_dir,
        data_root=data_root,
        wandb=wandb,
        on_result=report,
    )
    if args.unit:  # the scorecard also shows the plan's other units that finished earlier
        results += finished_results(
            [j for j in plan_jobs(checkpoints, finetune_units(cfg), output) if j not in jobs]
        )
    from common.tracking import Tracker

    tracker = Tracker(
        output / "scorecard_run", wandb, name=f"{group}/scorecard", job_type="finetune-scorecard"
    )
    try:
        build_scorecard(results, output, tracker)
    finally:
        tracker.finish()
    print()
    print((output / "scorecard.md").read_text())
    failed = [r for r in results if "error" in r]
    if failed:
        print(
            f"bertflow finetune: {len(failed)} of {len(results)} unit(s) failed (see above).", file=sys.stderr
        )
        return 1
    return 0
