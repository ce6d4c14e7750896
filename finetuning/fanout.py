"""Run many fine-tuning units with bounded concurrency: worker processes, each with its share of
the CPU threads, or one worker per GPU. A failed unit is recorded and the others go on.

Workers exit when the parent dies (a killed CLI leaves no orphan finishing units behind).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.tracking import WandbTarget
from finetuning.config import FinetuneConfig
from finetuning.units import FinetuneUnit, checkpoint_label, run_finetune_unit


@dataclass(frozen=True)
class Job:
    checkpoint: str
    unit: FinetuneUnit
    out_dir: Path


def unit_dir(output: Path, checkpoint: str, unit: FinetuneUnit, several_checkpoints: bool) -> Path:
    """`OUTPUT/units/<unit>`; with several checkpoints `OUTPUT/units/<checkpoint label>/<unit>`."""
    if not several_checkpoints:
        return output / "units" / unit.name
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in checkpoint_label(checkpoint))
    return output / "units" / slug / unit.name


def plan_jobs(checkpoints: list[str], units: list[FinetuneUnit], output: Path) -> list[Job]:
    several = len(checkpoints) > 1
    return [Job(c, u, unit_dir(output, c, u, several)) for c in checkpoints for u in units]


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.5)


def _init_worker(parent: int, threads: int, devices: Any) -> None:
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    import torch

    torch.set_num_threads(threads)
    if devices is not None:
        torch.cuda.set_device(devices.get())


def _run_job(
    cfg: FinetuneConfig,
    job: Job,
    tokenizer_dir: Path | None,
    data_root: str | None,
    wandb: WandbTarget,
) -> dict[str, Any]:
    """Never raises: a failure becomes a result with an `error` key."""
    base = {
        "unit": job.unit.name,
        "task": job.unit.task,
        "checkpoint_label": checkpoint_label(job.checkpoint),
    }
    try:
        return run_finetune_unit(
            cfg, job.unit, job.checkpoint, job.out_dir, tokenizer_dir, data_root, wandb=wandb
        )
    except UserError as exc:
        return {**base, "error": str(exc)}
    except Exception as exc:  # a bug or a crash in one unit must not stop the others
        traceback.print_exc()
        return {**base, "error": f"{type(exc).__name__}: {exc} (traceback above)"}


def threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def unit_pool(concurrency: int, n_jobs: int, threads: int | None = None) -> tuple[ProcessPoolExecutor, int]:
    """Worker processes for fine-tuning units: up to `concurrency` of them (never more than jobs),
    each with `threads` torch threads or its share of the CPU cores; on a GPU machine at most one
    per GPU, each pinned to its own GPU. Returns (pool, number of workers)."""
    import torch

    n_gpus = torch.cuda.device_count()
    workers = max(1, min(concurrency, max(n_jobs, 1), n_gpus or concurrency))
    ctx = mp.get_context("spawn")
    devices = None
    if n_gpus:
        devices = ctx.Queue()
        for i in range(workers):
            devices.put(i)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(os.getpid(), threads or threads_per_worker(workers), devices),
    )
    return pool, workers


def run_jobs(
    cfg: FinetuneConfig,
    jobs: list[Job],
    *,
    workers: int,
    tokenizer_dir: Path | None = None,
    data_root: str | None = None,
    wandb: WandbTarget | None = None,
    on_result: Any = None,
) -> list[dict[str, Any]]:
    """Run `jobs` in at most `workers` processes (one per GPU when GPUs exist); results in job order."""
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    pool, _ = unit_pool(workers, len(jobs), cfg.threads)
    try:
        pending = {
            pool.submit(_run_job, cfg, job, tokenizer_dir, data_root, wandb or WandbTarget()): i
            for i, job in enumerate(jobs)
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    job = jobs[i]
                    result = {
                        "unit": job.unit.name,
                        "task": job.unit.task,
                        "checkpoint_label": checkpoint_label(job.checkpoint),
                        "error": "the worker process died (out of memory or killed); rerun to retry this unit",
                    }
                results[i] = result
                if on_result is not None:
                    on_result(jobs[i], result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [r for r in results if r is not None]
