"""The Prefect flow `bert-pipeline`, top to bottom: verify data → tokenizer → preprocess → pretrain →
fine-tuning units → scorecard → report. A config with `phases:` pretrains in phases (BERT's 128
tokens, then 512): preprocess@NAME → pretrain@NAME for each, then the main preprocess → pretrain,
each phase starting from the model of the one before.

Each stage is a Prefect task (`pipelines/flow_tasks.py`) writing `run_dir/<stage>/<key>/`
(`pipelines/stage_keys.py`) and taking its upstream stages' outputs as inputs, so Prefect records
the graph; `pipelines/flow_run.py` decides which stages run (`--only`, `--from`, `--force`), reuses
complete ones and records what happened (`pipelines/flow_records.py`). Every W&B run of one flow
run goes to the config's project and entity, in the group `<config name>-<flow run name>`.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run as runtime_flow_run

from pipelines.beam_console import drop_import_chatter
from pipelines.config import load_config
from pipelines.flow_preflight import corpus_mismatch_note
from pipelines.flow_run import FlowRun
from pipelines.flow_tasks import (
    finetune_unit_task,
    preprocess_task,
    pretrain_task,
    report_task,
    scorecard_task,
    tokenizer_task,
    verify_task,
)
from pipelines.prefect_killed_runs import cancel_a_stop_before_its_record, crash_killed_runs
from pipelines.prefect_logging import install_log_filters
from pipelines.report_builder import EMBEDDED_NAME
from pipelines.stage_keys import complete, phase_names, phase_stage
from pipelines.stage_plan import flow_inputs
from pipelines.stage_pretrain import cpu_run_note

FLOW_NAME = "bert-pipeline"
# before the flow function runs: a stop as a flow run starts is said as a stop too
install_log_filters()


@flow(name=FLOW_NAME, log_prints=True, on_crashed=[cancel_a_stop_before_its_record])
def bert_pipeline(
    config: str | None = "configs/default.yaml",
    overrides: list[str] | None = None,
    only: str | list[str] | None = None,
    from_stage: str | None = None,
    force: list[str] | None = None,
) -> dict[str, Any]:
    """Run the pipeline for one YAML config (+ `section.key=value` overrides)."""
    drop_import_chatter()  # a deployment's worker calls this function without the CLI
    install_log_filters()
    cfg = load_config(config, overrides)
    flow_run_id = str(runtime_flow_run.id) if runtime_flow_run.id else None
    run = FlowRun(cfg, str(runtime_flow_run.name or "local"), only, from_stage, force, flow_run_id)
    crash_killed_runs(run.root, run.run_name, get_run_logger().info)  # they stayed Running in Prefect
    get_run_logger().info(
        "run dir %s; stages %s; forced %s; W&B group %s",
        run.root, run.selected, sorted(run.forced) or "-", run.group,
    )  # fmt: skip
    if (
        run.wanted("pretrain")
        and not complete("pretrain", run.dirs["pretrain"])
        and (note := cpu_run_note(cfg))
    ):
        get_run_logger().warning(note)  # before hours of tokenizing and preprocessing
    if run.wanted("tokenizer") and not complete("tokenizer", run.dirs["tokenizer"]):
        if note := corpus_mismatch_note(cfg):
            get_run_logger().warning(note)

    with run.recorded():
        run.stage("verify", verify_task, cfg=cfg, wandb=run.wandb)
        run.stage("tokenizer", tokenizer_task, after=("verify",), cfg=cfg, wandb=run.wandb)
        # the pretraining phases (`phases:`, then the main one; most configs: only it), each
        # starting from the model of the one before
        inputs = flow_inputs(cfg)  # each stage's upstream outputs: task parameter -> stage
        previous: tuple[str, ...] = ()
        for index, phase in enumerate(phase_names(cfg)):
            prep, pre = phase_stage("preprocess", phase), phase_stage("pretrain", phase)
            phase_cfg = cfg.phase_config(index)
            run.stage(prep, preprocess_task, upstream=inputs[prep], cfg=phase_cfg, wandb=run.wandb)
            run.stage(
                pre, pretrain_task, upstream=inputs[pre], after=previous, cfg=phase_cfg, wandb=run.wandb
            )
            previous = (pre,)
        run.fan_out(finetune_unit_task, upstream=inputs["units"])
        run.stage("finetune", scorecard_task, upstream=inputs["finetune"], cfg=cfg, wandb=run.wandb)
        record = run.write_record()
        run.stage(
            "report",
            report_task,
            upstream=inputs["report"],
            cfg=cfg,
            record_path=str(record),
            wandb=run.wandb,
        )

    return _summary(run, cfg.name)


def _summary(run: FlowRun, config_name: str) -> dict[str, Any]:
    report_md = run.dirs["report"] / "report.md" if run.wanted("report") else None
    embedded = report_md.parent / EMBEDDED_NAME if report_md is not None else None
    if embedded is not None and embedded.is_file():  # self-contained: a UI page has no files beside it
        create_markdown_artifact(
            markdown=embedded.read_text(encoding="utf-8"),
            key=f"bert-report-{config_name}".lower().replace("_", "-"),
            description=f"BERT pipeline report for config {config_name!r} ({report_md.parent})",
        )
    summary = {
        "run_dir": str(run.root),
        "flow_run": run.run_name,
        "flow_run_id": run.flow_run_id,
        "task_run_ids": run.task_run_ids(),
        "wandb_group": run.group,
        "stages": run.records,
        "record": str(run.record_path),
        "report_md": str(report_md) if report_md else None,
        "report_html": str(report_md.with_suffix(".html")) if report_md else None,
    }
    from pipelines.flow_command import end_summary

    # what `bertflow run` prints at its end, for a watcher of the Prefect UI too (any --only run)
    create_markdown_artifact(
        markdown=f"```text\n{end_summary(summary)}\n```",
        key=f"bert-run-{config_name}".lower().replace("_", "-"),
        description=f"flow run {run.run_name}: its stages (ran or reused), the result and where the outputs are",
    )
    report = summary["report_html"] or "none (the report stage was not selected)"
    get_run_logger().info("done in %.1f s; report: %s", time.time() - run.started, report)
    return summary
