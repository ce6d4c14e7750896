"""The report's sections as markdown, in reading order: the result first, then the evidence.

1. Result: the fine-tuning headline (pretrained vs random init), the pretraining verdict (held-out
   masked-LM accuracy next to what a model without context scores), where the model is.
2. Fine-tuning scorecard (`finetuning/scorecard.py` tables).
3. Pretraining: held-out figures, curves, the last logged figures with units and meanings.
4. Data: the preprocessing statistics, nested ones included.
5. How the run went: every stage's status and time, the report's own row, the total.
6. W&B runs and the `wandb sync` command.

Every file reference goes through `Links`, so the same text serves report.md/report.html (links
relative to the report) and the Prefect artifact (shown at a UI address, where a relative link
means nothing: absolute paths as text, images embedded).
"""

from __future__ import annotations

import base64
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.progress import duration_text
from model.model_card import CardFacts, quality_lines, steps_text, verdict
from pipelines.flow_records import found_complete
from pipelines.run_history import in_run_dir


@dataclass
class Links:
    out_dir: Path  # the report directory
    root: Path  # the run directory (link texts are relative to it)
    embed: bool = False  # True: the Prefect artifact (no relative links; images inline)

    def rel(self, path: Path) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def file(self, path: Path, text: str | None = None) -> str:
        if self.embed:
            return f"`{path}`"
        target = os.path.relpath(path, self.out_dir).replace(os.sep, "/")
        return f"[{text or self.rel(path)}]({target})"

    def image(self, path: Path, alt: str) -> str:
        if self.embed:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            return f"![{alt}](data:image/png;base64,{data})"
        return f"![{alt}]({os.path.relpath(path, self.out_dir).replace(os.sep, '/')})"


def duration(seconds: float | None) -> str:
    return "—" if seconds is None else duration_text(seconds)


# ----------------------------------------------------------------------------- 1. result


def result_section(
    scorecard: dict[str, Any] | None,
    card: CardFacts | None,
    model_dir: Path,
    record: dict[str, Any],
    links: Links,
) -> list[str]:
    from finetuning.scorecard import headline_text

    lines = ["## Result", ""]
    if scorecard is not None:
        lines += ["> " + line for line in headline_text(scorecard.get("headline")).split("\n")]
    else:
        lines += ["> No fine-tuning scorecard yet (the finetune stage has not completed)."]
    if card is not None and card.evaluation is not None:
        e = card.evaluation
        steps = steps_text([*card.steps_before, card.training.steps if card.training else e.step])
        m, b = e.metrics, e.baselines
        lines += [
            ">",
            f"> **Pretraining ({steps} steps):** held-out masked-LM accuracy "
            f"{_pct(m.get('val_mlm_acc'))} (always the most frequent token: "
            f"{_pct(b.get('most_frequent_token_acc'))}), loss {m.get('val_mlm_loss', math.nan):.2f} nats "
            f"(unigram entropy: {b.get('unigram_entropy', math.nan):.2f}). {verdict(e)}",
        ]
    if model_dir.is_dir():
        card_link = (
            links.file(model_dir / "README.md", "README.md") if (model_dir / "README.md").is_file() else ""
        )
        lines += [
            ">",
            f"> **Model:** {links.file(model_dir)}" + (f" (model card: {card_link})" if card_link else ""),
        ]
    if record:
        lines += [
            ">",
            f"> **Run:** flow run `{record.get('flow_run')}`, started {record.get('started_utc')} UTC, "
            f"{duration(record.get('seconds'))} up to this report.",
        ]
    return [*lines, ""]


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


# ----------------------------------------------------------------------------- 2. scorecard


def scorecard_section(scorecard: dict[str, Any] | None, source: Path, links: Links) -> list[str]:
    from finetuning.scorecard import card_columns, render_tables

    lines = ["## Fine-tuning scorecard", ""]
    if scorecard is None:
        return [*lines, f"No scorecard in `{source.parent}`.", ""]
    body = render_tables(scorecard, card_columns(scorecard), heading="###")
    return [*lines, body, f"Source: {links.file(source)} (+ scorecard.json).", ""]


# ----------------------------------------------------------------------------- 3. pretraining

# metric -> (meaning, unit, scale): shown as value * scale
PRETRAIN_METRICS: dict[str, tuple[str, str, float]] = {
    "val_mlm_acc": ("held-out masked-LM accuracy", "%", 100.0),
    "val_mlm_loss": ("held-out masked-LM loss", "nats", 1.0),
    "val_nsp_acc": ("held-out next-sentence accuracy", "%", 100.0),
    "val_nsp_loss": ("held-out next-sentence loss", "nats", 1.0),
    "loss": ("training loss, masked-LM + next-sentence", "nats", 1.0),
    "mlm_loss": ("training masked-LM loss", "nats", 1.0),
    "nsp_loss": ("training next-sentence loss", "nats", 1.0),
    "mlm_acc": ("training masked-LM accuracy (last logged batches)", "%", 100.0),
    "nsp_acc": ("training next-sentence accuracy (last logged batches)", "%", 100.0),
    "lr": ("learning rate of the last step", "", 1.0),
    "grad_norm": ("gradient norm before clipping", "", 1.0),
    "loss_scale": ("fp16 loss scale (1 without fp16)", "", 1.0),
    "samples_per_s": ("throughput, all ranks", "sequences/s", 1.0),
    "tokens_per_s": ("throughput, all ranks, padding excluded", "tokens/s", 1.0),
    "tflops": ("model FLOP rate, all ranks", "TFLOP/s", 1.0),
    "mfu": ("model FLOP utilisation of the accelerators' peak", "%", 100.0),
    "memory_mb": ("peak memory of rank 0 (GPU allocated, or process RSS on CPU)", "MiB", 1.0),
    "data_wait_fraction": ("share of step time spent waiting for batches", "%", 100.0),
    "loader_busy_fraction": ("share of step time the loader thread spent collating", "%", 100.0),
    "step_time_s": ("time per optimizer step", "s", 1.0),
    "consumed_samples": ("sequences trained on so far", "sequences", 1.0),
    "consumed_tokens": ("tokens trained on so far, padding excluded", "tokens", 1.0),
}


def _value(v: float, unit: str, scale: float) -> str:
    x = v * scale
    if unit in ("sequences", "tokens", "") and float(x).is_integer() and abs(x) >= 1:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 0.01 or unit == "" else f"{x:.2f}"


def pretraining_section(
    rows: list[dict[str, Any]],
    card: CardFacts | None,
    plots: dict[str, Path],
    pretrain_dir: Path,
    links: Links,
) -> list[str]:
    lines = ["## Pretraining", ""]
    if not rows:
        return [*lines, f"No pretraining metrics in `{pretrain_dir}`.", ""]
    if card is not None and card.evaluation is not None:
        lines += quality_lines(card.evaluation)
    if card is not None and card.training is not None:
        t = card.training
        lines += [
            f"{t.steps:,} steps × {t.global_batch:,} sequences on {t.world_size} process(es), {t.optimizer}, "
            f"peak lr {t.lr:g}, {t.precision}, ZeRO stage {t.zero_stage}.",
            "",
        ]
    if plots:  # one paragraph: two curves side by side in the HTML page
        lines += [" ".join(links.image(path, f"{stem} curve") for stem, path in plots.items()), ""]
        lines += [
            "Dashed lines: the masked-LM curves' level without context, what a model that ignores the "
            "context scores on the held-out examples' masked tokens (not a level for the next-sentence "
            "curves, nor for the training loss, which adds the next-sentence loss to the masked-LM one).",
            "",
        ]
    lines += [
        f"Last logged values ({len(rows)} rows in {links.file(pretrain_dir / 'metrics.jsonl')}):",
        "",
        "| figure | value | unit | at step | name in metrics.jsonl |",
        "|---|---:|---|---:|---|",
    ]
    last = _last_values(rows)
    known = [k for k in PRETRAIN_METRICS if k in last] + sorted(k for k in last if k not in PRETRAIN_METRICS)
    for key in known:
        step, v = last[key]
        meaning, unit, scale = PRETRAIN_METRICS.get(key, (key, "", 1.0))
        lines.append(f"| {meaning} | {_value(v, unit, scale)} | {unit} | {step} | `{key}` |")
    return [*lines, ""]


def phases_section(phases: list[tuple[str, CardFacts | None, Path]], links: Links) -> list[str]:
    """One row per pretraining phase (config `phases:`, then the main one), each measured on its own
    held-out split: how the model got where the section above says. Empty without phases."""
    if len(phases) < 2:
        return []
    lines = [
        "Pretraining phases, each starting from the model of the one before (held-out figures on "
        "each phase's own validation split and sequence length):",
        "",
        "| phase | tokens per example | steps × sequences | tokens seen | held-out MLM accuracy "
        "| always the most frequent token | output |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, card, out_dir in phases:
        if card is None or card.training is None:
            lines.append(f"| {name} | | | | | | {links.file(out_dir)} (not complete) |")
            continue
        t, e = card.training, card.evaluation
        length = card.data.max_seq_length if card.data is not None else None
        tokens = f"{t.tokens_seen:,}" if t.tokens_seen else ""
        acc = _pct(e.metrics.get("val_mlm_acc")) if e is not None else ""
        floor = _pct(e.baselines.get("most_frequent_token_acc")) if e is not None else ""
        lines.append(
            f"| {name} | {length or ''} | {t.steps:,} × {t.global_batch:,} | {tokens} | {acc} | {floor} | "
            f"{links.file(out_dir)} |"
        )
    return [*lines, ""]


def _last_values(rows: list[dict[str, Any]]) -> dict[str, tuple[Any, float]]:
    last: dict[str, tuple[Any, float]] = {}
    for row in rows:
        for k, v in row.items():
            if (
                k != "step"
                and not k.startswith("_")
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
            ):
                last[k] = (row.get("step"), v)
    return last


# ----------------------------------------------------------------------------- 4. data

# stats.json key (dotted for nested values) -> (meaning, kind); kinds format the value
STATS: dict[str, tuple[str, str]] = {
    "input_files": ("corpus files given (those skipped whole too)", "count"),
    "files_skipped": ("corpus files skipped whole (no text read)", "files"),
    "input_bytes": ("corpus size (uncompressed)", "bytes"),
    "documents_read": ("documents read", "count"),
    "documents_used.train": ("documents in the train split", "count"),
    "documents_used.validation": ("documents held out (validation split)", "count"),
    "documents_single_sentence": ("documents with a single sentence (no IsNext pair possible)", "count"),
    "sentences": ("sentences", "count"),
    "tokens": ("WordPiece tokens", "count"),
    "unk_token_ratio": ("tokens that are [UNK]", "share"),
    "documents_duplicate": ("documents repeating an earlier one's text (kept)", "count"),
    "examples": ("examples", "count"),
    "examples_per_split.train": ("examples, train", "count"),
    "examples_per_split.validation": ("examples, validation", "count"),
    "is_next_ratio": ("examples whose B segment truly follows A (IsNext)", "share"),
    "mean_tokens_per_example": ("tokens per example, mean", "number"),
    "mean_masked_per_example": ("masked positions per example, mean", "number"),
    "masked_replacement_split.mask_token": ("masked positions shown as [MASK]", "share"),
    "masked_replacement_split.random_token": ("masked positions shown as a random token", "share"),
    "masked_replacement_split.unchanged": ("masked positions left unchanged", "share"),
    "seconds": ("Beam job time", "seconds"),
    "mb_per_second": ("speed", "MiB/s"),
}


def flatten(stats: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in stats.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _stat(value: Any, kind: str) -> str:
    if value is None:
        return "—"
    if kind == "bytes":
        return f"{value / 2**20:,.1f} MiB"
    if kind == "share":
        return f"{100 * value:.1f}%"
    if kind == "seconds":
        return duration(value)
    if kind == "MiB/s":
        return f"{value:.2f} MiB/s"
    if kind == "files":  # a list of file names: how many, then which
        return f"{len(value)}: {', '.join(map(str, value))}" if value else "0"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def data_section(stats_path: Path, links: Links) -> list[str]:
    lines = ["## Data", ""]
    if not stats_path.is_file():
        return [*lines, f"No preprocessing statistics at `{stats_path}`.", ""]
    stats = json.loads(stats_path.read_text())
    warnings = stats.pop("warnings", [])  # data that makes pretraining meaningless (stage_preprocess)
    lines += [f"**Warning:** {w}  " for w in warnings] + ([""] if warnings else [])
    flat = flatten(stats)
    lines += [
        f"From {links.file(stats_path)}:",
        "",
        "| statistic | value | name in stats.json |",
        "|---|---:|---|",
    ]
    ordered = [k for k in STATS if k in flat] + sorted(k for k in flat if k not in STATS)
    for key in ordered:
        if key.startswith("skipped."):
            meaning, kind = f"skipped: {key.split('.', 1)[1].replace('_', ' ')}", "count"
        else:
            meaning, kind = STATS.get(key, (key.replace("_", " "), "number"))
        lines.append(f"| {meaning} | {_stat(flat[key], kind)} | `{key}` |")
    if not any(k.startswith("skipped.") for k in flat):
        lines += ["", "Nothing was skipped: every file and line of the corpus was readable."]
    return [*lines, ""]


# ----------------------------------------------------------------------------- 5. stages


def finished_stages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record's stage rows but the one still running: the report itself, which the flow
    recorded as running just before it started building this page."""
    return [r for r in record.get("stages", []) if r.get("status") != "running"]


def stages_section(record: dict[str, Any], report_dir: Path, links: Links) -> list[str]:
    lines = ["## How the run went", ""]
    if not record:
        return [*lines, "No flow-run record found (stages were run one by one, not by `bertflow run`).", ""]
    stages = finished_stages(record)
    command = f", its command `{record['command']}`" if record.get("command") else ""
    lines += [
        f"Flow run `{record.get('flow_run')}` started {record.get('started_utc')} UTC, W&B group "
        f"`{record.get('wandb_group')}`{command}. *ran*: computed in this flow run; *cached*: its complete output "
        "was found (Prefect cache hit); *reused*: a complete output written outside the flow "
        "(e.g. by the stage command alone) was found.",
        "",
        "| stage | status | wall time | compute time | output |",
        "|---|---|---:|---:|---|",
    ]
    for r in stages:
        lines.append(
            f"| {r['stage']} | {r['status']} | {duration(r['seconds'])} | "
            f"{duration(r.get('compute_seconds'))} | {links.file(in_run_dir(links.root, r['out_dir']))} |"
        )
    if not any(r["stage"] == "report" for r in stages):
        lines.append(f"| report | ran (this page) | — | — | {links.file(report_dir)} |")
    cached = sum(1 for r in stages if found_complete(r["status"]))
    lines += [
        f"| **total** | {cached} of {len(stages)} stages cached or reused | "
        f"**{duration(record.get('seconds'))}** | "
        f"{duration(sum(r.get('compute_seconds', 0.0) for r in stages))} | up to this report |",
        "",
        "Compute time of `finetune-units` adds up the units, which run in parallel.",
        "",
    ]
    notes = [r["code_note"] for r in stages if r.get("code_note")]
    if notes:
        lines += [
            "**Made by other code than this run's:** these outputs were reused although the code that "
            "computes them has changed since, so they may differ from what this code computes.",
            "",
            *[f"- {note}" for note in notes],
            "",
        ]
    return lines


# ----------------------------------------------------------------------------- 6. W&B


def _unit_checkpoint(unit_dir: Path) -> str | None:
    """The checkpoint a fine-tuning unit trained, named as the scorecard names it (its result.json)."""
    from common.jsonfile import read_json_or_empty
    from finetuning.scorecard import display_name

    r = read_json_or_empty(unit_dir / "result.json")
    if not isinstance(r.get("checkpoint"), str) or not isinstance(r.get("checkpoint_label"), str):
        return None
    return display_name(r["checkpoint"], r["checkpoint_label"], r.get("checkpoint_kind", "pretrained"))


def wandb_section(runs: list[Path], root: Path, links: Links) -> list[str]:
    lines = ["## Weights & Biases runs", ""]
    if not runs:
        return [*lines, "No W&B run directories found (W&B disabled?).", ""]
    lines += ["| stage | W&B run directory |", "|---|---|"]
    for p in runs:
        owner = p.parent.parent.parent  # <stage dir or unit dir>/wandb_files/wandb/<run>
        parts = links.rel(owner).split("/")
        stage = parts[0]
        if parts[:2] == ["finetune", "units"] and len(parts) > 2:  # <unit>__<label>-<key>
            unit, _, rest = parts[2].partition("__")
            stage = f"finetune unit {unit}, {_unit_checkpoint(owner) or rest.rsplit('-', 1)[0] or '?'}"
        lines.append(f"| {stage} | {links.file(p, p.name)} |")
    if not any(p.name.startswith("offline-") for p in runs):
        return lines + ["", "Each run was logged online: W&B uploaded it as it ran.", ""]
    return lines + [
        "",
        "`offline-run-*` runs were logged offline (`wandb.mode: offline` or `WANDB_MODE=offline`; a "
        "`WANDB_API_KEY` in the environment turns the config's `offline` into `online` where `WANDB_MODE` "
        "is unset). Upload them with:",
        "",
        "```bash",
        f"find {root} -type d -name 'offline-run-*' -exec wandb sync {{}} +  # every run in the run dir, once",
        "```",
        "",
    ]
