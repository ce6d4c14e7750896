"""Evaluation metrics exactly as GLUE, CoNLL (seqeval) and SQuAD v1.1 define them; numpy only.

Scores are returned on a 0-100 scale (as papers and leaderboards print them). A score the dev set
cannot define (a correlation with constant labels, MCC or F1 on a dev set without both classes) is
None, reported as "undefined", never as 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

import numpy as np


def accuracy(preds: Sequence[int], labels: Sequence[int]) -> float | None:
    p, y = np.asarray(preds), np.asarray(labels)
    return float((p == y).mean() * 100) if len(y) else None


def binary_f1(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float | None:
    """F1 of the positive class, label id 1: the last of a two-label task's `labels` (tasks.py refuses
    f1 for other tasks). None (undefined) when the labels hold no positive example: recall has no
    denominator."""
    p, y = np.asarray(preds) == positive, np.asarray(labels) == positive
    if not y.any():
        return None
    tp = float(np.sum(p & y))
    fp = float(np.sum(p & ~y))
    fn = float(np.sum(~p & y))
    return 100 * 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float | None:
    """Multi-class MCC (Gorodkin), as sklearn computes it: 0 for constant predictions (a model
    that learned nothing), None (undefined) when the labels hold a single class."""
    p, y = np.asarray(preds), np.asarray(labels)
    classes = np.union1d(p, y)
    c = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(c, (np.searchsorted(classes, y), np.searchsorted(classes, p)), 1)
    t_k, p_k = c.sum(axis=1), c.sum(axis=0)
    n, correct = c.sum(), np.trace(c)
    cov_yp = correct * n - t_k @ p_k
    cov_pp = n * n - p_k @ p_k
    cov_yy = n * n - t_k @ t_k
    if not cov_yy:
        return None
    denom = np.sqrt(cov_pp * cov_yy)
    return float(100 * cov_yp / denom) if denom else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Correlation of predictions `x` with labels `y`: None (undefined) when the labels are constant,
    NaN when a prediction is not finite (a diverged unit), 0 when only the predictions are constant
    (a model that learned nothing)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(b) < 2 or not (b != b[0]).any():
        return None
    if not np.isfinite(a).all():  # a diverged unit's predictions: undefined, said as NaN
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a * a).sum() * (b * b).sum())
    return float(100 * (a * b).sum() / denom) if denom else 0.0


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks starting at 1, ties get their average rank (scipy.stats.rankdata 'average')."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    first = np.r_[True, sorted_a[1:] != sorted_a[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(a)]
    avg = (starts + ends + 1) / 2.0  # mean of 1-based ranks starts+1 .. ends
    ranks = np.empty(len(a))
    ranks[order] = avg[group]
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson of the ranks. A non-finite prediction (a diverged regression unit) is left to
    `pearson`'s rule: ranks would order the NaNs arbitrarily and give a made-up correlation."""
    if not np.isfinite(np.asarray(x, dtype=np.float64)).all():
        return pearson(x, y)
    return pearson(rankdata(x), rankdata(y))


def classification_metrics(
    names: Sequence[str], preds: Sequence[int], labels: Sequence[int]
) -> dict[str, float | None]:
    fns = {"accuracy": accuracy, "f1": binary_f1, "mcc": matthews_corrcoef}
    return {n: fns[n](preds, labels) for n in names}


def regression_metrics(
    names: Sequence[str], preds: Sequence[float], labels: Sequence[float]
) -> dict[str, float]:
    fns = {"pearson": pearson, "spearman": spearman}
    return {n: fns[n](preds, labels) for n in names}


# ---- CoNLL entity-level F1 (seqeval default mode, IOB2) -------------------------------------


def entity_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """(type, start, end-exclusive) chunks as conlleval/seqeval (default mode) extract them:
    a chunk starts at B-X, or at I-X that follows a tag of another type or O."""
    spans: set[tuple[str, int, int]] = set()
    start, etype = None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, kind = tag.partition("-")
        if prefix not in ("B", "I"):
            prefix, kind = "O", ""
        ends = start is not None and (prefix in ("O", "B") or kind != etype)
        if ends:
            spans.add((etype, start, i))
            start, etype = None, None
        if prefix == "B" or (prefix == "I" and start is None):
            start, etype = i, kind
    return spans


def entity_f1(pred_seqs: Sequence[Sequence[str]], gold_seqs: Sequence[Sequence[str]]) -> float:
    """Micro F1 over exact (type, span) matches across all sentences."""
    tp = n_pred = n_gold = 0
    for pred, gold in zip(pred_seqs, gold_seqs, strict=True):
        ps, gs = entity_spans(pred), entity_spans(gold)
        tp += len(ps & gs)
        n_pred += len(ps)
        n_gold += len(gs)
    if not tp:
        return 0.0
    precision, recall = tp / n_pred, tp / n_gold
    return 100 * 2 * precision * recall / (precision + recall)


# ---- SQuAD v1.1 (official evaluate-v1.1.py) ---------------------------------------------------


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_exact(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_f1(prediction: str, ground_truth: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], answers: dict[str, list[str]]) -> dict[str, float]:
    """EM and F1 (0-100), each the max over the gold answers, averaged over questions in `answers`."""
    em = f1 = 0.0
    for qid, golds in answers.items():
        pred = predictions.get(qid, "")
        em += max(squad_exact(pred, g) for g in golds)
        f1 += max(squad_f1(pred, g) for g in golds)
    n = max(len(answers), 1)
    return {"exact_match": 100 * em / n, "f1": 100 * f1 / n}
