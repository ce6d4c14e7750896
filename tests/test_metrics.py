"""GLUE, CoNLL and SQuAD metrics against hand-computed and published reference values (no scipy)."""

from __future__ import annotations

import math

import pytest

from finetuning.metrics import (
    accuracy,
    binary_f1,
    entity_f1,
    entity_spans,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    rankdata,
    spearman,
    squad_f1,
    squad_metrics,
)


def test_accuracy_and_binary_f1_by_hand():
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert accuracy(preds, labels) == pytest.approx(60.0)
    # tp=2 fp=1 fn=1 -> F1 = 2*2 / (2*2+1+1)
    assert binary_f1(preds, labels) == pytest.approx(100 * 4 / 6)
    assert binary_f1([0, 0], [1, 1]) == 0.0


def test_matthews_by_hand():
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    # tp=2 tn=1 fp=1 fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert matthews_corrcoef(preds, labels) == pytest.approx(100 / 6)
    assert matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(100)
    assert matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-100)
    # constant predictions (what an untrained CoLA model does): defined as 0, as in sklearn
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0


def test_pearson_and_spearman_known_values():
    assert pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(50.0)
    assert pearson([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-100.0)
    # monotonic but not linear: Spearman 100, Pearson below
    assert spearman([1, 2, 3, 4, 5], [1, 4, 9, 16, 25]) == pytest.approx(100.0)
    assert pearson([1, 2, 3, 4, 5], [1, 4, 9, 16, 25]) < 99.0
    # with a tie; scipy.stats.spearmanr gives 0.8207826816681233
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(82.07826816681233)


def test_correlations_of_a_diverged_units_predictions_are_undefined_not_made_up():
    """A diverged STS-B unit predicts NaN: Pearson and Spearman both NaN (the scorecard's
    'undefined (diverged)'). Ranks of NaNs used to give Spearman 100.0 and 40.0 here."""
    nan = float("nan")
    for preds in ([nan] * 5, [1, nan, 3, 4, 5], [1, 2, float("inf"), 4, 5]):
        assert math.isnan(spearman(preds, [1, 2, 3, 4, 5])), preds
        assert math.isnan(pearson(preds, [1, 2, 3, 4, 5])), preds


def test_rankdata_averages_ties():
    assert rankdata([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert rankdata([3, 1, 2]).tolist() == [3.0, 1.0, 2.0]


def test_entity_spans_iob2_rules():
    assert entity_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    assert entity_spans(["I-ORG", "I-ORG", "O"]) == {("ORG", 0, 2)}  # I- after O starts a chunk
    assert entity_spans(["B-PER", "I-LOC"]) == {("PER", 0, 1), ("LOC", 1, 2)}  # type switch
    assert entity_spans(["B-PER", "B-PER"]) == {("PER", 0, 1), ("PER", 1, 2)}


def test_entity_f1_seqeval_readme_example():
    # the example in seqeval's README: f1_score(y_true, y_pred) == 0.50
    y_true = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    y_pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    assert entity_f1(y_pred, y_true) == pytest.approx(50.0)
    assert entity_f1(y_true, y_true) == pytest.approx(100.0)
    # a partially found entity earns nothing: exact span match only
    assert entity_f1([["B-PER", "O", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]]) == pytest.approx(
        50.0
    )


def test_entity_f1_counts_predicted_and_gold_entities_separately():
    """Recall is over the gold entities, precision over the predicted ones: a model that finds one
    of two entities has P 1, R 1/2, F1 66.7 (and one that adds a wrong entity to a right one too)."""
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert entity_f1([["B-PER", "I-PER", "O", "O"]], gold) == pytest.approx(100 * 2 / 3)
    assert entity_f1(gold, [["B-PER", "I-PER", "O", "O"]]) == pytest.approx(100 * 2 / 3)


def test_squad_normalization_and_scores():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert squad_f1("Denver Broncos won", "the Denver Broncos") == pytest.approx(0.8)
    scores = squad_metrics(
        {"q1": "Denver Broncos", "q2": "in 1990", "q3": "nothing"},
        {"q1": ["the Denver Broncos."], "q2": ["1990", "the year 1990"], "q3": ["Santa Clara"]},
    )
    # q1 exact after normalization; q2 best gold "1990": F1 2*(1/2*1)/(1.5) = 2/3; q3 wrong
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    assert squad_metrics({}, {"q": ["x"]}) == {"exact_match": 0.0, "f1": 0.0}


def test_squad_scores_are_the_best_over_all_gold_answers():
    """As the official script: EM and F1 are each the max over the golds, whichever position the
    best-matching gold has (here the second: against the first alone EM 0, F1 66.7)."""
    scores = squad_metrics({"q": "1990"}, {"q": ["the year 1990", "1990"]})
    assert scores == pytest.approx({"exact_match": 100.0, "f1": 100.0})
