"""Seed noise: when a difference of seed-averaged scores counts as ahead or behind."""

from __future__ import annotations

import math

import pytest

from finetuning.scorecard import build_scorecard
from finetuning.seed_noise import difference_noise, t_95, verdict
from tests.test_chance import _unit


def test_welch_margin_by_hand():
    # std 2 and 1 over 3 seeds each: se = sqrt(4/3 + 1/3); Welch df = 2.94 -> 2 (rounded down), t = 4.303
    noise = difference_noise(2.0, 3, 1.0, 3)
    se = math.sqrt(5 / 3)
    assert noise.standard_error == pytest.approx(se)
    assert noise.margin == pytest.approx(4.303 * se)
    # equal stds, 3 seeds each: df = 4 exactly, t = 2.776
    assert difference_noise(1.0, 3, 1.0, 3).margin == pytest.approx(2.776 * math.sqrt(2 / 3))
    assert t_95(0.5) == 12.706 and t_95(1000) == 2.042  # clamped at both ends


def test_a_whole_number_of_degrees_of_freedom_is_not_rounded_down_past_itself(tmp_path):
    """Welch's df is a whole number when one side's seeds all scored the same (a model at the
    majority class on every seed: df = n - 1) or both sides have the same std and seeds (2n - 2).
    Computed in floats it came out a hair below (1.9999999999999996), was rounded down to 1, and the
    margin used t = 12.706 for 4.303: three times too wide, so a real lead read as level."""
    stuck, ours = [52.7] * 3, [57.04, 59.57, 60.29]  # random init at one class on every seed
    se = _std(ours) / math.sqrt(3)
    assert difference_noise(_std(ours), 3, 0.0, 3).margin == pytest.approx(4.303 * se)  # df = 2
    assert difference_noise(1.3, 3, 1.3, 3).margin == pytest.approx(2.776 * 1.3 * math.sqrt(2 / 3))  # df = 4
    card, _ = _card(tmp_path, {("ours", "rte"): ours, ("random", "rte"): stuck})
    assert card["headline"]["task_margins"]["rte"] == pytest.approx(4.303 * se)  # 4.2 (it read 12.5)
    assert card["headline"]["ahead_on"] == ["rte"]  # +6.3 beyond 4.2


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_welch_margin_with_unequal_seed_counts_by_hand():
    # std 2 over 2 seeds, std 1 over 5: se = sqrt(4/2 + 1/5); df = 2.2² / (2²/1 + 0.2²/4) = 1.2 -> 1
    noise = difference_noise(2.0, 2, 1.0, 5)
    se = math.sqrt(4 / 2 + 1 / 5)
    assert noise.standard_error == pytest.approx(se) and noise.margin == pytest.approx(12.706 * se)
    # std 2 over 3 seeds, std 1 over 5: se = sqrt(4/3 + 1/5); df = 2.61 -> 2
    noise = difference_noise(2.0, 3, 1.0, 5)
    se = math.sqrt(4 / 3 + 1 / 5)
    assert noise.standard_error == pytest.approx(se) and noise.margin == pytest.approx(4.303 * se)


def test_no_noise_estimate_without_two_seeds_on_each_side():
    assert difference_noise(1.0, 1, 1.0, 3) is None
    assert difference_noise(None, 3, 1.0, 3) is None
    assert difference_noise(math.nan, 3, 1.0, 3) is None  # a diverged unit's NaN metric
    assert (
        verdict(0.1, None) == "ahead" and verdict(-0.1, None) == "behind" and verdict(None, None) == "level"
    )


def test_verdict_needs_the_difference_beyond_the_margin():
    noise = difference_noise(2.0, 3, 2.0, 3)  # margin 2.776 * 1.633 = 4.53
    assert verdict(4.0, noise) == "level" and verdict(-4.0, noise) == "level"
    assert verdict(5.0, noise) == "ahead" and verdict(-5.0, noise) == "behind"


def _card(tmp_path, scores: dict[tuple[str, str], list[float]]):
    """Three seeds per (model, task); SST-2 and RTE accuracy, STS-B Pearson."""
    chance = {
        "sst2": ({"accuracy": 50.9}, "accuracy"),
        "stsb": ({"pearson": 0.0}, "pearson"),
        "rte": ({"accuracy": 47.3}, "accuracy"),
    }
    results = []
    for (model, task), values in scores.items():
        kind, label = ("random", "random:tiny") if model == "random" else ("pretrained", "ours")
        metrics_chance, metric = chance[task]
        for seed, v in enumerate(values, 1):
            results.append(_unit(label, kind, task, seed, {metric: v}, metrics_chance))
    card = build_scorecard(results, tmp_path)
    return card, (tmp_path / "scorecard.md").read_text()


def test_a_small_noisy_lead_is_level_and_a_large_one_is_ahead(tmp_path):
    card, md = _card(
        tmp_path,
        {
            ("ours", "sst2"): [74.0, 76.0, 72.0],  # +1.3 over random init, seed stds 2 and 1.5: level
            ("random", "sst2"): [71.0, 74.0, 73.0],
            ("ours", "stsb"): [48.0, 50.0, 49.0],  # +32: ahead
            ("random", "stsb"): [16.0, 18.0, 17.0],
        },
    )
    h = card["headline"]
    assert h["ahead_on"] == ["stsb"] and h["behind_on"] == [] and h["noise_tested"] is True
    assert h["task_deltas"]["sst2"] == pytest.approx(1.333, abs=1e-3)
    assert h["pretraining_helped"] is False  # ahead on 1 of 2: not more than half
    assert "ahead on 1 of 2 tasks (stsb) beyond seed noise, mean of 3 seed(s)" in md
    assert "level within seed noise on sst2 (+1.3)" in md
    # the delta row carries each difference's margin; the GLUE average has one from per-seed averages
    delta_row = next(line for line in md.splitlines() if line.startswith("| Δ"))
    sst2_margin = difference_noise(2.0, 3, math.sqrt(7 / 3), 3).margin
    assert f"+1.3 ±{sst2_margin:.1f}" in delta_row and "+32.0 ±" in delta_row
    per_seed = ([61.0, 63.0, 60.5], [43.5, 46.0, 45.0])
    stds = [math.sqrt(sum((v - sum(x) / 3) ** 2 for v in x) / 2) for x in per_seed]
    assert card["deltas"][0]["glue_average_margin"] == pytest.approx(
        difference_noise(stds[0], 3, stds[1], 3).margin
    )


def test_ahead_on_most_tasks_beyond_noise_is_pretraining_that_helped(tmp_path):
    card, md = _card(
        tmp_path,
        {
            ("ours", "sst2"): [80.0, 81.0, 79.0],
            ("random", "sst2"): [71.0, 72.0, 73.0],
            ("ours", "stsb"): [48.0, 50.0, 49.0],
            ("random", "stsb"): [16.0, 18.0, 17.0],
        },
    )
    assert card["headline"]["ahead_on"] == ["sst2", "stsb"] and card["headline"]["pretraining_helped"] is True
    assert "has not helped" not in md and "some tasks only" not in md


def test_one_seed_says_there_is_no_noise_estimate(tmp_path):
    card, md = _card(tmp_path, {("ours", "sst2"): [74.0], ("random", "sst2"): [73.0]})
    assert card["headline"]["ahead_on"] == ["sst2"] and card["headline"]["noise_tested"] is False
    assert "ahead on 1 of 1 tasks (sst2) by sign only (fewer than two seeds: no seed-noise estimate)" in md
    assert card["deltas"][0]["glue_average_margin"] is None


def test_behind_on_average_beyond_noise_is_said(tmp_path):
    card, md = _card(
        tmp_path,
        {
            ("ours", "sst2"): [70.0, 71.0, 70.5],
            ("random", "sst2"): [73.0, 74.0, 73.5],
            ("ours", "stsb"): [10.0, 11.0, 10.5],
            ("random", "stsb"): [13.0, 14.0, 13.5],
        },
    )
    assert card["headline"]["behind_on"] == ["sst2", "stsb"]
    assert "its GLUE-style average is behind by more than seed noise" in md
    assert "behind on 2 (sst2, stsb) beyond seed noise" in md


def test_a_scorecard_from_before_the_noise_test_reads_as_signs_only():
    from finetuning.scorecard import headline_text

    old = {"checkpoint": "k/model", "glue_average_delta": 1.5, "ahead_on": ["stsb"], "tasks": ["sst2", "stsb"],
           "seeds": 3, "at_chance": [], "random_at_chance": [], "pretraining_helped": False,
           "task_deltas": {"sst2": -1.0, "stsb": 4.0}}  # fmt: skip
    text = headline_text(old)
    assert "ahead on 1 of 2 tasks (stsb) by sign only, mean of 3" in text and "seed noise" not in text


def test_the_average_difference_is_over_the_tasks_both_models_have(tmp_path):
    """All of one model's STS-B units failed: the GLUE-style average difference is over SST-2 alone
    (level), not the pretrained model's SST-2 against random init's mean of SST-2 and a low STS-B
    (+20, which read as ahead beyond noise), and the headline names the task left out."""
    card, md = _card(
        tmp_path,
        {
            ("ours", "sst2"): [52.0, 53.0, 51.0],
            ("random", "sst2"): [52.0, 51.0, 53.0],
            ("random", "stsb"): [11.0, 12.0, 13.0],
        },
    )
    h = card["headline"]
    assert h["glue_average_delta"] == pytest.approx(0.0) and card["deltas"][0]["glue_average_tasks"] == [
        "sst2"
    ]
    assert h["pretraining_helped"] is False and h["glue_average_left_out"] == ["stsb"]
    assert "GLUE-style average +0.0 points over the tasks both have (not stsb)" in md


def test_ahead_on_most_tasks_with_an_average_within_noise_says_so(tmp_path):
    """Ahead beyond noise on 2 of 3 tasks, but the average lead is within its noise: the text names
    the average as what falls short, not 'some tasks only'."""
    scores = {
        ("ours", "sst2"): [80.0, 81.0, 79.0],
        ("random", "sst2"): [75.0, 76.0, 74.0],
        ("ours", "stsb"): [40.0, 41.0, 39.0],
        ("random", "stsb"): [35.0, 36.0, 34.0],
    }
    card, md = _card(tmp_path / "a", scores)
    assert card["headline"]["pretraining_helped"] is True  # the control: ahead on both, average too
    scores[("ours", "stsb")] = [31.0, 30.0, 29.0]  # now behind on STS-B: the average lead shrinks
    scores[("random", "stsb")] = [45.0, 30.0, 20.0]  # ... and gets noisy
    scores.update({("ours", "rte"): [70.0, 71.0, 69.0], ("random", "rte"): [60.0, 61.0, 59.0]})
    card, md = _card(tmp_path / "b", scores)
    h = card["headline"]
    assert sorted(h["ahead_on"]) == ["rte", "sst2"] and h["behind_on"] == []
    assert h["pretraining_helped"] is False and h["glue_average_delta"] <= h["glue_average_margin"]
    assert "**Pretraining has not clearly helped:**" in md and "but within seed noise (±" in md
    assert "some tasks only" not in md


def test_margins_use_each_models_own_seed_count(tmp_path):
    """Random init ran 5 seeds, the pretrained model 3: each side's variance of its mean is divided
    by its own seed count, in the task margins and in the GLUE-style average's."""
    ours, rnd = [80.0, 82.0, 78.0], [70.0, 71.0, 69.0, 72.0, 68.0]
    card, _ = _card(tmp_path, {("ours", "sst2"): ours, ("random", "sst2"): rnd})

    def std(x):
        return math.sqrt(sum((v - sum(x) / len(x)) ** 2 for v in x) / (len(x) - 1))

    expected = difference_noise(std(ours), 3, std(rnd), 5).margin
    assert expected != pytest.approx(difference_noise(std(ours), 3, std(rnd), 3).margin)
    assert card["headline"]["task_margins"]["sst2"] == pytest.approx(expected)
    assert card["deltas"][0]["margins"]["sst2/accuracy"] == pytest.approx(expected)
    assert card["deltas"][0]["glue_average_margin"] == pytest.approx(expected)


def test_an_average_lead_beyond_noise_with_no_task_ahead_is_not_called_no_better(tmp_path):
    """Each task a few points ahead, none beyond its own seed noise, the average ahead beyond its
    (smaller) noise: the page said "has not helped here: ours is no better than random init
    (GLUE-style average not above it, or ...)" under a headline of +3.5 ±1.2. It says now which
    condition is unmet, with the numbers, and does not deny the average lead."""
    card, md = _card(
        tmp_path,
        {
            ("ours", "sst2"): [78.0, 74.0, 76.0],
            ("random", "sst2"): [74.0, 72.0, 70.0],
            ("ours", "rte"): [58.0, 62.0, 60.0],
            ("random", "rte"): [54.0, 58.0, 59.0],
        },
    )
    h = card["headline"]
    assert h["ahead_on"] == [] and h["glue_average_delta"] > h["glue_average_margin"]
    assert "no better than" not in md and "GLUE-style average not above it" not in md
    assert (
        "**Pretraining has not clearly helped:** ours is ahead of random init (tiny) on no task beyond seed noise"
        in md
    )
    assert f"Its GLUE-style average is above, +3.5, beyond seed noise (±{h['glue_average_margin']:.1f})" in md
    # an average lead within noise and no task ahead: "no better", and the reason names both, in numbers
    card, md = _card(
        tmp_path / "b", {("ours", "sst2"): [78.0, 74.0, 76.0], ("random", "sst2"): [74.0, 72.0, 77.0]}
    )
    assert "**Pretraining has not helped here:** ours is no better than random init (tiny)" in md
    assert "(its GLUE-style average lead, +1.7, is within seed noise (±" in md
    assert "it is ahead beyond seed noise on 0 of 1 tasks, not more than half)" in md


def test_the_reason_pretraining_has_not_helped_names_each_unmet_condition_in_numbers():
    """Each condition of pretraining that helps (an average ahead beyond seed noise, more than half
    the tasks ahead) is said when unmet, with its figures; a lead equal to the noise is within it,
    and ahead on exactly half the tasks is not more than half."""
    from finetuning.scorecard import _not_helped_reason

    def reason(avg, margin, ahead, tested=True):
        h = {"glue_average_delta": avg, "glue_average_margin": margin, "ahead_on": ahead, "tasks": ["a", "b"]}
        return _not_helped_reason(h, True, tested)

    assert reason(None, None, ["a", "b"]) == "its GLUE-style average difference is undefined"
    assert reason(-0.5, None, ["a", "b"], tested=False) == "its GLUE-style average is not above it (-0.5)"
    assert reason(2.0, 2.0, ["a", "b"]) == "its GLUE-style average lead, +2.0, is within seed noise (±2.0)"
    assert reason(5.0, 2.0, ["a"]) == "it is ahead beyond seed noise on 1 of 2 tasks, not more than half"
    assert reason(-3.0, 2.0, [], tested=False) == (
        "its GLUE-style average is behind by more than seed noise; it is ahead on 0 of 2 tasks, not more than half"
    )
