"""The report stage: one page a person reads top to bottom, the result first and then the evidence
(`pipelines/report_sections.py`), for one config's run directory.

Writes `report.md`, `report.html` (rendered from the same markdown, so the two never disagree; links
and images relative to it) and `report_embedded.md` (self-contained: images inline, absolute paths,
what the flow publishes as its Prefect artifact, whose page lives at a UI address where relative
links mean nothing), plus the PNG curves. Used by the flow's report task and by `bertflow report`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_text
from common.stage_output import has_model
from common.tracking import Tracker, WandbTarget, read_metrics
from model.model_card import CardFacts, verdict
from pipelines.config import PipelineConfig
from pipelines.flow_records import latest_record
from pipelines.report_plots import PANELS, plot_curves
from pipelines.report_sections import (
    Links,
    data_section,
    finished_stages,
    phases_section,
    pretraining_section,
    result_section,
    scorecard_section,
    stages_section,
    wandb_section,
)
from pipelines.stage_keys import base_stage, phase_names, phase_stage, run_root, stage_dirs

EMBEDDED_NAME = "report_embedded.md"
# what the report writes into its folder (`refuse_foreign_files`; report_embedded.md, which only
# the report writes, is the sign of a partial report written there before, which has no marker)
OUTPUT_NAMES = ("report.md", "report.html", EMBEDDED_NAME, *(f"{p[0]}.png" for p in PANELS), "wandb_files")


def wandb_run_dirs(directories: list[Path]) -> list[Path]:
    """Every W&B run folder (offline-run-*/run-*) that a stage's Tracker left under these dirs, in
    the order of `directories` (the flow's), each directory's by name (until 2026-11-28 all sorted
    by path: the page listed finetune first, then its units, preprocess, pretrain, report, ...)."""
    found: dict[Path, None] = {}
    for d in directories:
        if d.is_dir():
            found.update(
                dict.fromkeys(p for p in sorted(d.glob("**/wandb_files/wandb/*run-*")) if p.is_dir())
            )
    return list(found)


def _unit_dirs(cfg: PipelineConfig, model_dir: Path) -> list[Path]:
    """The fine-tuning unit directories of the flow's plan (none when there is nothing to plan)."""
    from common.errors import UserError
    from pipelines.stage_finetune import flow_plan

    try:
        return [job.out_dir for job in flow_plan(cfg, model_dir, stage_dirs(cfg)["tokenizer"])]
    except UserError:  # no / unknown tasks, no model: nothing was fine-tuned, nothing to link
        return []


@dataclass
class ReportInputs:
    """Everything the page shows, read once from the run directory."""

    cfg: PipelineConfig
    out_dir: Path
    record: dict[str, Any]
    scorecard: dict[str, Any] | None
    card: CardFacts | None  # the pretraining facts (as in the model card)
    rows: list[dict[str, Any]]  # pretraining metrics.jsonl
    plots: dict[str, Path]
    wandb_runs: list[Path]
    phases: list[tuple[str, CardFacts | None, Path]]  # (name, facts, output) per pretraining phase


def gather(cfg: PipelineConfig, out_dir: Path, record: dict[str, Any]) -> ReportInputs:
    dirs = stage_dirs(cfg)
    rows = read_metrics(dirs["pretrain"])
    card = _card(dirs["pretrain"])
    phases = [
        (
            name or "main",
            _card(dirs[phase_stage("pretrain", name)]) if name else card,
            dirs[phase_stage("pretrain", name)],
        )
        for name in phase_names(cfg)
    ]
    score_path = dirs["finetune"] / "scorecard.json"
    scorecard = json.loads(score_path.read_text()) if score_path.is_file() else None
    search = [dirs[s] for s in dirs if base_stage(s) in ("verify", "tokenizer", "preprocess", "pretrain")]
    # in the flow's order: the units, then the scorecard made from them, then this report
    search += _unit_dirs(cfg, dirs["pretrain"] / "model") + [dirs["finetune"], out_dir]
    baselines = card.evaluation.baselines if card is not None and card.evaluation is not None else None
    plots = plot_curves(rows, out_dir, baselines)
    return ReportInputs(cfg, out_dir, record, scorecard, card, rows, plots, wandb_run_dirs(search), phases)


def _card(pretrain_dir: Path) -> CardFacts | None:
    """The facts of a complete pretraining output (None while it has no model)."""
    if not (pretrain_dir / "run_spec.json").is_file() or not has_model(pretrain_dir):
        return None
    from pipelines.pretrain_card import pretraining_card

    return pretraining_card(pretrain_dir)


def render_markdown(inputs: ReportInputs, links: Links) -> str:
    cfg, dirs = inputs.cfg, stage_dirs(inputs.cfg)
    lines = [
        f"# {cfg.report.title}",
        "",
        f"Config **{cfg.name}** · model **{cfg.model.preset or 'of pretrain.init_from'}** · corpus "
        f"{' '.join(f'`{p}`' for p in cfg.preprocess.input)} · run directory `{links.root}` · generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "",
    ]
    lines += result_section(inputs.scorecard, inputs.card, dirs["pretrain"] / "model", inputs.record, links)
    lines += scorecard_section(inputs.scorecard, dirs["finetune"] / "scorecard.md", links)
    lines += pretraining_section(inputs.rows, inputs.card, inputs.plots, dirs["pretrain"], links)
    lines += phases_section(inputs.phases, links)
    lines += data_section(dirs["preprocess"] / "stats.json", links)
    lines += stages_section(inputs.record, inputs.out_dir, links)
    lines += wandb_section(inputs.wandb_runs, links.root, links)
    return "\n".join(lines) + "\n"


HTML_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1000px;
       margin: 2em auto; padding: 0 1em; color: #1f2328; line-height: 1.5; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.92em; }}
th, td {{ border: 1px solid #d0d7de; padding: 4px 10px; }}
th {{ background: #f6f8fa; }}
tr:nth-child(even) td {{ background: #fbfcfd; }}
code, pre {{ background: #f6f8fa; border-radius: 4px; padding: 1px 4px; font-size: 0.9em; }}
pre {{ padding: 8px; overflow-x: auto; }}
img {{ max-width: 49.5%; border: 1px solid #eee; margin: 2px 0; vertical-align: top; }}
blockquote {{ margin: 0.5em 0 1.2em; padding: 0.4em 1.2em; background: #f1f8ff;
             border-left: 5px solid #0969da; border-radius: 4px; font-size: 1.05em; }}
td:not(:first-child) {{ font-variant-numeric: tabular-nums; }}
h1 {{ border-bottom: 2px solid #d0d7de; }} h2 {{ border-bottom: 1px solid #d0d7de; margin-top: 1.6em; }}
</style></head><body>
{body}
</body></html>
"""


def render_html(markdown_text: str, title: str) -> str:
    from html import escape

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown_text)
    return HTML_TEMPLATE.format(title=escape(title), body=body)


def build_report(
    cfg: PipelineConfig, out_dir: Path, record_path: Path | None = None, wandb: WandbTarget | None = None
) -> dict[str, Path]:
    """Write report.md, report.html, report_embedded.md and the PNG curves into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if record_path is not None and Path(record_path).is_file():
        record = json.loads(Path(record_path).read_text())
    else:
        _, record = latest_record(run_root(cfg), stage_dirs(cfg)["finetune"])
    tracker = _tracker(cfg, out_dir, record, wandb)  # first: the page lists the report's own run
    try:
        inputs = gather(cfg, out_dir, record)
        if tracker is not None:
            _track(tracker, inputs)
    finally:
        if tracker is not None:
            tracker.finish()
    root = run_root(cfg)
    md = render_markdown(inputs, Links(out_dir, root))
    atomic_write_text(out_dir / "report.html", render_html(md, cfg.report.title))
    atomic_write_text(out_dir / EMBEDDED_NAME, render_markdown(inputs, Links(out_dir, root, embed=True)))
    atomic_write_text(out_dir / "report.md", md)
    return {
        "report_md": out_dir / "report.md",
        "report_html": out_dir / "report.html",
        "report_embedded": out_dir / EMBEDDED_NAME,
        **inputs.plots,
    }


def _tracker(
    cfg: PipelineConfig, out_dir: Path, record: dict[str, Any], wandb: WandbTarget | None
) -> Tracker | None:
    """The report stage's own W&B run (None when W&B is disabled). Alone (`bertflow report`), it
    joins the group of the flow run it reports on."""
    wandb = wandb or cfg.wandb.target(group=record.get("wandb_group"))
    if wandb.resolved_mode() == "disabled":
        return None
    settings = cfg.report.model_dump(mode="json")
    return Tracker(out_dir, wandb, name="report", job_type="report", config=settings)


def _track(tracker: Tracker, inputs: ReportInputs) -> None:
    """The stage table, so the group shows timings and cache hits, and a summary of what the page
    says first: the verdict, the held-out MLM figures against the no-context baselines, each stage's
    compute time as the page's table shows it (a cached stage's is the time that computed it, not
    the moment it took to find it)."""
    from finetuning.scorecard import headline_text

    stages = finished_stages(inputs.record)
    tracker.log_table(
        "stages",
        ["stage", "key", "status", "seconds", "compute_seconds"],
        [[r["stage"], r["key"], r["status"], r["seconds"], r.get("compute_seconds", 0.0)] for r in stages],
    )
    values: dict[str, Any] = {
        f"compute_seconds/{r['stage']}": r["compute_seconds"] for r in stages if "compute_seconds" in r
    }
    if inputs.scorecard is not None:
        values["result/verdict"] = headline_text(inputs.scorecard.get("headline"))
    if inputs.card is not None and (e := inputs.card.evaluation) is not None:
        values.update(
            {f"pretrain/{k}": e.metrics[k] for k in ("val_mlm_acc", "val_mlm_loss") if k in e.metrics}
        )
        values.update({f"pretrain/baseline/{k}": v for k, v in e.baselines.items()})
        values["pretrain/verdict"] = verdict(e)
    tracker.summary(values)
