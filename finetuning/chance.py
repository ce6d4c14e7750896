"""What an uninformed predictor scores on a task, and whether a result is distinguishable from it.

The chance level of a classification task is the *best constant prediction*: the best score a
constant prediction reaches on the evaluation examples with the task's metrics (their mean where
there are several), which for accuracy is the evaluation set's most frequent label, and with F1
beside accuracy often the positive label (`best_constant`) (MRPC: 68.4 accuracy / 81.2 F1 on its dev set; CoLA: MCC 0).
Not the training set's most frequent label: where the two differ (RTE's 2,000-example subset
leans `not_entailment`, its dev set `entailment`), a model that always answers the other label
scored 52.7 against a "chance" of 47.3 and was not marked. Correlations (STS-B) and entity scores
have chance level 0. SQuAD's is a no-learning baseline scored on the same evaluation questions with
the official EM/F1: the context sentence sharing the most words with the question
(`finetuning.squad.overlap_sentence_answers`; F1 ~21 on the built-in split, where an uninformed
span guess scores ~0 and a model that learned nothing F1 2.6).

A result is "at chance" when its task score (the mean of its metrics, as in the scorecard) is not
above the chance score by more than what evaluation noise alone produces on `n` examples, one-sided
at 95% (z = 1.645):
- accuracy and F1: the binomial standard error of the majority rate p0, sqrt(p0 (1 - p0) / n);
- MCC, Pearson, Spearman: the standard error of a correlation under independence, 1 / sqrt(n - 1);
- entity F1, exact match, span F1 (the `f1` beside `exact_match`): one point, or where the chance
  score p is well above 0 (SQuAD's baseline) the binomial bound sqrt(p (1 - p) / n) if larger (a
  per-question score in [0, 1] of mean p has at most that variance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from finetuning.metrics import classification_metrics

Z_95_ONE_SIDED = 1.645
CORRELATIONS = ("mcc", "pearson", "spearman")
SPAN_MARGIN = 1.0  # entity F1, exact match, span F1: chance is ~0, anything real is far above


def majority_metrics(
    names: Sequence[str], train_labels: Sequence[int], eval_labels: Sequence[int]
) -> dict[str, float | None]:
    """The metrics of `best_constant`."""
    return best_constant(names, train_labels, eval_labels)[1]


def best_constant(
    names: Sequence[str], train_labels: Sequence[int], eval_labels: Sequence[int]
) -> tuple[int | None, dict[str, float | None]]:
    """The constant prediction, among the labels of either split, whose task score (the mean of the
    metrics the evaluation examples define) is highest, and its metrics (0-100). With accuracy alone
    that is the majority class; with F1 (of the positive label) beside it, often the positive label
    even where it is the minority (always `pos` on 36.7% positives: accuracy 36.7, F1 53.7, mean 45.2,
    above always `neg`'s 63.3 and 0). A metric the examples cannot define (MCC or F1 on a
    single-class dev set) is None there too, "undefined". (None, zeros) without evaluation examples."""
    if not eval_labels:
        return None, {n: 0.0 for n in names}
    scored = [
        (label, classification_metrics(names, [label] * len(eval_labels), eval_labels))
        for label in sorted({*train_labels, *eval_labels})
    ]

    def task_score(pair: tuple[int, dict[str, float | None]]) -> float:
        defined = [v for v in pair[1].values() if v is not None]
        return sum(defined) / len(defined) if defined else -math.inf

    return max(scored, key=task_score)


def chance_margin(metric: str, n_eval: int, majority_accuracy: float | None) -> float:
    """Points above chance that noise alone reaches with 5% probability on `n_eval` examples."""
    if n_eval < 2:
        return math.inf
    if metric in CORRELATIONS:
        return Z_95_ONE_SIDED * 100 / math.sqrt(n_eval - 1)
    if metric in ("accuracy", "f1"):
        p0 = 0.5 if majority_accuracy is None else majority_accuracy / 100
        return Z_95_ONE_SIDED * 100 * math.sqrt(max(p0 * (1 - p0), 1e-4) / n_eval)
    return SPAN_MARGIN


def span_margin(chance: float, n_eval: int) -> float:
    """A span score's margin: one point, or the binomial bound of its chance score if larger."""
    if n_eval < 2:
        return math.inf
    p = chance / 100
    return max(SPAN_MARGIN, Z_95_ONE_SIDED * 100 * math.sqrt(p * (1 - p) / n_eval))


def chance_threshold(chance: dict[str, float], n_eval: int) -> float:
    """The task score (mean of its metrics) at or below which a result is at chance. A span task's
    `f1` (beside `exact_match`, SQuAD's pair) is span F1, not a classification F1: one point."""
    p0 = chance.get("accuracy")
    span = "exact_match" in chance
    margins = [span_margin(v, n_eval) if span else chance_margin(m, n_eval, p0) for m, v in chance.items()]
    return sum(chance.values()) / len(chance) + sum(margins) / len(margins)


def is_at_chance(score: float, chance: dict[str, float], n_eval: int) -> bool:
    """NaN scores count as at chance (nothing was learned that can be shown)."""
    return not math.isfinite(score) or score <= chance_threshold(chance, n_eval)


def nsp_at_chance(
    metrics: dict[str, float], baselines: dict[str, float], examples: int | None
) -> bool | None:
    """Whether held-out next-sentence accuracy (`val_nsp_acc`, 0-1) is within evaluation noise of
    always predicting the majority label (`nsp_majority_acc`) on `examples`; None when not measured."""
    acc, majority = metrics.get("val_nsp_acc"), baselines.get("nsp_majority_acc")
    if acc is None or majority is None or not examples or not math.isfinite(majority):
        return None
    return is_at_chance(100 * acc, {"accuracy": 100 * majority}, examples)
