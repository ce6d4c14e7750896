"""The fine-tuning scorecard: one row per checkpoint, one column per task metric, the GLUE-style
average, a "pretrained − random init" delta row, the chance level of every task (majority class,
`finetuning/chance.py`) and the BERT paper's BERT-base figures as a reference row. With several lrs
the best lr per (checkpoint, task) is chosen by mean dev score over seeds; the table shows that
lr's seed-mean (± the standard deviation over seeds when there are several). A score that evaluation
noise alone could reach from the chance level is marked "(chance)", and the headline says how many
tasks the pretrained model leads random init on.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from common.atomic import atomic_write_json, atomic_write_text
from common.jsonfile import read_json_or_empty
from common.tracking import Tracker
from finetuning.chance import is_at_chance

METRIC_SHORT = {
    "accuracy": "acc",
    "f1": "F1",
    "mcc": "MCC",
    "pearson": "Pearson",
    "spearman": "Spearman",
    "entity_f1": "F1",
    "exact_match": "EM",
}
# Devlin et al. 2019, BERT-base. Dev figures where the paper gives them (Table 5: SST-2 and MRPC
# accuracy; Table 2: SQuAD v1.1; Table 7: CoNLL-2003), otherwise the GLUE test figures of Table 1
# (marked "test" in `BERT_BASE_SOURCE`). The paper reports no STS-B Pearson.
BERT_BASE_REFERENCE: dict[str, dict[str, float]] = {
    "sst2": {"accuracy": 92.7},
    "cola": {"mcc": 52.1},
    "mrpc": {"accuracy": 86.7, "f1": 88.9},
    "rte": {"accuracy": 66.4},
    "stsb": {"spearman": 85.8},
    "conll2003": {"entity_f1": 96.4},
    "squad": {"exact_match": 80.8, "f1": 88.5},
}
BERT_BASE_SOURCE = {
    ("cola", "mcc"): "test",
    ("mrpc", "f1"): "test",
    ("rte", "accuracy"): "test",
    ("stsb", "spearman"): "test",
}


def _mean(values: list[float | None]) -> float | None:
    """None (undefined) when any value is."""
    if any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _std(values: list[float | None]) -> float | None:
    """Sample standard deviation (0 for a single value; None when a value is undefined)."""
    if any(v is None for v in values):
        return None
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def best_per_task(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For one checkpoint's results: task -> the best lr's seed-averaged metrics."""
    by_task: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_task[r["task"]][r["lr"]].append(r)
    out = {}
    for task, by_lr in by_task.items():
        lr_scores = {lr: _mean([r["score"] for r in rs]) for lr, rs in by_lr.items()}
        best_lr = max(sorted(lr_scores), key=lambda lr: -math.inf if lr_scores[lr] is None else lr_scores[lr])
        rs = by_lr[best_lr]
        first = rs[0]
        chance = first.get("chance_metrics")
        out[task] = {
            "lr": best_lr,
            "seeds": sorted(r["seed"] for r in rs),
            "metrics": {m: _mean([r["metrics"][m] for r in rs]) for m in first["metric_names"]},
            "metrics_std": {m: _std([r["metrics"][m] for r in rs]) for m in first["metric_names"]},
            "score": lr_scores[best_lr],
            "score_std": _std([r["score"] for r in rs]),
            "chance_metrics": chance,
            "at_chance": is_at_chance(lr_scores[best_lr], chance, first["n_eval"])
            if chance and lr_scores[best_lr] is not None
            else None,
            "diverged": any(r.get("diverged") for r in rs),
            "lr_scores": {f"{lr:g}": s for lr, s in sorted(lr_scores.items())},
            "glue": first.get("glue", False),
            "n_train": first["n_train"],
            "n_eval": first["n_eval"],
            "epochs": first["epochs"],
            "max_seq_length": first["max_seq_length"],
            "train_examples_per_s": _mean([r["train_examples_per_s"] for r in rs]),
            "notes": first.get("notes", {}),
        }
    return out


def build_scorecard(
    results: list[dict[str, Any]], out_dir: Path, tracker: Tracker | None = None
) -> dict[str, Any]:
    """Write `scorecard.json` and `scorecard.md` under `out_dir` (and a W&B table when a tracker is
    given). Results carrying an `error` key are listed as failed units."""
    out_dir = Path(out_dir)
    ok = [r for r in results if "error" not in r]
    failed = [r for r in results if "error" in r]
    tasks: list[str] = []
    metric_names: dict[str, list[str]] = {}
    for r in ok:
        if r["task"] not in tasks:
            tasks.append(r["task"])
            metric_names[r["task"]] = list(r["metric_names"])
    columns = [(t, m) for t in tasks for m in metric_names[t]]

    by_ckpt: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        by_ckpt[r["checkpoint_label"]].append(r)
    rows = []
    for label, rs in by_ckpt.items():
        best = best_per_task(rs)
        glue_tasks = [t for t in tasks if t in best and best[t]["glue"]]
        rows.append(
            {
                "checkpoint": label,
                "name": display_name(rs[0]["checkpoint"], label, rs[0]["checkpoint_kind"]),
                "path": rs[0]["checkpoint"],
                "kind": rs[0]["checkpoint_kind"],
                "tasks": best,
                "glue_average": _mean([best[t]["score"] for t in glue_tasks]) if glue_tasks else None,
                "glue_tasks": glue_tasks,
            }
        )
    rows.sort(key=lambda row: (row["kind"] == "random", row["checkpoint"]))

    randoms = [row for row in rows if row["kind"] == "random"]
    deltas = []
    if randoms:
        base = randoms[0]
        for row in rows:
            if row["kind"] == "random":
                continue
            values = {}
            for t, m in columns:
                if t in row["tasks"] and t in base["tasks"]:
                    values[f"{t}/{m}"] = _diff(row["tasks"][t]["metrics"][m], base["tasks"][t]["metrics"][m])
            avg = _diff(row["glue_average"], base["glue_average"])
            deltas.append(
                {
                    "checkpoint": row["checkpoint"],
                    "name": row["name"],
                    "versus": base["checkpoint"],
                    "versus_name": base["name"],
                    "values": values,
                    "glue_average": avg,
                }
            )

    chance = _chance_row(rows)
    notes = sorted(
        {
            n["squad_split"]
            for row in rows
            for t in row["tasks"].values()
            if (n := t["notes"]).get("squad_split")
        }
    )
    card = {
        "columns": [f"{t}/{m}" for t, m in columns],
        "rows": rows,
        "deltas": deltas,
        "chance": chance,
        "headline": _headline(rows, deltas),
        "reference": {
            "name": "BERT-base (Devlin et al. 2019)",
            "values": {f"{t}/{m}": v for t, ms in BERT_BASE_REFERENCE.items() for m, v in ms.items()},
            "test_set_figures": [f"{t}/{m}" for t, m in BERT_BASE_SOURCE],
        },
        "failed": [
            {"unit": r.get("unit"), "checkpoint": r.get("checkpoint_label"), "error": r["error"]}
            for r in failed
        ],
        "notes": notes,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "scorecard.json", card)
    atomic_write_text(out_dir / "scorecard.md", render_markdown(card, columns))
    if tracker is not None:
        header, table = table_rows(card, columns)
        tracker.log_table("finetune/scorecard", header, table)
        for row in rows:
            if row["glue_average"] is not None:
                tracker.summary({f"finetune/{row['checkpoint']}/glue_average": row["glue_average"]})
    return card


def _chance_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """task/metric -> chance value (majority class), from the first row that recorded it."""
    values: dict[str, float] = {}
    for row in rows:
        for t, info in row["tasks"].items():
            for m, v in (info.get("chance_metrics") or {}).items():
                values.setdefault(f"{t}/{m}", v)
    return {"name": "majority class (chance)", "values": values}


def _headline(rows: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Pretrained vs random init in one sentence's worth of numbers (the first pretrained row)."""
    if not deltas:
        return None
    d = deltas[0]
    row = next(r for r in rows if r["checkpoint"] == d["checkpoint"])
    base = next(r for r in rows if r["checkpoint"] == d["versus"])
    shared = [t for t in row["tasks"] if t in base["tasks"]]
    task_deltas = {t: _diff(row["tasks"][t]["score"], base["tasks"][t]["score"]) for t in shared}
    ahead = [t for t in shared if (task_deltas[t] or 0) > 0]
    return {
        "checkpoint": d["checkpoint"],
        "name": row["name"],
        "versus": d["versus"],
        "versus_name": base["name"],
        "glue_average_delta": d["glue_average"],
        "tasks": shared,
        "task_deltas": task_deltas,
        "ahead_on": ahead,
        "seeds": max((len(row["tasks"][t]["seeds"]) for t in shared), default=0),
        "at_chance": [t for t in shared if row["tasks"][t]["at_chance"]],
        "random_at_chance": [t for t in shared if base["tasks"][t]["at_chance"]],
        "pretraining_helped": d["glue_average"] is not None
        and d["glue_average"] > 0
        and 2 * len(ahead) > len(shared),
    }


def headline_text(h: dict[str, Any] | None) -> str:
    """One line a person reads first: is the pretrained model better than random init?"""
    if not h:
        return "No pretrained checkpoint was compared with random init."
    avg = h["glue_average_delta"]
    name, versus = h.get("name", h["checkpoint"]), h.get("versus_name", "random init")
    lines = [
        f"**{name} vs {versus}:** "
        + (f"GLUE-style average {signed_points(avg)} points, " if avg is not None else "")
        + f"ahead on {len(h['ahead_on'])} of {len(h['tasks'])} tasks"
        + (f" ({', '.join(h['ahead_on'])})" if h["ahead_on"] else "")
        + f", mean of {h['seeds']} seed(s) per task."
    ]
    if not h.get("pretraining_helped", True):
        lines.append(_not_helped_text(h, name, versus))
    if h["at_chance"]:
        lines.append(
            f"**At chance (no better than the majority class within evaluation noise):** "
            f"{', '.join(h['at_chance'])} for {name}"
            + (f"; {', '.join(h['random_at_chance'])} for {versus}." if h["random_at_chance"] else ".")
        )
    return "  \n".join(lines)


def _not_helped_text(h: dict[str, Any], name: str, versus: str) -> str:
    """Why the pretrained model does not count as better: behind on average, or ahead on few tasks."""
    advice = "Pretrain on more tokens; docs/quality.md says what it takes."
    avg = h["glue_average_delta"]
    if avg is None or avg <= 0 or not h["ahead_on"]:
        return (
            f"**Pretraining has not helped here:** {name} is no better than {versus} of the same shape "
            "under the same fine-tuning budget (GLUE-style average not above it, or ahead on half the "
            f"tasks or fewer). {advice}"
        )
    deltas = h.get("task_deltas") or {}

    def listed(tasks: list[str]) -> str:
        tasks = sorted(tasks, key=lambda t: -(deltas.get(t) or 0))
        return ", ".join(f"{t} ({_fmt(deltas[t], signed=True)})" if t in deltas else t for t in tasks)

    rest = [t for t in h["tasks"] if t not in h["ahead_on"]]
    return (
        f"**Pretraining helped on some tasks only:** {name} is ahead of {versus} on "
        f"{listed(h['ahead_on'])} and level or behind on {listed(rest)}. Its GLUE-style average is "
        f"above, but ahead on half the tasks or fewer does not count as pretraining that helps. {advice}"
    )


def signed_points(v: float) -> str:
    """A difference to one decimal with its sign; one that rounds to zero is +0.0, never -0.0."""
    return f"{round(v, 1) + 0.0:+.1f}"


def _fmt(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    return signed_points(v) if signed else f"{v:.1f}"


def table_rows(card: dict[str, Any], columns: list[tuple[str, str]]) -> tuple[list[str], list[list[str]]]:
    header = ["checkpoint", *[f"{t} {METRIC_SHORT.get(m, m)}" for t, m in columns], "GLUE avg"]
    table = []
    for row in card["rows"]:
        name = row.get("name", row["checkpoint"])
        cells = [_cell(row["tasks"][t], m) if t in row["tasks"] else "—" for t, m in columns]
        table.append([name, *cells, _fmt(row["glue_average"])])
    for d in card["deltas"]:
        cells = [_fmt(d["values"].get(f"{t}/{m}"), signed=True) for t, m in columns]
        versus = d.get("versus_name", "random init")
        table.append(
            [f"Δ {d.get('name', d['checkpoint'])} − {versus}", *cells, _fmt(d["glue_average"], signed=True)]
        )
    chance = card.get("chance", {}).get("values", {})
    if chance:
        cells = [_fmt(chance.get(f"{t}/{m}")) for t, m in columns]
        table.append([card["chance"]["name"], *cells, "—"])
    ref = card["reference"]
    cells = []
    for t, m in columns:
        v = ref["values"].get(f"{t}/{m}")
        cells.append("—" if v is None else _fmt(v) + ("†" if f"{t}/{m}" in ref["test_set_figures"] else ""))
    table.append([f"reference: {ref['name']}", *cells, "—"])
    return header, table


def _cell(info: dict[str, Any], metric: str) -> str:
    """'81.2', '81.2 ±1.3' over several seeds, '(chance)' appended when the task is at chance,
    'undefined' for a metric the dev set cannot define, '(diverged)' when a run's loss was NaN."""
    value = info["metrics"][metric]
    if value is None:
        return "undefined" + (" (diverged)" if info.get("diverged") else "")
    text = _fmt(value)
    if info.get("diverged"):
        return text + " (diverged)"
    if len(info["seeds"]) > 1:
        text += f" ±{info.get('metrics_std', {}).get(metric, 0.0):.1f}"
    return text + (" (chance)" if info.get("at_chance") else "")


def card_columns(card: dict[str, Any]) -> list[tuple[str, str]]:
    """The (task, metric) columns of a scorecard read back from scorecard.json."""
    return [tuple(c.split("/", 1)) for c in card["columns"]]  # type: ignore[misc]


def render_markdown(card: dict[str, Any], columns: list[tuple[str, str]]) -> str:
    """scorecard.md: title, headline, then the tables (`render_tables`)."""
    lines = ["# Fine-tuning scorecard", "", headline_text(card.get("headline")), ""]
    return "\n".join(lines) + "\n" + render_tables(card, columns, heading="##")


def _score_note(card: dict[str, Any], columns: list[tuple[str, str]]) -> str:
    """What 'dev score' means for tasks scored on several metrics (e.g. MRPC: accuracy and F1)."""
    by_task: dict[str, list[str]] = defaultdict(list)
    for t, m in columns:
        by_task[t].append(METRIC_SHORT.get(m, m))
    several = [f"{t} = ({' + '.join(ms)}) / {len(ms)}" for t, ms in by_task.items() if len(ms) > 1]
    text = "dev score: the number the best lr is chosen by, the task's metric"
    if several:
        text += f", or the mean of its metrics where it has several: {'; '.join(several)}"
    return text + "."


def render_tables(card: dict[str, Any], columns: list[tuple[str, str]], heading: str = "###") -> str:
    """The score table with its explanation, the runs behind it, notes and failed units; `heading`
    is the markdown level of the sub-headings (the report nests them one level deeper)."""
    header, table = table_rows(card, columns)
    lines = [
        "Dev-set scores (0-100); the best lr by dev score when several were run, mean ± standard deviation "
        "over seeds. (chance): not above the majority-class score by more than evaluation noise on this "
        "many examples (one-sided 95%; `finetuning/chance.py`).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(r) + " |" for r in table],
        "",
        "GLUE avg: mean over this row's GLUE tasks of each task's dev score. † = the paper gives only a "
        "GLUE test-set figure; all other reference figures are dev-set figures of BERT-base with the full "
        "training sets (our runs use the budgets below).",
        "",
        f"{heading} Runs",
        "",
        _score_note(card, columns),
        "",
        "| checkpoint | task | best lr | lrs tried (dev score) | seeds | train examples | eval examples "
        "| epochs | seq | train ex/s |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in card["rows"]:
        for t, info in row["tasks"].items():
            tried = ", ".join(
                f"{lr} ({_fmt(s) if s is not None else 'undefined'})" for lr, s in info["lr_scores"].items()
            )
            lines.append(
                f"| {row.get('name', row['checkpoint'])} | {t} | {info['lr']:g} | {tried} | "
                f"{', '.join(map(str, info['seeds']))} | {info['n_train']} | {info['n_eval']} | "
                f"{info['epochs']:g} | {info['max_seq_length']} | {info['train_examples_per_s']:.1f} |"
            )
    if card["notes"]:
        lines += ["", f"{heading} Notes", ""] + [f"- SQuAD: {n}" for n in card["notes"]]
    if card["failed"]:
        lines += ["", f"{heading} Failed units", ""]
        lines += [f"- {f['unit']} ({f['checkpoint']}): {f['error']}" for f in card["failed"]]
    return "\n".join(lines) + "\n"


def display_name(checkpoint: str, label: str, kind: str = "pretrained") -> str:
    """A name a reader understands: 'pretrained (tiny, 300 steps)' for a bertflow pretraining
    output's model, 'random init (tiny)', else the checkpoint's folder label. Labels (which name
    unit directories) stay as they are; this is only what the tables show."""
    if kind == "random" or checkpoint.startswith("random:"):
        target = next((t.split(":", 1)[1] for t in (checkpoint, label) if t.startswith("random:")), label)
        shape = target if "/" not in target else (_preset(Path(target)) or Path(target).name)
        return f"random init ({shape})"
    path = Path(checkpoint)
    preset = _preset(path)
    marker = read_json_or_empty(path.parent / "_COMPLETE.json") if path.name == "model" else {}
    if "max_steps" in marker and (path.parent / "run_spec.json").is_file():
        return f"pretrained ({preset or 'custom shape'}, {marker['max_steps']:,} steps)"
    return f"{label} ({preset})" if preset else label


def _preset(model_dir: Path) -> str | None:
    from model.config import preset_of

    return preset_of(read_json_or_empty(model_dir / "config.json"))
