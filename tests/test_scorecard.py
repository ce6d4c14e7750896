"""The scorecard's per-task figures and GLUE-style average: chance against the evaluated examples,
standard deviations per metric, averages over GLUE tasks only, and claims of seed noise only where
it was measured."""

from __future__ import annotations

import math

import pytest

from finetuning.scorecard import build_scorecard, headline_text


def _result(label, kind, task, seed, metrics, chance=None, glue=True, n_train=1000, n_eval=872):
    return {
        "unit": f"{task}-lr5e-05-s{seed}", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": sum(metrics.values()) / len(metrics), "lr": 5e-5, "seed": seed, "checkpoint": "/x/" + label,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": glue, "n_train": n_train,
        "n_eval": n_eval, "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0, "notes": {},
        "chance_metrics": chance,
    }  # fmt: skip


def _ours(task, seed, metrics, **kw):
    return _result("ours", "pretrained", task, seed, metrics, **kw)


def _random(task, seed, metrics, **kw):
    return _result("random:tiny", "random", task, seed, metrics, **kw)


def _std(values):
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def test_at_chance_is_judged_on_the_evaluation_examples_not_the_training_set(tmp_path):
    """55.0 against a 50.9 majority is within the noise of 100 dev examples (margin 8.2), however
    large the training set: with n_train = 10,000 the margin would be 0.8 and 55.0 "above chance"."""
    chance = {"accuracy": 50.9}
    card = build_scorecard(
        [_ours("sst2", 1, {"accuracy": 55.0}, chance=chance, n_train=10_000, n_eval=100)], tmp_path
    )
    assert card["rows"][0]["tasks"]["sst2"]["at_chance"] is True


def test_the_glue_average_leaves_out_tasks_outside_glue(tmp_path):
    results = [
        _ours("sst2", 1, {"accuracy": 80.0}),
        _ours("conll2003", 1, {"entity_f1": 20.0}, glue=False),
    ]
    row = build_scorecard(results, tmp_path)["rows"][0]
    assert row["glue_average"] == pytest.approx(80.0) and row["glue_tasks"] == ["sst2"]


def test_a_scorecard_without_glue_tasks_is_judged_on_its_tasks(tmp_path):
    """NER and SQuAD only: there is no GLUE-style average, so pretraining that is ahead beyond seed
    noise on both tasks has helped (it was 'has not helped: GLUE-style average not above it'), and
    one ahead on one of two is told so without citing an average it does not have."""
    results = []
    for seed, (ours_f1, rnd_f1, ours_em, rnd_em) in enumerate(
        [(80, 40, 70, 20), (81, 41, 71, 21), (82, 42, 72, 22)], 1
    ):
        results += [
            _ours("conll2003", seed, {"entity_f1": ours_f1}, glue=False, n_eval=5000),
            _random("conll2003", seed, {"entity_f1": rnd_f1}, glue=False, n_eval=5000),
            _ours("squad", seed, {"exact_match": ours_em, "f1": ours_em + 5}, glue=False, n_eval=5000),
            _random("squad", seed, {"exact_match": rnd_em, "f1": rnd_em + 5}, glue=False, n_eval=5000),
        ]
    card = build_scorecard(results, tmp_path)
    assert card["headline"]["glue_tasks"] == [] and card["headline"]["pretraining_helped"] is True
    assert "GLUE-style" not in (tmp_path / "scorecard.md").read_text().split("## ")[0]
    level = [r if r["task"] != "squad" or r["checkpoint_kind"] != "pretrained" else
             {**r, "metrics": {"exact_match": r["metrics"]["exact_match"] - 50, "f1": r["metrics"]["f1"] - 50},
              "score": r["score"] - 50} for r in results]  # fmt: skip
    card = build_scorecard(level, tmp_path / "level")
    md = (tmp_path / "level" / "scorecard.md").read_text()
    assert card["headline"]["pretraining_helped"] is False and card["headline"]["ahead_on"] == ["conll2003"]
    assert (
        "That is short of pretraining that helps: ahead beyond seed noise on more than half the tasks." in md
    )
    assert "GLUE-style average" not in md


def test_no_glue_average_std_when_tasks_ran_different_seeds(tmp_path):
    """Per-seed averages need every GLUE task on the same seeds: seeds {1, 2} on SST-2 and {1, 3}
    on CoLA have no per-seed average of seed 2 or 3."""
    results = [
        _ours("sst2", 1, {"accuracy": 80.0}),
        _ours("sst2", 2, {"accuracy": 82.0}),
        _ours("cola", 1, {"mcc": 20.0}),
        _ours("cola", 3, {"mcc": 24.0}),
    ]
    row = build_scorecard(results, tmp_path)["rows"][0]
    assert row["glue_average"] == pytest.approx(51.5) and row["glue_average_std"] is None
    # the control: the same seeds on both tasks give the std of the per-seed averages (50, 53)
    results[3] = _ours("cola", 2, {"mcc": 24.0})
    row = build_scorecard(results, tmp_path)["rows"][0]
    assert row["glue_average_std"] == pytest.approx(_std([50.0, 53.0]))


def test_a_mix_of_single_and_multi_seed_tasks_is_not_claimed_beyond_seed_noise(tmp_path):
    """SST-2 ran three seeds per model, CoLA one: CoLA's lead is a sign only, so the headline
    must not say the leads are beyond seed noise."""
    results = []
    for seed, (ours, rnd) in enumerate([(90.0, 70.0), (91.0, 71.0), (89.0, 69.0)], start=1):
        results += [_ours("sst2", seed, {"accuracy": ours}), _random("sst2", seed, {"accuracy": rnd})]
    results += [_ours("cola", 1, {"mcc": 40.0}), _random("cola", 1, {"mcc": 10.0})]
    card = build_scorecard(results, tmp_path)
    h, text = card["headline"], headline_text(card["headline"])
    assert sorted(h["ahead_on"]) == ["cola", "sst2"] and h["noise_tested"] is False
    assert "by sign only (fewer than two seeds: no seed-noise estimate)" in text
    assert "beyond seed noise" not in text


def test_the_average_difference_leaves_out_a_task_random_init_lacks(tmp_path):
    """All random-init units of CoLA failed: the average difference is over SST-2 alone, not the
    pretrained model's mean of SST-2 and CoLA against random init's SST-2."""
    results = []
    for seed in (1, 2):
        results += [
            _ours("sst2", seed, {"accuracy": 80.0 + seed}),
            _ours("cola", seed, {"mcc": 10.0 * seed}),
            _random("sst2", seed, {"accuracy": 70.0 + 2 * seed}),
        ]
    card = build_scorecard(results, tmp_path)
    d, h = card["deltas"][0], card["headline"]
    assert d["glue_average"] == pytest.approx(81.5 - 73.0) and d["glue_average_tasks"] == ["sst2"]
    assert d["glue_average_margin"] is not None and h["glue_average_left_out"] == ["cola"]


def test_metric_std_is_per_metric_for_a_task_with_two_metrics(tmp_path):
    """MRPC is scored on accuracy and F1: each column's ± is its own metric's spread over seeds,
    not the spread of their mean."""
    acc, f1 = [80.0, 82.0, 84.0], [88.0, 88.0, 85.0]
    results = [_ours("mrpc", s, {"accuracy": a, "f1": f}) for s, a, f in zip((1, 2, 3), acc, f1)]
    info = build_scorecard(results, tmp_path)["rows"][0]["tasks"]["mrpc"]
    assert info["metrics_std"] == pytest.approx({"accuracy": 2.0, "f1": _std(f1)})
    assert info["score_std"] == pytest.approx(_std([84.0, 85.0, 84.5]))
    row = next(
        line for line in (tmp_path / "scorecard.md").read_text().splitlines() if line.startswith("| ours")
    )
    assert f"| 82.0 ±2.0 | 87.0 ±{_std(f1):.1f} |" in row


def test_the_w_and_b_scorecard_run_summary_holds_the_verdict_the_difference_and_each_tasks_mean(
    tmp_path, monkeypatch
):
    """The scorecard's W&B run summarised the two GLUE-style averages only: the difference from
    random init, its seed-noise margin, the verdict and the per-task means were in the table alone,
    where W&B's run list cannot show, sort or compare them."""
    from common.tracking import Tracker, WandbTarget
    from tests.wandb_records import summary

    monkeypatch.delenv("WANDB_MODE", raising=False)
    results = []
    for seed, (ours, rnd, mcc) in enumerate([(90.0, 70.0, 30.0), (92.0, 72.0, 50.0)], start=1):
        results += [_ours("sst2", seed, {"accuracy": ours}), _random("sst2", seed, {"accuracy": rnd})]
        results += [_ours("cola", seed, {"mcc": mcc}), _random("cola", seed, {"mcc": 10.0})]
    tracker = Tracker(tmp_path, WandbTarget(project="bertflow-test"), name="scorecard")
    card = build_scorecard(results, tmp_path, tracker)
    tracker.finish()
    h, logged = card["headline"], summary(tmp_path)
    assert logged["finetune/verdict"] == headline_text(h)
    assert logged["finetune/pretraining_helped"] is h["pretraining_helped"]
    assert logged["finetune/delta_vs_random/glue_average"] == pytest.approx(65.5 - 40.5)
    assert logged["finetune/delta_vs_random/glue_average_margin"] == h["glue_average_margin"] is not None
    assert logged["finetune/delta_vs_random/sst2"] == pytest.approx(20.0)
    assert logged["finetune/delta_vs_random/cola_margin"] == h["task_margins"]["cola"]
    assert {k: v for k, v in logged.items() if k.count("/") == 2 and "delta" not in k} == {
        "finetune/ours/glue_average": pytest.approx(65.5),
        "finetune/ours/sst2": pytest.approx(91.0),
        "finetune/ours/cola": pytest.approx(40.0),
        "finetune/random:tiny/glue_average": pytest.approx(40.5),
        "finetune/random:tiny/sst2": pytest.approx(71.0),
        "finetune/random:tiny/cola": pytest.approx(10.0),
    }


def test_a_built_in_task_name_redefined_in_a_task_file_has_no_paper_reference(tmp_path):
    """`sst2` pointed at another (3-class) file in --task-config kept "BERT-base (Devlin et al.
    2019) 92.7" on its scorecard; now the reference is only the built-in definition's, and a note
    says the name was redefined."""
    from finetuning.tasks import load_task_specs, redefined_builtin_note

    own = tmp_path / "own.yaml"
    own.write_text("sst2: {format: tsv, kind: classification, train: three_train.tsv, dev: three_dev.tsv, "
                   "text_a: text, label: cls, labels: [neg, neu, pos], metrics: [accuracy]}\n")  # fmt: skip
    note = redefined_builtin_note(load_task_specs(str(own))["sst2"])
    assert note == {"redefined": f"sst2 is redefined in {own} (other data files or labels than the built-in "
                                 "task of that name), so it has no BERT-base reference figure."}  # fmt: skip
    assert redefined_builtin_note(load_task_specs()["sst2"]) == {}
    same = tmp_path / "same.yaml"  # the built-in definition copied into a task file: the same task
    same.write_text("sst2: {format: tsv, kind: classification, train: 'data:glue/SST-2/train.tsv', dev: "
                    "'data:glue/SST-2/dev.tsv', text_a: sentence, label: label, labels: [0, 1], metrics: [accuracy]}\n")  # fmt: skip
    assert redefined_builtin_note(load_task_specs(str(same))["sst2"]) == {}
    spelled = tmp_path / "spelled.yaml"  # the same files by their absolute paths: still the same task
    data = load_task_specs()["sst2"].path("train").parent
    spelled.write_text(same.read_text().replace("'data:glue/SST-2/", f"'{data}/"))
    assert redefined_builtin_note(load_task_specs(str(spelled))["sst2"]) == {}
    results = [{**_ours("sst2", 1, {"accuracy": 60.0}), "notes": note}, _ours("cola", 1, {"mcc": 20.0})]
    card = build_scorecard(results, tmp_path)
    assert (
        "sst2/accuracy" not in card["reference"]["values"] and card["reference"]["values"]["cola/mcc"] == 52.1
    )
    md = (tmp_path / "scorecard.md").read_text()
    assert "| reference: BERT-base (Devlin et al. 2019) | — | 52.1† | — |" in md
    assert f"- Task definition: sst2 is redefined in {own}" in md


def test_a_failed_unit_is_said_in_the_average_and_the_seed_count(tmp_path):
    """One STS-B unit failed: the GLUE-style average had no seed-noise estimate (its tasks ran
    different seeds) and was judged by its sign alone, while the headline said neither, and "mean
    of 3 seed(s) per task" where STS-B had 2."""
    results = []
    for seed in (1, 2, 3):
        results += [
            _ours("sst2", seed, {"accuracy": 80.0 + seed}),
            _random("sst2", seed, {"accuracy": 70.0 + seed}),
        ]
        results += [_random("stsb", seed, {"pearson": 17.0 + seed})]
        results += [_ours("stsb", seed, {"pearson": 48.0 + seed})] if seed < 3 else []
    card = build_scorecard(results, tmp_path)
    h = card["headline"]
    assert h["glue_average_margin"] is None and h["noise_tested"] is True
    text = headline_text(h)
    assert (
        "GLUE-style average +20.2 points (by sign: no seed-noise estimate, its tasks ran different seeds)"
        in text
    )
    assert "mean of 2-3 seeds per task." in text
    # a unit of the random-init baseline failed instead: said the same
    results = [r for r in results if r["task"] != "stsb"]
    results += [_ours("stsb", seed, {"pearson": 48.0 + seed}) for seed in (1, 2, 3)]
    results += [_random("stsb", seed, {"pearson": 17.0 + seed}) for seed in (1, 2)]
    assert "mean of 2-3 seeds per task." in headline_text(build_scorecard(results, tmp_path)["headline"])


def test_a_regressions_chance_cells_say_what_the_zero_is(tmp_path):
    """The chance row named the constant answer of a classification (`52.0 (always pos)`) and the
    legend SQuAD's baseline, but a regression's cells read a bare `0.0`, said nowhere: a constant
    prediction has no correlation with the gold scores."""
    chance = {"pearson": 0.0, "spearman": 0.0}
    results = [_ours("stsb", 1, {"pearson": 20.0, "spearman": 18.0}, chance=chance, n_eval=100)]
    results += [_ours("sst2", 1, {"accuracy": 60.0}, chance={"accuracy": 52.0}, n_eval=100)]
    build_scorecard(results, tmp_path)
    lines = (tmp_path / "scorecard.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| best constant prediction (chance) |"))
    assert row.count(" 0.0 (no correlation) |") == 2 and "| 52.0 |" in row, row
    # the legend explains the baselines of the tasks on the card: a regression's, not SQuAD's
    legend = next(line for line in lines if line.startswith("Dev-set scores"))
    assert "for a regression 0, a constant prediction" in legend and "SQuAD" not in legend, legend
    build_scorecard(results[1:], tmp_path)  # SST-2 alone: neither
    legend = next(x for x in (tmp_path / "scorecard.md").read_text().splitlines() if x.startswith("Dev-set"))
    assert "regression" not in legend and "SQuAD" not in legend, legend
    # a regression whose results record no chance level (a scorecard before it was kept): its cells say nothing
    build_scorecard([{**results[0], "chance_metrics": None}, results[1]], tmp_path)
    lines = (tmp_path / "scorecard.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| best constant prediction (chance) |"))
    assert "no correlation" not in row and "| 52.0 |" in row, row
    # an F1 column is not SQuAD's; a Pearson column alone is a regression's
    mrpc = _ours("mrpc", 1, {"accuracy": 70.0, "f1": 80.0}, chance={"accuracy": 68.0, "f1": 81.0}, n_eval=100)
    build_scorecard(
        [mrpc, _ours("stsb", 1, {"pearson": 20.0}, chance={"pearson": 0.0}, n_eval=100)], tmp_path
    )
    legend = next(x for x in (tmp_path / "scorecard.md").read_text().splitlines() if x.startswith("Dev-set"))
    assert "SQuAD" not in legend and "for a regression 0" in legend, legend


def test_a_scorecard_of_tasks_without_reference_figures_has_no_row_of_dashes(tmp_path):
    """User tasks have no BERT-base figure: the scorecard showed a 'reference: BERT-base' row of
    dashes only, and a footnote about the reference figures' † and budgets, for a row that says
    nothing. It now says in one line that these tasks have no reference figure."""
    results = [
        _ours("movies", 1, {"accuracy": 70.0}, glue=False),
        _ours("myner", 1, {"entity_f1": 20.0}, glue=False),
    ]
    build_scorecard(results, tmp_path)
    md = (tmp_path / "scorecard.md").read_text()
    assert "| reference: BERT-base" not in md and "† = the paper" not in md
    assert (
        "No task here has a BERT-base reference figure (Devlin et al. 2019 report the built-in tasks)." in md
    )
    build_scorecard([*results, _ours("sst2", 1, {"accuracy": 80.0})], tmp_path)
    md = (tmp_path / "scorecard.md").read_text()
    assert "| reference: BERT-base (Devlin et al. 2019) | — | — | 92.7 |" in md and "† = the paper" in md
