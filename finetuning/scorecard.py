"""The fine-tuning scorecard: one row per checkpoint, one column per task metric, the GLUE-style
average, a "pretrained − random init" delta row, the chance level of every task (the best constant
prediction, named in its row, `finetuning/chance.py`) and the BERT paper's BERT-base figures as a reference row. With several lrs
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
from finetuning.seed_noise import SeedNoise, difference_noise, verdict
from model.model_card import steps_text

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


def _undefined(v: float | None) -> bool:
    """None, or NaN/inf (a diverged regression unit predicts NaN, so its correlation is NaN)."""
    return v is None or not math.isfinite(v)


def _mean(values: list[float | None]) -> float | None:
    """None (undefined) when any value is."""
    if any(_undefined(v) for v in values):
        return None
    return sum(values) / len(values)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _std(values: list[float | None]) -> float | None:
    """Sample standard deviation (0 for a single value; None when a value is undefined)."""
    if any(_undefined(v) for v in values):
        return None
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _at_chance(
    score: float | None, units: list[dict[str, Any]], chance: dict[str, float | None] | None, n_eval: int
) -> bool | None:
    """Whether the best lr's units score at chance (`is_at_chance`); where the dev set leaves a
    metric undefined (MCC or F1 on a one-class dev set: None in `chance` too), judged on the mean
    of the metrics it defines, as `chance.best_constant` chose the constant answer; None when
    nothing defined is left to judge, or a unit's defined metric is not (a diverged run)."""
    if not chance:
        return None
    if score is not None:
        return is_at_chance(score, chance, n_eval)
    defined = {m: v for m, v in chance.items() if v is not None}
    means = [_mean([u["metrics"][m] for u in units]) for m in defined]
    if not defined or any(v is None for v in means):
        return None
    return is_at_chance(sum(means) / len(means), defined, n_eval)


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
            "seed_scores": {str(r["seed"]): r["score"] for r in rs},
            "chance_metrics": chance,
            "chance_prediction": first.get("chance_prediction"),
            "at_chance": _at_chance(lr_scores[best_lr], rs, chance, first["n_eval"]),
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
    columns = _columns(ok)
    rows = _checkpoint_rows(ok, list(dict.fromkeys(t for t, _ in columns)))
    deltas = _delta_rows(rows, columns)
    # a built-in task name pointed at other data (--task-config): the paper's figure is not its own
    redefined = {t for row in rows for t, info in row["tasks"].items() if info["notes"].get("redefined")}
    card = {
        "columns": [f"{t}/{m}" for t, m in columns],
        "rows": rows,
        "deltas": deltas,
        "chance": _chance_row(rows),
        "headline": _headline(rows, deltas),
        "reference": {
            "name": "BERT-base (Devlin et al. 2019)",
            "values": {
                f"{t}/{m}": v
                for t, ms in BERT_BASE_REFERENCE.items()
                if t not in redefined
                for m, v in ms.items()
            },
            "test_set_figures": [f"{t}/{m}" for t, m in BERT_BASE_SOURCE],
        },
        "failed": [
            {"unit": r.get("unit"), "checkpoint": r.get("checkpoint_label"), "error": r["error"]}
            for r in failed
        ],
        "notes": _unit_notes(rows),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "scorecard.json", card)
    atomic_write_text(out_dir / "scorecard.md", render_markdown(card, columns))
    if tracker is not None:
        header, table = table_rows(card, columns)
        tracker.log_table("finetune/scorecard", header, table)
        tracker.summary(summary_values(card))
    return card


def summary_values(card: dict[str, Any]) -> dict[str, Any]:
    """The W&B run's summary, what a watcher filters and compares runs by (the table holds the
    rest): the headline's verdict, the difference from random init with its seed-noise margin (the
    average and each task's), and each checkpoint's GLUE-style average and per-task mean score."""
    values: dict[str, Any] = {}
    for row in card["rows"]:
        if row["glue_average"] is not None:
            values[f"finetune/{row['checkpoint']}/glue_average"] = row["glue_average"]
        for task, info in row["tasks"].items():
            values[f"finetune/{row['checkpoint']}/{task}"] = info["score"]
    if (h := card["headline"]) is not None:
        values["finetune/verdict"] = headline_text(h)
        values["finetune/pretraining_helped"] = h["pretraining_helped"]
        values["finetune/delta_vs_random/glue_average"] = h["glue_average_delta"]
        values["finetune/delta_vs_random/glue_average_margin"] = h["glue_average_margin"]
        for task in h["tasks"]:
            values[f"finetune/delta_vs_random/{task}"] = h["task_deltas"][task]
            values[f"finetune/delta_vs_random/{task}_margin"] = h["task_margins"][task]
    return values


def _columns(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(task, metric) in the order the results first name each task."""
    metric_names: dict[str, list[str]] = {}
    for r in results:
        metric_names.setdefault(r["task"], list(r["metric_names"]))
    return [(t, m) for t, ms in metric_names.items() for m in ms]


def _checkpoint_rows(results: list[dict[str, Any]], tasks: list[str]) -> list[dict[str, Any]]:
    """One row per checkpoint: its best lr per task and the GLUE-style average; pretrained
    checkpoints first, then random init."""
    by_ckpt: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
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
                "glue_average_std": _glue_average_std(best, glue_tasks),
                "glue_tasks": glue_tasks,
            }
        )
    rows.sort(key=lambda row: (row["kind"] == "random", row["checkpoint"]))
    return rows


def _delta_rows(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each pretrained row against the first random-init row: per metric the difference and its
    seed-noise margin, and the GLUE-style average's; none without a random-init row."""
    randoms = [row for row in rows if row["kind"] == "random"]
    if not randoms:
        return []
    base = randoms[0]
    deltas = []
    for row in rows:
        if row["kind"] == "random":
            continue
        values, margins = {}, {}
        for t, m in columns:
            if t in row["tasks"] and t in base["tasks"]:
                ours, theirs = row["tasks"][t], base["tasks"][t]
                values[f"{t}/{m}"] = _diff(ours["metrics"][m], theirs["metrics"][m])
                margins[f"{t}/{m}"] = _margin(
                    difference_noise(
                        ours["metrics_std"][m],
                        len(ours["seeds"]),
                        theirs["metrics_std"][m],
                        len(theirs["seeds"]),
                    )
                )
        deltas.append(
            {
                "checkpoint": row["checkpoint"],
                "name": row["name"],
                "versus": base["checkpoint"],
                "versus_name": base["name"],
                "values": values,
                "margins": margins,
                **_glue_average_delta(row, base),
            }
        )
    return deltas


# a unit's notes, as the scorecard's Notes list says them
_NOTE_PREFIX = {
    "squad_split": "SQuAD:",
    "labels": "Labels:",
    "redefined": "Task definition:",
    "dev": "Dev set:",
    "pooler": "{name}: pooler",
    "eval_words_truncated": "{name}: CoNLL dev words past max_seq_length, scored as O:",
}


def _unit_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The notes of every row's units, each said once."""
    return sorted(
        {
            f"{_NOTE_PREFIX[k].format(name=row['name'])} {v}"
            for row in rows
            for t in row["tasks"].values()
            for k, v in t["notes"].items()
            if k in _NOTE_PREFIX and v
        }
    )


def _glue_average_std(best: dict[str, dict[str, Any]], glue_tasks: list[str]) -> float | None:
    """Std over seeds of the per-seed GLUE average; None unless every GLUE task ran the same seeds."""
    if not glue_tasks:
        return None
    seeds = [sorted(best[t]["seed_scores"]) for t in glue_tasks]
    if any(s != seeds[0] for s in seeds):
        return None
    per_seed = [_mean([best[t]["seed_scores"][s] for t in glue_tasks]) for s in seeds[0]]
    return _std(per_seed)


def _shared_glue_tasks(row: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """The GLUE tasks both rows have: an average difference over any others would compare two
    averages of different tasks (a task all of one model's units failed on)."""
    return [t for t in row["glue_tasks"] if t in base["glue_tasks"]]


def _glue_average_delta(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The GLUE-style average difference over the tasks both rows have, its seed-noise margin, and
    those tasks."""
    tasks = _shared_glue_tasks(row, base)
    means = [_mean([r["tasks"][t]["score"] for t in tasks]) if tasks else None for r in (row, base)]
    return {
        "glue_average": _diff(*means),
        "glue_average_margin": _margin(_glue_average_noise(row, base)),
        "glue_average_tasks": tasks,
    }


def _glue_average_noise(row: dict[str, Any], base: dict[str, Any]) -> SeedNoise | None:
    tasks = _shared_glue_tasks(row, base)
    if not tasks:
        return None
    stds = [_glue_average_std(r["tasks"], tasks) for r in (row, base)]
    return difference_noise(
        stds[0], len(row["tasks"][tasks[0]]["seeds"]), stds[1], len(base["tasks"][tasks[0]]["seeds"])
    )


def _margin(noise: SeedNoise | None) -> float | None:
    return None if noise is None else noise.margin


def _chance_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """task/metric -> chance value (the best constant prediction's; None where the dev set cannot
    define the metric) and task -> the label that prediction always answers, from the first row
    that recorded them."""
    values: dict[str, float | None] = {}
    predictions: dict[str, str] = {}
    for row in rows:
        for t, info in row["tasks"].items():
            for m, v in (info.get("chance_metrics") or {}).items():
                values.setdefault(f"{t}/{m}", v)
            if info.get("chance_prediction") is not None:
                predictions.setdefault(t, info["chance_prediction"])
    name = "best constant prediction (chance)"
    if any(k.endswith("/exact_match") for k in values):
        name = "chance: best constant prediction; SQuAD: the context sentence sharing most words with the question"
    return {"name": name, "values": values, "predictions": predictions}


def _headline(rows: list[dict[str, Any]], deltas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Pretrained vs random init in one sentence's worth of numbers, for the pretrained row the
    random-init baseline was made for (with several checkpoints, that is the one it is the twin of).
    A task counts as ahead or behind only when its difference exceeds seed noise (`seed_noise.py`),
    and as ahead only where the pretrained model is above chance: a score within evaluation noise of
    the majority class is no evidence of a better model (`ahead_at_chance` lists such tasks)."""
    if not deltas:
        return None
    # the checkpoint the random-init baseline was made for (`random:LABEL`), else the first
    shaped_for = deltas[0]["versus"].removeprefix("random:")
    d = next((d for d in deltas if d["checkpoint"] == shaped_for), deltas[0])
    row = next(r for r in rows if r["checkpoint"] == d["checkpoint"])
    base = next(r for r in rows if r["checkpoint"] == d["versus"])
    shared = [t for t in row["tasks"] if t in base["tasks"]]
    task_deltas = {t: _diff(row["tasks"][t]["score"], base["tasks"][t]["score"]) for t in shared}
    noise = {t: _task_noise(row["tasks"][t], base["tasks"][t]) for t in shared}
    verdicts = {t: verdict(task_deltas[t], noise[t]) for t in shared}
    at_chance = [t for t in shared if row["tasks"][t]["at_chance"]]
    ahead_at_chance = [t for t in shared if verdicts[t] == "ahead" and t in at_chance]
    ahead_on = [t for t in shared if verdicts[t] == "ahead" and t not in at_chance]
    avg, avg_noise = d["glue_average"], _glue_average_noise(row, base)
    glue_tasks = _shared_glue_tasks(row, base)
    average_ahead = verdict(avg, avg_noise) == "ahead" if glue_tasks else True  # no GLUE task: tasks alone
    return {
        "checkpoint": d["checkpoint"],
        "name": row["name"],
        "pretrained_here": pretrained_here(row.get("path", "")),
        "versus": d["versus"],
        "versus_name": base["name"],
        "glue_average_delta": avg,
        "glue_average_margin": _margin(avg_noise),
        # GLUE tasks only one of the two has (all units of the other failed): not in the average
        "glue_average_left_out": sorted(set(row["glue_tasks"]) ^ set(base["glue_tasks"])),
        "tasks": shared,
        "task_deltas": task_deltas,
        "task_margins": {t: _margin(noise[t]) for t in shared},
        "ahead_on": ahead_on,
        "ahead_at_chance": ahead_at_chance,
        "behind_on": [t for t in shared if verdicts[t] == "behind"],
        "noise_tested": all(noise[t] is not None for t in shared if task_deltas[t] is not None),
        "undefined": [t for t in shared if task_deltas[t] is None],
        "diverged": [t for t in shared if row["tasks"][t]["diverged"] or base["tasks"][t]["diverged"]],
        "seeds": max((len(row["tasks"][t]["seeds"]) for t in shared), default=0),
        "seeds_fewest": min((len(r["tasks"][t]["seeds"]) for t in shared for r in (row, base)), default=0),
        "at_chance": at_chance,
        "random_at_chance": [t for t in shared if base["tasks"][t]["at_chance"]],
        "glue_tasks": glue_tasks,
        "pretraining_helped": average_ahead and 2 * len(ahead_on) > len(shared),
    }


def _task_noise(ours: dict[str, Any], theirs: dict[str, Any]) -> SeedNoise | None:
    return difference_noise(ours["score_std"], len(ours["seeds"]), theirs["score_std"], len(theirs["seeds"]))


def headline_text(h: dict[str, Any] | None) -> str:
    """One line a person reads first: is the pretrained model better than random init?"""
    if not h:
        return "No pretrained checkpoint was compared with random init."
    avg = h["glue_average_delta"]
    name, versus = h.get("name", h["checkpoint"]), h.get("versus_name", "random init")
    tested = h.get("noise_tested")  # None: a scorecard written before the seed-noise test
    margin = h.get("glue_average_margin")
    average = "GLUE-style average undefined, " if avg is None and h.get("undefined") else ""
    if avg is not None:
        left_out = h.get("glue_average_left_out")
        average = f"GLUE-style average {signed_points(avg)} points"
        average += f" over the tasks both have (not {', '.join(left_out)})" if left_out else ""
        if margin is not None:
            average += f" (seed noise ±{margin:.1f}), "
        elif tested:  # tasks tested, the average not: a failed unit left its task other seeds than the rest
            average += " (by sign: no seed-noise estimate, its tasks ran different seeds), "
        else:
            average += ", "
    behind = h.get("behind_on", [])
    at_chance_too = h.get("ahead_at_chance", [])
    lines = [
        f"**{name} vs {versus}:** "
        + average
        + f"ahead on {len(h['ahead_on'])} of {len(h['tasks'])} tasks"
        + _ahead_list(h["ahead_on"], at_chance_too)
        + (f" and behind on {len(behind)} ({', '.join(behind)})" if behind else "")  # how tested: both
        + _how_tested(tested)
        + f", mean of {_seed_count(h)} per task."
    ]
    if h.get("undefined"):
        lines.append(_undefined_text(h))
    if not h.get("pretraining_helped", True):
        lines.append(_not_helped_text(h, name, versus))
    if h["at_chance"]:
        lines.append(
            f"**At chance (no better than the best constant prediction within evaluation noise):** "
            f"{', '.join(h['at_chance'])} for {name}"
            + (f"; {', '.join(h['random_at_chance'])} for {versus}." if h["random_at_chance"] else ".")
        )
    return "  \n".join(lines)


def _seed_count(h: dict[str, Any]) -> str:
    """'3 seed(s)', or '2-3 seeds' where a failed unit left a task fewer."""
    fewest = h.get("seeds_fewest", h["seeds"])  # scorecards before 2026-11-28: the most only
    return f"{fewest}-{h['seeds']} seeds" if 0 < fewest < h["seeds"] else f"{h['seeds']} seed(s)"


def _undefined_text(h: dict[str, Any]) -> str:
    """Tasks whose difference is undefined, and why: a diverged run, or a metric the dev set
    cannot define. They count as neither ahead nor behind."""
    undefined = h["undefined"]
    diverged = [t for t in undefined if t in h.get("diverged", [])]
    other = [t for t in undefined if t not in diverged]
    why = []
    if diverged:
        why.append(
            f"a fine-tuning run diverged (NaN loss) on {', '.join(diverged)}: rerun with a lower lr in `finetune.lrs`"
        )
    if other:
        why.append(
            f"the dev set cannot define the metric on {', '.join(other)} (constant labels, or one class)"
        )
    return (
        f"**No score for {', '.join(undefined)}:** {'; '.join(why)}; "
        f"{'it counts' if len(undefined) == 1 else 'they count'} as neither ahead nor behind."
    )


def _ahead_list(ahead: list[str], at_chance_too: list[str]) -> str:
    """' (sst2, stsb; rte too, but at chance there)': the tasks counted ahead, then those not counted."""
    parts = [", ".join(ahead)] if ahead else []
    parts += (
        [f"{', '.join(at_chance_too)}{' too' if ahead else ''}, but at chance there"] if at_chance_too else []
    )
    return f" ({'; '.join(parts)})" if parts else ""


def _how_tested(tested: bool | None) -> str:
    if tested:
        return " beyond seed noise"
    if tested is False:
        return " by sign only (fewer than two seeds: no seed-noise estimate)"
    return " by sign only"


def _not_helped_text(h: dict[str, Any], name: str, versus: str) -> str:
    """Why the pretrained model does not count as better: behind on average, or ahead on few tasks;
    then what to try, for a model bertflow pretrained or for one it did not (an import)."""
    advice = (
        "Pretrain on more tokens (a larger corpus, not more passes over a small one): on 2 CPU cores "
        "the tiny BERT of `bertflow run configs/cpu-hour.yaml` passes random init after about 25-30 "
        "minutes of pretraining and ends about +8 GLUE-style points ahead (under an hour of "
        "pretraining; on one GPU its pretraining took five minutes), judged with its own fine-tuning "
        "budget (full training sets, an lr sweep); docs/quality.md has the measurements."
        if h.get("pretrained_here", True)  # scorecards from before 2026-11-27: bertflow's own models
        else "bertflow did not pretrain this model (an import or another checkpoint): check that its "
        "fine-tuning suits it, a lower lr for a larger model (`finetune.lrs`, e.g. 1e-4 and 2e-4) and "
        "more training examples (`finetune.max_train_examples`); a real pretrained BERT is well ahead "
        "under the default budget at lr 2e-4 (docs/quality.md, 'A real pretrained BERT through the "
        "same scorecard')."
    )
    avg, margin = h["glue_average_delta"], h.get("glue_average_margin")
    glue = h.get("glue_tasks", True)  # a scorecard from before 2026-11-27 had GLUE tasks or said nothing else
    tested = bool(h.get("noise_tested"))
    average_ahead = bool(glue) and avg is not None and avg > (margin or 0.0)
    if (glue and (avg is None or avg <= 0)) or (not h["ahead_on"] and not average_ahead):
        return (
            f"**Pretraining has not helped here:** {name} is no better than {versus} of the same shape "
            f"under the same fine-tuning budget ({_not_helped_reason(h, bool(glue), tested)}). {advice}"
        )
    deltas = h.get("task_deltas") or {}

    def listed(tasks: list[str]) -> str:
        tasks = sorted(tasks, key=lambda t: -(deltas.get(t) or 0))
        return ", ".join(f"{t} ({_fmt(deltas[t], signed=True)})" if t in deltas else t for t in tasks)

    behind, at_chance_too = h.get("behind_on", []), h.get("ahead_at_chance", [])
    level = [t for t in h["tasks"] if t not in h["ahead_on"] + behind + at_chance_too]
    where = [f"ahead but at chance on {listed(at_chance_too)}"] if at_chance_too else []
    where += (
        [f"{'level within seed noise' if tested else 'level or behind'} on {listed(level)}"] if level else []
    )
    where += [f"behind on {listed(behind)}"] if behind else []
    average = (
        f"Its GLUE-style average is above, {signed_points(avg)}, "
        + ("but within" if avg <= margin else "beyond")
        + f" seed noise (±{margin:.1f})"
        if tested and margin is not None
        else "Its GLUE-style average is above"
    )
    most = 2 * len(h["ahead_on"]) > len(h["tasks"])
    lead = f"{average}, and that is" if glue else "That is"  # no GLUE task: no average to speak of
    needed = "on the average and on more than half the tasks" if glue else "on more than half the tasks"
    ahead = listed(h["ahead_on"]) if h["ahead_on"] else f"no task{' beyond seed noise' if tested else ''}"
    return (
        f"**Pretraining {'has not clearly helped' if most or not h['ahead_on'] else 'helped on some tasks only'}:** "
        f"{name} is ahead of {versus} on {ahead}{'; ' + '; '.join(where) if where else ' and nowhere else'}. "
        f"{lead} short of pretraining that helps: ahead{' beyond seed noise' if tested else ''} {needed}. {advice}"
    )


def _not_helped_reason(h: dict[str, Any], glue: bool, tested: bool) -> str:
    """Which of the two conditions of pretraining that helps is unmet, with its numbers: an average
    ahead (beyond seed noise where measured), and more than half the tasks ahead."""
    avg, margin = h["glue_average_delta"], h.get("glue_average_margin")
    parts = []
    if glue and avg is None:
        parts.append("its GLUE-style average difference is undefined")
    elif glue and margin is not None and avg < -margin:
        parts.append("its GLUE-style average is behind by more than seed noise")
    elif glue and avg <= 0:
        parts.append(f"its GLUE-style average is not above it ({signed_points(avg)})")
    elif glue and margin is not None and avg <= margin:
        parts.append(
            f"its GLUE-style average lead, {signed_points(avg)}, is within seed noise (±{margin:.1f})"
        )
    ahead, tasks = len(h["ahead_on"]), len(h["tasks"])
    if 2 * ahead <= tasks:
        parts.append(
            f"it is ahead{' beyond seed noise' if tested else ''} on {ahead} of {tasks} tasks, not more than half"
        )
    return "; ".join(parts)


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
        margins = d.get("margins", {})
        cells = [_delta_cell(d["values"].get(f"{t}/{m}"), margins.get(f"{t}/{m}")) for t, m in columns]
        versus = d.get("versus_name", "random init")
        average = _delta_cell(d["glue_average"], d.get("glue_average_margin"))
        table.append([f"Δ {d.get('name', d['checkpoint'])} − {versus}", *cells, average])
    chance = card.get("chance", {}).get("values", {})
    if chance:
        said = card["chance"].get("predictions", {})
        cells = [
            (
                "undefined"
                if f"{t}/{m}" in chance and chance[f"{t}/{m}"] is None
                else _fmt(chance.get(f"{t}/{m}"))
            )
            + (f" (always {said[t]})" if t in said and f"{t}/{m}" in chance else "")
            + (" (no correlation)" if m in ("pearson", "spearman") and f"{t}/{m}" in chance else "")
            for t, m in columns
        ]
        table.append([card["chance"]["name"], *cells, "—"])
    ref = card["reference"]
    cells = []
    for t, m in columns:
        v = ref["values"].get(f"{t}/{m}")
        cells.append("—" if v is None else _fmt(v) + ("†" if f"{t}/{m}" in ref["test_set_figures"] else ""))
    if _has_reference(card, columns):  # a row of dashes only says nothing
        table.append([f"reference: {ref['name']}", *cells, "—"])
    return header, table


def _has_reference(card: dict[str, Any], columns: list[tuple[str, str]]) -> bool:
    """Whether a column has a BERT-base reference figure (user tasks have none)."""
    return any(card["reference"]["values"].get(f"{t}/{m}") is not None for t, m in columns)


def _delta_cell(value: float | None, margin: float | None) -> str:
    """'+32.0 ±5.1': the difference of seed means and its 95% seed-noise margin, when known."""
    text = _fmt(value, signed=True)
    return text if value is None or margin is None else f"{text} ±{margin:.1f}"


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
    metrics = {m for _, m in columns}
    squad = (
        "; for SQuAD the no-learning answer, the context sentence sharing most words with the question"
        if "exact_match" in metrics
        else ""
    )
    regression = (
        "; for a regression 0, a constant prediction having no correlation with the gold scores"
        if metrics & {"pearson", "spearman"}
        else ""
    )
    lines = [
        "Dev-set scores (0-100); the best lr by dev score when several were run, mean ± standard deviation "
        "over seeds. Chance row: the scores of the constant answer (`always LABEL`) whose dev score (the mean "
        "of the task's metrics) is best: the majority class for accuracy alone, but beside F1 (of the "
        f"positive label) often the positive label even where it is the minority{squad}{regression}. "
        "(chance): a dev score not above "
        "that constant answer's dev score by more than evaluation noise on this many examples (one-sided "
        "95%; `finetuning/chance.py`), so a metric can exceed the chance row's and still be marked. Δ rows: the difference of the seed means "
        "± its seed-noise margin (standard error × Student's t at 95%, Welch; `finetuning/seed_noise.py`); "
        "a task counts as ahead or behind only beyond that margin.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(r) + " |" for r in table],
        "",
        "GLUE avg: mean over this row's GLUE tasks of each task's dev score. "
        + (
            "† = the paper gives only a GLUE test-set figure; all other reference figures are dev-set "
            "figures of BERT-base with the full training sets (our runs use the budgets below)."
            if _has_reference(card, columns)
            else "No task here has a BERT-base reference figure (Devlin et al. 2019 report the built-in tasks)."
        ),
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
        lines += ["", f"{heading} Notes", ""] + [f"- {n}" for n in card["notes"]]
    if card["failed"]:
        lines += ["", f"{heading} Failed units", ""]
        lines += [f"- {f['unit']} ({f['checkpoint']}): {f['error']}" for f in card["failed"]]
    return "\n".join(lines) + "\n"


def pretrained_here(checkpoint: str) -> bool:
    """Whether `checkpoint` is the model of a bertflow pretraining output or an `export-hf` of one."""
    return pretraining_steps(checkpoint) is not None


def pretraining_steps(checkpoint: str) -> list[int] | None:
    """The pretraining steps of each phase of a bertflow pretraining output's model (its completion
    marker with the steps, and its run spec, beside it) or of an `export-hf` of one (its own
    marker's `pretraining_steps`); None for any other model."""
    path = Path(checkpoint)
    exported = read_json_or_empty(path / "_COMPLETE.json").get("pretraining_steps")
    if isinstance(exported, list) and exported:
        return [int(n) for n in exported]
    marker = read_json_or_empty(path.parent / "_COMPLETE.json") if path.name == "model" else {}
    if "max_steps" in marker and (path.parent / "run_spec.json").is_file():
        return [*marker.get("steps_before", []), marker["max_steps"]]
    return None


def display_name(checkpoint: str, label: str, kind: str = "pretrained") -> str:
    """A name a reader understands: 'pretrained (tiny, 300 steps)' for a bertflow pretraining
    output's model ('3,000 + 8,500 steps' when it continued an earlier phase's), 'random init (tiny)',
    else the checkpoint's folder label. Labels (which name
    unit directories) stay as they are; this is only what the tables show."""
    if kind == "random" or checkpoint.startswith("random:"):
        target = next((t.split(":", 1)[1] for t in (checkpoint, label) if t.startswith("random:")), label)
        shape = target if "/" not in target else (_preset(Path(target)) or Path(target).name)
        return f"random init ({shape})"
    preset = _preset(Path(checkpoint))
    steps = pretraining_steps(checkpoint)
    if steps is not None:
        return f"pretrained ({preset or 'custom shape'}, {steps_text(steps)} steps)"
    return f"{label} ({preset})" if preset else label


def _preset(model_dir: Path) -> str | None:
    from model.config import preset_of

    return preset_of(read_json_or_empty(model_dir / "config.json"))
