"""The Prefect tasks of the flow: one per stage, one per fine-tuning unit.

Every stage task writes into its `out_dir` (`run_dir/<stage>/<key>/`, see `pipelines.stage_keys`)
and takes the outputs of the stages it reads as parameters (`{"out_dir": ...}` dicts, resolved by
Prefect from the upstream task runs, so the UI draws the edges). The on-disk completion marker is
the source of truth: a complete `out_dir` is reused, an incomplete one is cleared and recomputed.
Prefect task caching mirrors it so the UI shows reused stages as Cached: the cache key of a task is
its output directory, and a task whose marker is missing (or that is forced) runs with
`refresh_cache=True` (set by `pipelines.flow_run`), which overwrites the cache record. Stage code is
imported inside the tasks, so the flow imports fast and a missing stage only fails when needed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from pydantic import BaseModel

from common.atomic import (
    clear_in_progress,
    mark_in_progress,
    read_marker,
    release_in_progress,
    remove_temp_files,
    write_marker,
)
from common.errors import TransientError, UserError
from common.fingerprint import digest
from common.tracking import WandbTarget
from pipelines.config import PipelineConfig
from pipelines.stage_keys import stage_code

if TYPE_CHECKING:
    from prefect.states import State

    from finetuning.fanout import UnitPool
    from finetuning.units import Job


def _cache_key(_ctx: Any, parameters: dict[str, Any]) -> str:
    """Prefect cache key of a task = its output directory (which embeds the stage or unit key); a
    unit's with its checkpoint's path too: the unit key holds the checkpoint's content, so a moved
    or copied checkpoint finds the same unit, whose result must then name the path it has now."""
    job = parameters.get("job")
    made = [str(job.out_dir), job.checkpoint] if job is not None else parameters["out_dir"]
    return f"bertflow-{parameters.get('stage', 'finetune-unit')}-{digest(made, 20)}"


def retry_unless_user_error(_task: Any, _task_run: Any, state: Any) -> bool:
    """Bad input does not get better by retrying; everything else (OOM, lost worker, I/O) may."""
    return not isinstance(getattr(state, "data", None), UserError)


TASK_OPTIONS: dict[str, Any] = dict(
    cache_key_fn=_cache_key, persist_result=True, retry_condition_fn=retry_unless_user_error
)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def run_in_dir(
    stage: str,
    out_dir: str,
    body: Callable[[Path], dict[str, Any] | None],
    wandb: WandbTarget | None = None,
    config: BaseModel | None = None,
) -> dict[str, Any]:
    """Reuse a complete `out_dir`, else clear its leftovers, run `body`, and mark it complete.
    While it runs, `_IN_PROGRESS.json` says so. With `wandb`, the stage's figures (what `body`
    returns, flattened) become a W&B run of the flow run's group, for stages that log none
    themselves, with `config` (the stage's section of the config) as the run's config."""
    out = Path(out_dir)
    logger = get_run_logger()
    if read_marker(out) is not None:
        logger.info("%s: reusing the complete output in %s", stage, out)
        return {"stage": stage, "out_dir": str(out), "status": "reused", "seconds": 0.0, "result": {}}
    mark_in_progress(out)
    remove_temp_files(out)
    started = time.time()
    try:
        with stage_logs_to(logger):
            result = body(out) or {}
    except Exception:  # failed, not killed: `bertflow runs` says unfinished, not interrupted
        release_in_progress(out)
        raise
    seconds = time.time() - started
    if wandb is not None:
        log_stage_run(out, wandb, stage, {**result, "seconds": seconds}, config)
    if read_marker(out) is None:  # stages that do not write their own marker
        write_marker(out, {"stage": stage, "seconds": round(seconds, 3), "code": stage_code(stage)})
    clear_in_progress(out)
    logger.info("%s: finished in %.1f s -> %s", stage, seconds, out)
    return {"stage": stage, "out_dir": str(out), "status": "ran", "seconds": seconds, "result": result}


@contextmanager
def stage_logs_to(run_logger: Any) -> Iterator[None]:
    """The stages' own loggers (`bertflow.tokenizer`, `bertflow.preprocess`: what they report,
    progress included) into this task run's log, at INFO and above."""

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            run_logger.log(record.levelno, record.getMessage())

    stage_logger = logging.getLogger("bertflow")
    handler, level, propagate = Forward(logging.INFO), stage_logger.level, stage_logger.propagate
    stage_logger.addHandler(handler)
    stage_logger.setLevel(logging.INFO)
    stage_logger.propagate = False  # once, through the run logger (which also prints it)
    try:
        yield
    finally:
        stage_logger.removeHandler(handler)
        stage_logger.setLevel(level)
        stage_logger.propagate = propagate


def log_stage_run(
    out: Path, wandb: WandbTarget, stage: str, figures: dict[str, Any], config: BaseModel | None = None
) -> None:
    """One W&B run for a stage: its numeric figures as the run summary, its config section (if
    given) as the run's config, so runs can be filtered by their settings."""
    if wandb.resolved_mode() == "disabled":
        return
    from common.tracking import Tracker
    from pipelines.report_sections import flatten

    numbers = {
        k.replace(".", "/"): v
        for k, v in flatten(_jsonable(figures)).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    settings = config.model_dump(mode="json") if config is not None else None
    tracker = Tracker(out, wandb, name=stage, job_type=stage, config=settings)
    try:
        tracker.summary(numbers)
    finally:
        tracker.finish()


# Task and task-run names are the stage names `bertflow run` prints (and the stage directories).
@task(name="verify", task_run_name="verify", **TASK_OPTIONS)
def verify_task(stage: str, out_dir: str, cfg: PipelineConfig, wandb: WandbTarget) -> dict[str, Any]:
    from pipelines.verify_data import verify_data

    return run_in_dir(stage, out_dir, lambda out: verify_data(cfg), wandb, cfg.verify)


@task(name="tokenizer", task_run_name="tokenizer", **TASK_OPTIONS)
def tokenizer_task(stage: str, out_dir: str, cfg: PipelineConfig, wandb: WandbTarget) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from pipelines.stage_tokenizer import run_tokenizer_stage

        written = run_tokenizer_stage(cfg.tokenizer, out, data_root=cfg.data_root, flow=cfg)
        marker = read_marker(written) or {}
        return {"vocab_size": marker.get("vocab_size"), "corpus": marker.get("corpus", {})}

    return run_in_dir(stage, out_dir, body, wandb, cfg.tokenizer)


@task(name="preprocess", task_run_name="preprocess", **TASK_OPTIONS)
def preprocess_task(
    stage: str, out_dir: str, cfg: PipelineConfig, tokenizer: dict[str, Any], wandb: WandbTarget
) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from pipelines.beam_console import beam_log_path, quiet_beam
        from pipelines.stage_preprocess import run_preprocess_stage

        with quiet_beam(beam_log_path(out)):
            stats = run_preprocess_stage(
                cfg.preprocess, Path(tokenizer["out_dir"]), out, data_root=cfg.data_root, flow=cfg
            )
        return {"stats": _jsonable(stats)}

    return run_in_dir(stage, out_dir, body, wandb, cfg.preprocess)


@task(name="pretrain", task_run_name="pretrain", **TASK_OPTIONS)
def pretrain_task(
    stage: str,
    out_dir: str,
    cfg: PipelineConfig,
    tokenizer: dict[str, Any],
    preprocess: dict[str, Any],
    wandb: WandbTarget,
) -> dict[str, Any]:
    logger = get_run_logger()

    def body(out: Path) -> dict[str, Any]:
        from pipelines.stage_pretrain import run_pretrain_stage

        shards, tokenizer_dir = Path(preprocess["out_dir"]), Path(tokenizer["out_dir"])
        model_dir = run_pretrain_stage(
            cfg,
            shards,
            tokenizer_dir,
            out,
            log_line=logger.info,
            log_debug=logger.debug,
            wandb=wandb,
            stage=stage,
        )
        return {"model_dir": str(model_dir)}

    return run_in_dir(stage, out_dir, body)


# Units run in the worker processes of a `UnitPool` shared by every unit task of a flow run (each
# with its share of the CPU threads, or one GPU each), exactly as `bertflow finetune` runs them.
@task(name="finetune-unit", task_run_name="finetune-{job.unit.name}-{job.label}", **TASK_OPTIONS)
def finetune_unit_task(job: Job, pool: UnitPool) -> dict[str, Any] | State:
    from finetuning.fanout import UNITS_STOPPED

    if read_marker(job.out_dir) is None:
        mark_in_progress(job.out_dir)  # the unit's worker writes its _COMPLETE.json
    result = pool.run(job)
    if result.get("error") == UNITS_STOPPED:  # the flow run is stopping (Ctrl-C, SIGTERM, a Cancel)
        from prefect.states import Cancelled

        return Cancelled(message=f"fine-tuning unit {job.name}: {UNITS_STOPPED}")
    if "error" in result:  # fail the task (never cached; retried unless on bad input); the other units go on
        failure = UserError if result.get("bad_input") else TransientError
        raise failure(f"fine-tuning unit {job.name} failed: {result['error']}")
    shown = ", ".join(f"{k} {v:.1f}" for k, v in (result.get("metrics") or {}).items())
    get_run_logger().info("%s: %s", job.name, shown)
    return result


@task(name="finetune", task_run_name="finetune", **TASK_OPTIONS)
def scorecard_task(
    stage: str, out_dir: str, cfg: PipelineConfig, units: list[dict[str, Any]], wandb: WandbTarget
) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from common.tracking import Tracker
        from finetuning.scorecard import build_scorecard

        settings = cfg.finetune.model_dump(mode="json")
        tracker = Tracker(out, wandb, job_type="scorecard", name="scorecard", config=settings)
        try:
            card = build_scorecard(units, out, tracker=tracker)
        finally:
            tracker.finish()
        return {"scorecard": _jsonable(card)}

    return run_in_dir(stage, out_dir, body)


@task(name="report", task_run_name="report", **TASK_OPTIONS)
def report_task(
    stage: str,
    out_dir: str,
    cfg: PipelineConfig,
    finetune: dict[str, Any],
    record_path: str,
    wandb: WandbTarget,
) -> dict[str, Any]:
    """`finetune`: the scorecard's stage output, which the report shows (read from the run dir)."""

    def body(out: Path) -> dict[str, Any]:
        from pipelines.report_builder import build_report

        paths = build_report(cfg, out, record_path=Path(record_path), wandb=wandb)
        return {k: str(v) for k, v in paths.items()}

    return run_in_dir(stage, out_dir, body)
