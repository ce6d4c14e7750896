"""Chance levels: majority-class metrics and the noise margin that marks a score "(chance)"."""

from __future__ import annotations

import json
import math

import pytest

from finetuning.chance import chance_threshold, is_at_chance, majority_metrics
from finetuning.glue import SequenceTask
from finetuning.scorecard import build_scorecard
from finetuning.tasks import load_task_specs
from preprocessing.wordpiece import load_tokenizer


def test_majority_class_metrics_like_mrpc():
    train = [1] * 70 + [0] * 30
    dev = [1] * 68 + [0] * 32
    m = majority_metrics(["accuracy", "f1"], train, dev)
    assert m["accuracy"] == pytest.approx(68.0)
    assert m["f1"] == pytest.approx(100 * 2 * 68 / (2 * 68 + 32))
    assert majority_metrics(["mcc"], train, dev) == {"mcc": 0.0}  # a constant prediction has MCC 0
    # the best constant prediction on the evaluation labels, even where the training set's most
    # frequent label is another: a model that always answers 1 must not look above chance
    assert majority_metrics(["accuracy"], [0, 0, 1], [1, 1, 1, 0]) == {"accuracy": 75.0}
    # ... and even where that label never occurs in the training set
    assert majority_metrics(["accuracy"], [0, 0], [1, 1, 1, 0]) == {"accuracy": 75.0}
    # with F1 the constant that maximizes the task score: all-positive, even for a negative majority
    both = majority_metrics(["accuracy", "f1"], [0, 0, 1], [0, 0, 0, 1, 1])
    assert both == pytest.approx({"accuracy": 40.0, "f1": 100 * 2 * 2 / (2 * 2 + 3)})


def test_noise_margin_scales_with_examples():
    # SST-2 dev: 872 examples, majority 50.9% -> margin 1.645 * sqrt(p0 (1 - p0) / n) = 2.79 points
    chance = {"accuracy": 50.9}
    assert chance_threshold(chance, 872) == pytest.approx(50.9 + 1.645 * 100 * math.sqrt(0.509 * 0.491 / 872))
    assert is_at_chance(53.0, chance, 872) and not is_at_chance(54.0, chance, 872)
    assert not is_at_chance(53.0, chance, 100_000)  # the same gap is real on a huge dev set
    # correlations: chance 0, margin 1.645 / sqrt(n - 1)
    assert is_at_chance(5.0, {"mcc": 0.0}, 500) and not is_at_chance(8.0, {"mcc": 0.0}, 500)
    assert is_at_chance(float("nan"), {"pearson": 0.0, "spearman": 0.0}, 1500)


def test_noise_margins_exactly():
    # a correlation's standard error under independence is 1 / sqrt(n - 1): 1/10 on 101 examples
    assert chance_threshold({"mcc": 0.0}, 101) == pytest.approx(16.45)
    assert chance_threshold({"pearson": 0.0, "spearman": 0.0}, 401) == pytest.approx(1.645 * 100 / 20)
    # a single-class dev set (majority 100%) has no binomial spread: its margin is that of a
    # variance floor of 1e-4 (a standard deviation of one point), not 0
    assert chance_threshold({"accuracy": 100.0}, 100) == pytest.approx(100 + 1.645 * 100 * 0.01 / 10)
    # span scores (SQuAD's exact match and F1, NER's entity F1): one point above chance's 0, the F1
    # too (it was taken for a classification F1 of majority rate 0.5: 6.4 points on 48 examples)
    assert chance_threshold({"exact_match": 0.0, "f1": 0.0}, 48) == pytest.approx(1.0)
    assert chance_threshold({"entity_f1": 0.0}, 48) == pytest.approx(1.0)
    assert not is_at_chance(11.0, {"exact_match": 0.0, "f1": 0.0}, 48)
    # a classification F1 keeps its binomial margin (MRPC: majority accuracy 68.4, F1 81.2)
    mrpc = {"accuracy": 68.4, "f1": 81.2}
    margin = 1.645 * 100 * (0.684 * 0.316 / 408) ** 0.5
    assert chance_threshold(mrpc, 408) == pytest.approx((68.4 + 81.2) / 2 + margin)


def test_one_evaluation_example_cannot_show_a_score_above_chance():
    """max_eval_examples=1: no spread can be estimated from one example; every score is at chance
    (a correlation's 1 / sqrt(n - 1) divided by zero)."""
    for chance in ({"mcc": 0.0}, {"pearson": 0.0, "spearman": 0.0}, {"accuracy": 100.0}):
        assert chance_threshold(chance, 1) == math.inf
        assert is_at_chance(100.0, chance, 1)


def _unit(label, kind, task, seed, metrics, chance):
    return {
        "unit": f"{task}-lr0.0001-s{seed}", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": sum(metrics.values()) / len(metrics), "lr": 1e-4, "seed": seed, "checkpoint": "/x/" + label,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": True, "n_train": 1000, "n_eval": 872,
        "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0, "notes": {}, "chance_metrics": chance,
    }  # fmt: skip


def test_scorecard_marks_chance_rows_and_states_the_headline(tmp_path):
    sst2, cola = {"accuracy": 50.9}, {"mcc": 0.0}
    results = [
        _unit("ours", "pretrained", "sst2", 1, {"accuracy": 70.0}, sst2),
        _unit("ours", "pretrained", "sst2", 2, {"accuracy": 72.0}, sst2),
        _unit("ours", "pretrained", "cola", 1, {"mcc": 1.0}, cola),
        _unit("ours", "pretrained", "cola", 2, {"mcc": 3.0}, cola),
        _unit("random:tiny", "random", "sst2", 1, {"accuracy": 51.0}, sst2),
        _unit("random:tiny", "random", "sst2", 2, {"accuracy": 52.0}, sst2),
        _unit("random:tiny", "random", "cola", 1, {"mcc": 4.0}, cola),
        _unit("random:tiny", "random", "cola", 2, {"mcc": 4.0}, cola),
    ]
    card = build_scorecard(results, tmp_path)
    ours, rnd = card["rows"]
    assert ours["tasks"]["sst2"]["at_chance"] is False and ours["tasks"]["cola"]["at_chance"] is True
    assert rnd["tasks"]["sst2"]["at_chance"] is True
    assert ours["tasks"]["sst2"]["metrics_std"]["accuracy"] == pytest.approx(math.sqrt(2.0))
    h = card["headline"]
    assert h["ahead_on"] == ["sst2"] and h["at_chance"] == ["cola"] and h["seeds"] == 2
    assert h["pretraining_helped"] is False  # ahead on 1 of 2 tasks: not a majority
    md = (tmp_path / "scorecard.md").read_text()
    assert "| ours | 71.0 ±1.4 | 2.0 ±1.4 (chance) | 36.5 |" in md
    assert "| best constant prediction (chance) | 50.9 | 0.0 | — |" in md
    assert (
        "ahead on 1 of 2 tasks (sst2) beyond seed noise" in md
        and "**At chance (no better than the best constant prediction within evaluation noise):**" in md
    )
    # above on average (+8.8) but ahead on only one task of two: said as such, with each task's delta
    assert (
        "**Pretraining helped on some tasks only:** ours is ahead of random init (tiny) on sst2 (+19.5)" in md
    )
    # two seeds each: Welch df 1, so the margin is wide (t = 12.7) and cola's -2.0 is level, not behind
    assert "level within seed noise on cola (-2.0)" in md and "has not helped" not in md
    assert h["behind_on"] == [] and h["noise_tested"] is True


def _sst2_cola_card(tmp_path, ours: tuple[float, float], random_init: tuple[float, float]):
    """Scorecard (and its markdown) of one seed each: SST-2 accuracy and CoLA MCC per model."""
    sst2, cola = {"accuracy": 50.9}, {"mcc": 0.0}
    results = []
    for label, kind, (acc, mcc) in (("ours", "pretrained", ours), ("random:tiny", "random", random_init)):
        results += [
            _unit(label, kind, "sst2", 1, {"accuracy": acc}, sst2),
            _unit(label, kind, "cola", 1, {"mcc": mcc}, cola),
        ]
    card = build_scorecard(results, tmp_path)
    return card, (tmp_path / "scorecard.md").read_text()


def test_headline_says_pretraining_has_not_helped_when_behind_on_average(tmp_path):
    card, md = _sst2_cola_card(tmp_path, ours=(71.0, 2.0), random_init=(70.0, 9.0))
    assert card["headline"]["ahead_on"] == ["sst2"] and card["headline"]["pretraining_helped"] is False
    # how the differences were tested qualifies both counts, ahead and behind, not the last alone
    assert "ahead on 1 of 2 tasks (sst2) and behind on 1 (cola) by sign only (fewer than two seeds" in md, md
    assert "**Pretraining has not helped here:**" in md and "some tasks only" not in md
    # a model bertflow did not pretrain (an import): advice about its fine-tuning, not more tokens
    assert "bertflow did not pretrain this model" in md and "cpu-hour" not in md


def test_a_model_bertflow_pretrained_that_has_not_helped_is_pointed_to_more_tokens(tmp_path):
    model = tmp_path / "pretrain" / "abc" / "model"  # a pretraining output: marker with steps, run spec
    model.mkdir(parents=True)
    (model.parent / "_COMPLETE.json").write_text(json.dumps({"stage": "pretrain", "max_steps": 300}))
    (model.parent / "run_spec.json").write_text("{}")
    results = [
        {
            **_unit("ours", "pretrained", "sst2", 1, {"accuracy": 60.0}, {"accuracy": 50.9}),
            "checkpoint": str(model),
        },
        _unit("random:tiny", "random", "sst2", 1, {"accuracy": 70.0}, {"accuracy": 50.9}),
    ]
    card = build_scorecard(results, tmp_path / "card")
    md = (tmp_path / "card" / "scorecard.md").read_text()
    assert (
        card["headline"]["pretrained_here"] is True
        and card["headline"]["name"] == "pretrained (custom shape, 300 steps)"
    )
    assert "Pretrain on more tokens" in md and "`bertflow run configs/cpu-hour.yaml`" in md
    assert "bertflow did not pretrain" not in md


def test_an_export_of_a_model_bertflow_pretrained_is_named_and_advised_as_one(tmp_path):
    """`export-hf` of a pretraining output, copied anywhere: its own marker's pretraining_steps make
    the scorecard name it by its phases' steps and point to more tokens, as for the run's model/."""
    exported = tmp_path / "shipped" / "my-bert"
    exported.mkdir(parents=True)
    (exported / "_COMPLETE.json").write_text(
        json.dumps(
            {
                "command": "export-hf",
                "source": "/gone/runs/pretrain/abc/model",
                "pretraining_steps": [3000, 8500],
            }
        )
    )
    results = [
        {
            **_unit("my-bert", "pretrained", "sst2", 1, {"accuracy": 60.0}, {"accuracy": 50.9}),
            "checkpoint": str(exported),
        },
        _unit("random:tiny", "random", "sst2", 1, {"accuracy": 70.0}, {"accuracy": 50.9}),
    ]
    card = build_scorecard(results, tmp_path / "card")
    md = (tmp_path / "card" / "scorecard.md").read_text()
    assert card["headline"]["pretrained_here"] is True
    assert card["headline"]["name"] == "pretrained (custom shape, 3,000 + 8,500 steps)"
    assert "Pretrain on more tokens" in md and "bertflow did not pretrain" not in md


def test_a_difference_that_rounds_to_zero_prints_without_a_minus_sign(tmp_path):
    acc = {"accuracy": 50.9}
    results = [
        _unit("ours", "pretrained", "sst2", 1, {"accuracy": 74.98}, acc),
        _unit("random:tiny", "random", "sst2", 1, {"accuracy": 75.0}, acc),
    ]
    build_scorecard(results, tmp_path)
    md = (tmp_path / "scorecard.md").read_text()
    assert "| +0.0 | +0.0 |" in md and "-0.0" not in md


def test_headline_says_pretraining_helped_only_when_ahead_on_average_and_on_most_tasks(tmp_path):
    card, md = _sst2_cola_card(tmp_path, ours=(80.0, 20.0), random_init=(70.0, 10.0))
    assert card["headline"]["pretraining_helped"] is True
    assert "has not helped" not in md


def test_a_task_at_chance_never_counts_as_ahead(tmp_path):
    """RTE-like: the pretrained model beats random init beyond seed noise (3 seeds, tight spread) but
    both sit within evaluation noise of the majority class, so the task is named, not counted."""
    sst2, cola = {"accuracy": 50.9}, {"mcc": 0.0}
    results = []
    for seed, (ours_acc, rnd_acc, ours_mcc, rnd_mcc) in enumerate(
        [(80.0, 70.0, 1.5, 0.0), (80.5, 70.2, 1.6, 0.1), (80.2, 70.1, 1.4, 0.2)], start=1
    ):
        results += [
            _unit("ours", "pretrained", "sst2", seed, {"accuracy": ours_acc}, sst2),
            _unit("ours", "pretrained", "cola", seed, {"mcc": ours_mcc}, cola),
            _unit("random:tiny", "random", "sst2", seed, {"accuracy": rnd_acc}, sst2),
            _unit("random:tiny", "random", "cola", seed, {"mcc": rnd_mcc}, cola),
        ]
    card = build_scorecard(results, tmp_path)
    h, md = card["headline"], (tmp_path / "scorecard.md").read_text()
    assert h["at_chance"] == ["cola"] and h["task_deltas"]["cola"] > h["task_margins"]["cola"]
    assert h["ahead_on"] == ["sst2"] and h["ahead_at_chance"] == ["cola"]
    assert h["pretraining_helped"] is False  # 1 of 2 tasks: not more than half
    assert "ahead on 1 of 2 tasks (sst2; cola too, but at chance there) beyond seed noise" in md
    assert (
        "on sst2 (+10.1); ahead but at chance on cola (+1.4)." in md and "level within seed noise" not in md
    )


def test_with_two_checkpoints_the_headline_is_about_the_one_random_init_was_made_for(tmp_path):
    """`finetune --checkpoint ours --checkpoint a-minilm`: the baseline is random:ours, but the headline
    judged whichever pretrained row came first (a-minilm, sorted first), calling it the pretrained model."""
    acc = {"accuracy": 50.9}
    results = [
        _unit("a-minilm", "pretrained", "sst2", 1, {"accuracy": 80.0}, acc),
        _unit("ours", "pretrained", "sst2", 1, {"accuracy": 60.0}, acc),
        _unit("random:ours", "random", "sst2", 1, {"accuracy": 70.0}, acc),
    ]
    card = build_scorecard(results, tmp_path)
    assert card["headline"]["checkpoint"] == "ours" and card["headline"]["versus"] == "random:ours"


def test_a_single_class_dev_set_has_an_undefined_chance_score_not_a_crash(tmp_path):
    """A dev set with one class leaves MCC and F1 undefined (None) for every constant prediction
    too: summing them raised `TypeError: unsupported operand type(s) for +: 'float' and 'NoneType'`
    after training. The chance row says "undefined", as the score rows do."""
    assert majority_metrics(["accuracy", "f1"], [0, 1], [0, 0, 0]) == {"accuracy": 100.0, "f1": None}
    assert majority_metrics(["mcc"], [0, 1], [1, 1]) == {"mcc": None}
    chance = majority_metrics(["mcc"], [0, 1], [0, 0, 0])
    results = [{**_unit(label, kind, "cola", 1, {"mcc": 0.0}, chance), "metrics": {"mcc": None}, "score": None}
               for label, kind in (("ours", "pretrained"), ("random:tiny", "random"))]  # fmt: skip
    build_scorecard(results, tmp_path)
    md = (tmp_path / "scorecard.md").read_text()
    assert "| best constant prediction (chance) | undefined | — |" in md


def test_the_chance_row_names_its_constant_answer_which_can_be_the_minority_class(tmp_path, minilm_dir):
    """A task scored by accuracy and F1 on 11 `pos` of 30 dev rows: the best constant answer by the
    mean of the two is always `pos` (36.7 / 53.7, mean 45.2; always `neg`: 63.3 / 0). The legend
    said "the majority class", so a model answering all `neg` (63.3, above the row's 36.7) looked
    wrongly marked "(chance)". The row now names the answer per metric and the legend the rule."""
    rows = ["good film\tpos"] * 11 + ["bad film\tneg"] * 19
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    (tmp_path / "tasks.yaml").write_text(
        "mine: {format: tsv, kind: classification, train: dev.tsv, dev: dev.tsv, text_a: sentence, "
        "label: label, labels: [neg, pos], metrics: [accuracy, f1]}\n"
    )
    spec = load_task_specs(str(tmp_path / "tasks.yaml"))["mine"]
    task = SequenceTask(spec, load_tokenizer(minilm_dir)[0], 16, None, None, None)
    chance = task.chance_metrics()
    assert chance == pytest.approx({"accuracy": 100 * 11 / 30, "f1": 100 * 22 / 41})
    assert task.chance_prediction() == "pos"
    results = [
        {**_unit(label, kind, "mine", 1, {"accuracy": 63.3, "f1": 0.0}, chance), "glue": False, "n_eval": 30,
         "chance_prediction": task.chance_prediction()}
        for label, kind in (("ours", "pretrained"), ("random:tiny", "random"))
    ]  # fmt: skip
    build_scorecard(results, tmp_path / "card")
    md = (tmp_path / "card" / "scorecard.md").read_text()
    assert "| best constant prediction (chance) | 36.7 (always pos) | 53.7 (always pos) | — |" in md
    assert "| ours | 63.3 (chance) | 0.0 (chance) |" in md
    assert (
        "the constant answer (`always LABEL`) whose dev score (the mean of the task's metrics) is best" in md
    )
