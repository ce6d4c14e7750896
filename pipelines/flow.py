"""The Prefect flow `bert-pipeline`: verify data → tokenizer → preprocess → pretrain → fine-tune fan-out
→ report.

Every stage writes into `run_dir/<stage>/<key>/` (see `pipelines.stage_keys`). The on-disk completion
marker is the source of truth: a stage whose marker exists is reused, one without is (re)computed.
Prefect task caching mirrors it so the UI shows reused stages as Cached: the cache key of a stage task
is its output directory, and a task whose marker is missing (or that is forced) runs with
`refresh_cache=True`, which overwrites the cache record. Stage code is imported inside the tasks, so
the flow module imports fast and a missing stage only fails when it is needed.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed, wait
from prefect.runtime import flow_run as runtime_flow_run

from common.atomic import MARKER_NAME, atomic_write_json, read_marker, remove_temp_files, write_marker
from common.errors import UserError
from common.tracking import WandbTarget
from pipelines.config import PipelineConfig, load_config
from pipelines.stage_keys import (
    FLOW_RECORDS,
    digest,
    finetune_checkpoints,
    finetune_unit_dir,
    run_root,
    stage_dirs,
    stage_key_inputs,
)
from pipelines.stage_plan import plan_stages

FLOW_NAME = "bert-pipeline"


# ----------------------------------------------------------------------------- task plumbing


def _cache_key(_ctx: Any, parameters: dict[str, Any]) -> str:
    """Prefect cache key of a stage task = its output directory (which embeds the stage key)."""
    return f"bertflow-{parameters['stage']}-{digest(parameters['out_dir'], 20)}"


def _retry_unless_user_error(_task: Any, _task_run: Any, state: Any) -> bool:
    """Bad input does not get better by retrying; everything else (OOM, lost worker, I/O) may."""
    return not isinstance(getattr(state, "data", None), UserError)


def _logger():
    return get_run_logger()


def _run_in_dir(stage: str, out_dir: str, body: Callable[[Path], dict[str, Any] | None]) -> dict[str, Any]:
    """Reuse a complete `out_dir`, else clear its leftovers, run `body`, and mark it complete."""
    out = Path(out_dir)
    marker = read_marker(out)
    if marker is not None:
        _logger().info("%s: reusing the complete output in %s", stage, out)
        return {"stage": stage, "out_dir": str(out), "status": "reused", "seconds": 0.0, "result": {}}
    out.mkdir(parents=True, exist_ok=True)
    remove_temp_files(out)
    started = time.time()
    result = body(out) or {}
    seconds = time.time() - started
    if read_marker(out) is None:  # stages that do not write their own marker
        write_marker(out, {"stage": stage, "seconds": round(seconds, 3)})
    _logger().info("%s: finished in %.1f s -> %s", stage, seconds, out)
    return {"stage": stage, "out_dir": str(out), "status": "ran", "seconds": seconds, "result": result}


_TASK_OPTIONS: dict[str, Any] = dict(
    cache_key_fn=_cache_key, persist_result=True, retry_condition_fn=_retry_unless_user_error
)


@task(name="verify-data", **_TASK_OPTIONS)
def verify_task(stage: str, out_dir: str, cfg: PipelineConfig) -> dict[str, Any]:
    from pipelines.verify_data import verify_data

    return _run_in_dir(stage, out_dir, lambda out: verify_data(cfg))


@task(name="tokenizer", **_TASK_OPTIONS)
def tokenizer_task(stage: str, out_dir: str, cfg: PipelineConfig) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from pipelines.stage_tokenizer import run_tokenizer_stage

        return {"tokenizer_dir": str(run_tokenizer_stage(cfg.tokenizer, out, data_root=cfg.data_root))}

    return _run_in_dir(stage, out_dir, body)


@task(name="preprocess", **_TASK_OPTIONS)
def preprocess_task(stage: str, out_dir: str, cfg: PipelineConfig, tokenizer_dir: str) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from pipelines.stage_preprocess import run_preprocess_stage

        stats = run_preprocess_stage(cfg.preprocess, Path(tokenizer_dir), out, data_root=cfg.data_root)
        return {"stats": _jsonable(stats)}

    return _run_in_dir(stage, out_dir, body)


@task(name="pretrain", **_TASK_OPTIONS)
def pretrain_task(
    stage: str, out_dir: str, cfg: PipelineConfig, shards_dir: str, tokenizer_dir: str, wandb: WandbTarget
) -> dict[str, Any]:
    logger = _logger()

    def body(out: Path) -> dict[str, Any]:
        from pipelines.stage_pretrain import run_pretrain_stage

        model_dir = run_pretrain_stage(
            cfg, Path(shards_dir), Path(tokenizer_dir), out, log_line=logger.info, wandb=wandb
        )
        return {"model_dir": str(model_dir)}

    return _run_in_dir(stage, out_dir, body)


# Fine-tuning units run in worker processes (each with its share of the CPU threads, or one GPU
# each), exactly as `bertflow finetune` runs them; the Prefect task waits for its unit's process.
_UNIT_POOLS: dict[str, Any] = {}


@task(name="finetune-unit", task_run_name="finetune-{unit_name}-{checkpoint_label}", **_TASK_OPTIONS)
def finetune_unit_task(
    stage: str,
    out_dir: str,
    cfg: PipelineConfig,
    unit: Any,
    unit_name: str,
    checkpoint_label: str,
    checkpoint: str,
    tokenizer_dir: str,
    pool_id: str,
    wandb: WandbTarget,
) -> dict[str, Any]:
    from finetuning.fanout import Job, _run_job

    out = Path(out_dir)
    started = time.time()
    job = Job(checkpoint, unit, out)
    future = _UNIT_POOLS[pool_id].submit(
        _run_job, cfg.finetune, job, Path(tokenizer_dir), cfg.data_root, wandb
    )
    result = future.result()
    if "error" in result:  # fail the task (retried, never cached); the other units go on
        raise RuntimeError(f"fine-tuning unit {unit_name} [{checkpoint_label}] failed: {result['error']}")
    _logger().info("%s [%s]: %s", unit_name, checkpoint_label, result.get("metrics"))
    return {
        "stage": stage,
        "unit": unit_name,
        "checkpoint_label": checkpoint_label,
        "out_dir": str(out),
        "seconds": time.time() - started,
        "result": _jsonable(result),
    }


@task(name="scorecard", **_TASK_OPTIONS)
def scorecard_task(
    stage: str, out_dir: str, results: list[dict[str, Any]], wandb: WandbTarget
) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from common.tracking import Tracker
        from finetuning.scorecard import build_scorecard

        tracker = Tracker(out, wandb, job_type="scorecard", name="scorecard")
        try:
            card = build_scorecard(results, out, tracker=tracker)
        finally:
            tracker.finish()
        return {"scorecard": _jsonable(card)}

    return _run_in_dir(stage, out_dir, body)


@task(name="report", **_TASK_OPTIONS)
def report_task(
    stage: str, out_dir: str, cfg: PipelineConfig, record_path: str, wandb: WandbTarget
) -> dict[str, Any]:
    def body(out: Path) -> dict[str, Any]:
        from pipelines.report_builder import build_report

        paths = build_report(cfg, out, record_path=Path(record_path), wandb=wandb)
        return {k: str(v) for k, v in paths.items()}

    return _run_in_dir(stage, out_dir, body)


# ----------------------------------------------------------------------------- the flow


def _clear(directory: Path) -> None:
    """Forget a stage output: marker first (a kill midway leaves it incomplete), then the rest."""
    (directory / MARKER_NAME).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _stage_state(state: Any) -> str:
    """Prefect state → 'cached' (Prefect skipped the task: cache hit) or 'ran'."""
    return "cached" if state.name == "Cached" else "ran"


@flow(name=FLOW_NAME, log_prints=True)
def bert_pipeline(
    config: str | None = "configs/default.yaml",
    overrides: list[str] | None = None,
    only: str | None = None,
    from_stage: str | None = None,
    force: list[str] | None = None,
) -> dict[str, Any]:
    """Run the pipeline for one YAML config (+ `section.key=value` overrides)."""
    logger = _logger()
    cfg = load_config(config, overrides)
    selected, forced = plan_stages(only, from_stage, force)
    dirs = stage_dirs(cfg)
    key_inputs = stage_key_inputs(cfg)
    root = run_root(cfg)
    run_name = str(runtime_flow_run.name or "local")
    group = f"{cfg.name}-{run_name}"
    wandb = cfg.wandb.target(group)  # one W&B group per flow run, passed to every run of it
    logger.info(
        "run dir %s; stages %s; forced %s; W&B group %s", root, selected, sorted(forced) or "-", group
    )

    records: list[dict[str, Any]] = []
    started_flow = time.time()

    def call(stage: str, task_fn: Any, **kwargs: Any) -> dict[str, Any]:
        out = dirs[stage]
        if stage in forced:
            logger.info("%s: forced, clearing %s", stage, out)
            _clear(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "stage_key.json", key_inputs[stage])
        complete = read_marker(out) is not None
        opts = dict(
            refresh_cache=not complete,
            retries=cfg.flow.retries,
            retry_delay_seconds=cfg.flow.retry_delay_seconds,
        )
        t0 = time.time()
        state = task_fn.with_options(**opts)(stage=stage, out_dir=str(out), return_state=True, **kwargs)
        value = state.result()  # raises the stage's exception if it failed (after retries)
        status = _stage_state(state) if value.get("status") != "reused" else "reused"
        records.append(
            {
                "stage": stage,
                "key": out.name,
                "out_dir": str(out),
                "status": status,
                "seconds": round(time.time() - t0, 3),
                "compute_seconds": round(float(value.get("seconds", 0.0)), 3),
            }
        )
        return value

    def need(stage: str) -> Path:
        """The output of an upstream stage that this run does not execute: it must be complete."""
        out = dirs[stage]
        if read_marker(out) is None:
            raise UserError(
                f"stage {stage!r} has no complete output for this config ({out}).",
                fix=f"run it first: `bertflow run CONFIG --only {stage}` or the whole flow without --only.",
            )
        return out

    def wanted(stage: str) -> bool:
        return stage in selected

    if wanted("verify"):
        call("verify", verify_task, cfg=cfg)
    tokenizer_dir = dirs["tokenizer"]
    if wanted("tokenizer"):
        call("tokenizer", tokenizer_task, cfg=cfg)
    elif any(wanted(s) for s in ("preprocess", "pretrain", "finetune")):
        need("tokenizer")
    if wanted("preprocess"):
        call("preprocess", preprocess_task, cfg=cfg, tokenizer_dir=str(tokenizer_dir))
    elif wanted("pretrain"):
        need("preprocess")
    model_dir: Path | None = None
    if wanted("pretrain"):
        value = call(
            "pretrain",
            pretrain_task,
            cfg=cfg,
            shards_dir=str(dirs["preprocess"]),
            tokenizer_dir=str(tokenizer_dir),
            wandb=wandb,
        )
        model_dir = Path(value.get("result", {}).get("model_dir") or dirs["pretrain"] / "model")
    if wanted("finetune"):
        if model_dir is None:
            model_dir = need("pretrain") / "model"
        _finetune_fanout(cfg, dirs, forced, model_dir, tokenizer_dir, records, call, wandb)
    record_path = _write_record(root, run_name, group, records, started_flow)
    report_md: Path | None = None
    if wanted("report"):
        if not wanted("finetune"):
            need("finetune")
        value = call("report", report_task, cfg=cfg, record_path=str(record_path), wandb=wandb)
        report_md = dirs["report"] / "report.md"
        _write_record(root, run_name, group, records, started_flow, path=record_path)
        if report_md.is_file():
            create_markdown_artifact(
                markdown=report_md.read_text(encoding="utf-8"),
                key=f"bert-report-{cfg.name}".lower().replace("_", "-"),
                description=f"BERT pipeline report for config {cfg.name!r} ({dirs['report']})",
            )
    summary = {
        "run_dir": str(root),
        "flow_run": run_name,
        "wandb_group": group,
        "stages": records,
        "record": str(record_path),
        "report_md": str(report_md) if report_md else None,
        "report_html": str(report_md.with_suffix(".html")) if report_md else None,
    }
    logger.info("done in %.1f s; report: %s", time.time() - started_flow, summary["report_html"])
    return summary


def _finetune_fanout(
    cfg: PipelineConfig,
    dirs: dict[str, Path],
    forced: set[str],
    model_dir: Path,
    tokenizer_dir: Path,
    records: list[dict[str, Any]],
    call: Callable[..., dict[str, Any]],
    wandb: WandbTarget,
) -> None:
    """Map the fine-tuning units over (ours + baselines), at most `finetune.concurrency` at a time,
    then build the scorecard (a stage task of its own, keyed by the finetune stage key)."""
    from finetuning.units import finetune_units

    logger = _logger()
    jobs = []
    for unit in finetune_units(cfg.finetune):
        for label, checkpoint in finetune_checkpoints(cfg, model_dir):
            jobs.append((unit, label, checkpoint, finetune_unit_dir(cfg, unit.name, label)))
    if "finetune" in forced:
        for *_, unit_dir in jobs:
            _clear(unit_dir)
    from finetuning.fanout import unit_pool

    pool, workers = unit_pool(cfg.finetune.concurrency, len(jobs), cfg.finetune.threads)
    pool_id = f"{id(pool)}"
    _UNIT_POOLS[pool_id] = pool
    logger.info("finetune: %d units, %d worker process(es)", len(jobs), workers)
    t0 = time.time()
    in_flight: list[Any] = []
    futures: list[Any] = []
    try:
        for unit, label, checkpoint, unit_dir in jobs:
            if len(in_flight) >= workers:  # bounded fan-out: wait for a free slot
                first = next(as_completed(in_flight))
                in_flight = [f for f in in_flight if f is not first]
            unit_dir.mkdir(parents=True, exist_ok=True)
            task_fn = finetune_unit_task.with_options(
                refresh_cache=read_marker(unit_dir) is None,
                retries=cfg.flow.retries,
                retry_delay_seconds=cfg.flow.retry_delay_seconds,
            )
            future = task_fn.submit(
                stage="finetune-unit",
                out_dir=str(unit_dir),
                cfg=cfg,
                unit=unit,
                unit_name=unit.name,
                checkpoint_label=label,
                checkpoint=checkpoint,
                tokenizer_dir=str(tokenizer_dir),
                pool_id=pool_id,
                wandb=wandb,
            )
            in_flight.append(future)
            futures.append(future)
        wait(futures)
    finally:
        _UNIT_POOLS.pop(pool_id, None)
        pool.shutdown(wait=True, cancel_futures=True)
    failed = [f for f in futures if not f.state.is_completed()]
    if failed:  # finished units stay complete on disk; the next run retries only the failed ones
        raise RuntimeError(
            f"{len(failed)} of {len(futures)} fine-tuning units failed (see their task logs); "
            "rerun the same command to retry them."
        )
    results = []
    ran = cached = 0
    for future in futures:
        value = future.result()
        if future.state.name == "Cached":
            cached += 1
        else:
            ran += 1
        results.append(value["result"])
    records.append(
        {
            "stage": "finetune-units",
            "key": "-",
            "out_dir": str(run_root(cfg) / "finetune" / "units"),
            "status": f"{ran} ran, {cached} cached",
            "seconds": round(time.time() - t0, 3),
            "compute_seconds": round(sum(f.result()["seconds"] for f in futures), 3),
        }
    )
    call("finetune", scorecard_task, results=results, wandb=wandb)


def _write_record(
    root: Path,
    run_name: str,
    group: str,
    records: list[dict[str, Any]],
    started: float,
    path: Path | None = None,
) -> Path:
    """What this flow run did, stage by stage (the report's timing and cache-hit table)."""
    if path is None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
        path = root / FLOW_RECORDS / f"{stamp}-{run_name}.json"
    atomic_write_json(
        path,
        {
            "flow_run": run_name,
            "wandb_group": group,
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
            "seconds": round(time.time() - started, 3),
            "stages": records,
        },
    )
    return path
