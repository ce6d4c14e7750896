"""The report stage: `report.md` + `report.html` (+ PNG curves) for one config's run directory.

Contents: the stages of the last flow run with their keys, timings and cache hits; the pretraining
curves and final figures; the preprocessing statistics; the fine-tuning scorecard; the W&B run
directories with the `wandb sync` command. The HTML is rendered from the same markdown, so the two
never disagree. Used by the flow's report task and by `bertflow report CONFIG`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_text
from common.tracking import WandbTarget, read_metrics
from pipelines.config import PipelineConfig
from pipelines.flow_records import latest_record
from pipelines.report_plots import plot_curves
from pipelines.stage_keys import run_root, stage_dirs


def wandb_run_dirs(directories: list[Path]) -> list[Path]:
    """Every W&B run folder (offline-run-*/run-*) that a stage's Tracker left under these dirs."""
    found: set[Path] = set()
    for d in directories:
        if d.is_dir():
            found.update(p for p in d.glob("**/wandb_files/wandb/*run-*") if p.is_dir())
    return sorted(found)


def _unit_dirs(cfg: PipelineConfig, model_dir: Path) -> list[Path]:
    """The fine-tuning unit directories of the flow's plan (none when there is nothing to plan)."""
    from common.errors import UserError
    from pipelines.stage_finetune import flow_plan

    try:
        return [job.out_dir for job in flow_plan(cfg, model_dir, stage_dirs(cfg)["tokenizer"])]
    except UserError:  # no / unknown tasks, no model: nothing was fine-tuned, nothing to link
        return []


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def _last_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for row in rows:
        for k, v in row.items():
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool):
                last[k] = (row.get("step"), v)
    return last


def _demote_headings(md: str, levels: int = 2) -> str:
    out = []
    for line in md.splitlines():
        out.append("#" * levels + line if line.startswith("#") else line)
    return "\n".join(out)


def render_markdown(
    cfg: PipelineConfig, out_dir: Path, record: dict[str, Any], plots: dict[str, Path]
) -> str:
    dirs = stage_dirs(cfg)
    root = run_root(cfg)
    lines = [
        f"# {cfg.report.title}",
        "",
        f"Config **{cfg.name}** · model preset **{cfg.model.preset}** · run directory `{root}` · "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "",
    ]
    # --- stages
    lines += ["## Stages", ""]
    if record:
        lines += [
            f"Flow run **{record.get('flow_run')}** started {record.get('started_utc')} UTC, W&B group "
            f"`{record.get('wandb_group')}`. *ran* = computed in this flow run; *cached* = Prefect "
            "cache hit (the stage's completed output was found); *reused* = completed output found "
            "on disk (e.g. written by the stage command alone).",
            "",
            "| stage | key | status | wall s | compute s | output |",
            "|---|---|---|---:|---:|---|",
        ]
        for r in record.get("stages", []):
            out = Path(r["out_dir"])
            lines.append(
                f"| {r['stage']} | `{r['key']}` | {r['status']} | {r['seconds']:.1f} | "
                f"{r.get('compute_seconds', 0.0):.1f} | [{_rel(out, root)}]({_rel(out, out_dir)}) |"
            )
        cached = sum(1 for r in record.get("stages", []) if r["status"] in ("cached", "reused"))
        lines += ["", f"Cache hits: {cached} of {len(record.get('stages', []))} stage tasks.", ""]
    else:
        lines += ["No flow-run record found (stages were run one by one).", ""]
    # --- preprocessing
    stats_path = dirs["preprocess"] / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        scalars = {
            k: v for k, v in stats.items() if isinstance(v, int | float | str) and not isinstance(v, bool)
        }
        if scalars:
            lines += ["## Preprocessing", "", "| statistic | value |", "|---|---:|"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in scalars.items()]
            lines.append("")
    # --- pretraining
    lines += ["## Pretraining", ""]
    rows = read_metrics(dirs["pretrain"])
    if rows:
        last = _last_values(rows)
        lines += [
            f"{len(rows)} logged rows from `{_rel(dirs['pretrain'] / 'metrics.jsonl', root)}`; the model "
            f"(Hugging Face format) is in [{_rel(dirs['pretrain'] / 'model', root)}]"
            f"({_rel(dirs['pretrain'] / 'model', out_dir)}).",
            "",
            "| metric | last value | at step |",
            "|---|---:|---:|",
        ]
        lines += [f"| {k} | {_fmt(v)} | {s} |" for k, (s, v) in sorted(last.items())]
        lines.append("")
        for stem, path in plots.items():
            lines += [f"![{stem}]({_rel(path, out_dir)})", ""]
    else:
        lines += [f"No pretraining metrics found in `{dirs['pretrain']}`.", ""]
    # --- fine-tuning
    lines += ["## Fine-tuning scorecard", ""]
    card = dirs["finetune"] / "scorecard.md"
    if card.is_file():
        lines += [_demote_headings(card.read_text(encoding="utf-8").strip()), ""]
        lines += [f"Source: [{_rel(card, root)}]({_rel(card, out_dir)}).", ""]
    else:
        lines += [f"No scorecard found in `{dirs['finetune']}`.", ""]
    # --- W&B
    lines += ["## Weights & Biases runs", ""]
    search = [dirs[s] for s in ("tokenizer", "preprocess", "pretrain", "finetune")]
    search += _unit_dirs(cfg, dirs["pretrain"] / "model") + [out_dir]
    runs = wandb_run_dirs(search)
    if runs:
        lines += [f"- [{_rel(p, root)}]({_rel(p, out_dir)})" for p in runs]
        lines += [
            "",
            "Runs are offline unless `WANDB_MODE=online` and `WANDB_API_KEY` are set. Upload them with:",
            "",
            "```bash",
            f"wandb sync {root}/*/*/wandb_files/wandb/offline-run-* {root}/finetune/units/*/wandb_files/wandb/offline-run-*",
            "```",
            "",
        ]
    else:
        lines += ["No W&B run directories found (W&B disabled?).", ""]
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
img {{ max-width: 100%; border: 1px solid #eee; margin: 4px 0; }}
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
    """Write report.md, report.html and the PNG curves into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if record_path is not None and Path(record_path).is_file():
        record = json.loads(Path(record_path).read_text())
    else:
        _, record = latest_record(run_root(cfg))
    _track(cfg, out_dir, record, wandb)
    plots = plot_curves(read_metrics(stage_dirs(cfg)["pretrain"]), out_dir)
    md = render_markdown(cfg, out_dir, record, plots)
    atomic_write_text(out_dir / "report.html", render_html(md, cfg.report.title))
    atomic_write_text(out_dir / "report.md", md)
    return {"report_md": out_dir / "report.md", "report_html": out_dir / "report.html", **plots}


def _track(cfg: PipelineConfig, out_dir: Path, record: dict[str, Any], wandb: WandbTarget | None) -> None:
    """The report stage's own W&B run: the stage table, so the group shows timings and cache hits.
    Alone (`bertflow report`), it joins the group of the flow run it reports on."""
    wandb = wandb or cfg.wandb.target(group=record.get("wandb_group"))
    if wandb.resolved_mode() == "disabled":
        return
    from common.tracking import Tracker

    tracker = Tracker(out_dir, wandb, name="report", job_type="report")
    try:
        stages = record.get("stages", [])
        tracker.log_table(
            "stages",
            ["stage", "key", "status", "seconds", "compute_seconds"],
            [
                [r["stage"], r["key"], r["status"], r["seconds"], r.get("compute_seconds", 0.0)]
                for r in stages
            ],
        )
        tracker.summary({f"seconds/{r['stage']}": r["seconds"] for r in stages})
    finally:
        tracker.finish()
