"""Meaningless metrics are not reported as numbers (issue 14 item 4): a dev set with constant
regression labels has no Pearson/Spearman, one without both classes no MCC (and without a positive
example no F1) — each is None, shown as "undefined" — while a model that predicts a constant
still scores 0; a unit whose training loss is NaN is marked diverged in the scorecard."""

from __future__ import annotations

import json
import math

import torch

from finetuning.config import FinetuneConfig
from finetuning.fanout import plan
from finetuning.metrics import binary_f1, classification_metrics, matthews_corrcoef, pearson, spearman
from finetuning.scorecard import best_per_task, build_scorecard
from finetuning.units import run_finetune_unit, unit_score
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.hf_io import write_hf_dir


def test_metrics_the_dev_set_cannot_define_are_none():
    assert pearson([0.1, 0.5, 0.9], [2.0, 2.0, 2.0]) is None
    assert spearman([0.1, 0.5, 0.9], [2.0, 2.0, 2.0]) is None
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) is None
    assert binary_f1([0, 1, 0], [0, 0, 0]) is None
    assert classification_metrics(["accuracy", "mcc"], [1, 1], [1, 1]) == {"accuracy": 100.0, "mcc": None}
    # a constant predictor on a varied dev set is defined: it learned nothing
    assert pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) == 0.0
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0
    assert unit_score({"accuracy": 90.0, "mcc": None}) is None


def _result(label, kind, task, metrics, diverged=False):
    return {
        "unit": f"{task}-lr5e-05-s1", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": unit_score(metrics), "lr": 5e-5, "seed": 1, "checkpoint": "/x/" + label,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": True, "n_train": 10, "n_eval": 5,
        "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 1.0, "notes": {},
        "final_train_loss": math.nan if diverged else 0.5, "diverged": diverged,
    }  # fmt: skip


def test_scorecard_shows_undefined_and_diverged(tmp_path):
    results = [
        _result("ours", "pretrained", "stsb", {"pearson": None, "spearman": None}),
        _result("ours", "pretrained", "sst2", {"accuracy": 50.0}, diverged=True),
        _result("random:tiny", "random", "stsb", {"pearson": 10.0, "spearman": 12.0}),
        _result("random:tiny", "random", "sst2", {"accuracy": 50.0}),
    ]
    card = build_scorecard(results, tmp_path)
    ours = card["rows"][0]
    assert ours["tasks"]["stsb"]["metrics"] == {"pearson": None, "spearman": None}
    assert ours["glue_average"] is None and card["deltas"][0]["values"]["stsb/pearson"] is None
    assert ours["tasks"]["sst2"]["diverged"] is True
    md = (tmp_path / "scorecard.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| ours |"))
    assert row.count("undefined") == 2 and "50.0 (diverged)" in row and "| 0.0" not in row
    assert "No score for stsb:** the dev set cannot define the metric on stsb" in md  # sst2 diverged, scored
    assert json.loads((tmp_path / "scorecard.json").read_text()) == card


def test_the_finetune_command_prints_undefined_diverged_and_failed_units_as_such():
    from types import SimpleNamespace

    from pipelines.stage_finetune import result_line

    job = SimpleNamespace(name="stsb-lr5e-05-s1__ours", keep_model=False)
    undefined = _result("ours", "pretrained", "stsb", {"pearson": None, "spearman": 12.34})
    assert (
        result_line(job, undefined)
        == "done   stsb-lr5e-05-s1__ours: pearson undefined, spearman 12.3 (1.0 train ex/s)"
    )
    diverged = _result("ours", "pretrained", "sst2", {"accuracy": 50.0}, diverged=True)
    assert "accuracy 50.0 (DIVERGED: the training loss is NaN)" in result_line(job, diverged)
    assert "DIVERGED" not in result_line(job, _result("ours", "pretrained", "sst2", {"accuracy": 50.0}))
    assert result_line(job, {"error": "no such file"}) == "FAILED stsb-lr5e-05-s1__ours: no such file"


def test_a_diverged_seed_with_nan_metrics_leaves_the_scorecard_buildable(tmp_path):
    """A diverged regression unit predicts NaN, so its Pearson is NaN and its side's seed std too;
    the seed-noise margin is then unknown (it once raised ValueError and lost the whole scorecard)."""
    results = []
    for seed, (ours, base) in enumerate([(math.nan, 21.0), (30.0, 22.0), (32.0, 23.0)], start=1):
        for label, kind, p in (("ours", "pretrained", ours), ("random:tiny", "random", base)):
            r = _result(label, kind, "stsb", {"pearson": p, "spearman": p}, diverged=math.isnan(p))
            results.append({**r, "seed": seed, "unit": f"stsb-lr5e-05-s{seed}"})
    card = build_scorecard(results, tmp_path)
    assert card["rows"][0]["tasks"]["stsb"]["diverged"] is True
    assert card["deltas"][0]["margins"]["stsb/pearson"] is None


def test_a_diverged_seed_is_said_in_the_headline_not_printed_as_nan(tmp_path):
    """The NaN of a diverged STS-B seed once reached the page as 'GLUE-style average +nan points'
    with 'fewer than two seeds' as the reason for no noise test. Now its task has no score, the
    headline says which task diverged and what to do, and the other tasks are still tested; and in
    an lr sweep the lr whose seed diverged is never the one chosen."""
    results = []
    for seed in (1, 2, 3):
        for label, kind, stsb, sst2 in (("ours", "pretrained", math.nan if seed == 1 else 30.0 + seed, 80.0),
                                        ("random:tiny", "random", 20.0 + seed, 70.0)):  # fmt: skip
            for task, metrics in (
                ("stsb", {"pearson": stsb, "spearman": stsb}),
                ("sst2", {"accuracy": sst2 + seed}),
            ):
                r = _result(label, kind, task, metrics, diverged=math.isnan(metrics[next(iter(metrics))]))
                results.append({**r, "seed": seed, "unit": f"{task}-lr5e-05-s{seed}"})
    card = build_scorecard(results, tmp_path)
    h = card["headline"]
    assert h["glue_average_delta"] is None and h["undefined"] == ["stsb"] and h["diverged"] == ["stsb"]
    assert h["noise_tested"] is True and h["ahead_on"] == ["sst2"]
    md = (tmp_path / "scorecard.md").read_text()
    assert (
        not any(x in md for x in ("+nan", "| nan", "(nan)"))
        and "No score for stsb" in md
        and "diverged (NaN loss) on stsb" in md
    )
    assert "fewer than two seeds" not in md

    sweep = []
    for lr, scores in ((5e-5, (math.nan, 90.0, 90.0)), (1e-4, (30.0, 31.0, 32.0))):
        for seed, p in enumerate(scores, start=1):
            r = _result("ours", "pretrained", "stsb", {"pearson": p, "spearman": p}, diverged=math.isnan(p))
            sweep.append({**r, "lr": lr, "seed": seed})
    assert best_per_task(sweep)["stsb"]["lr"] == 1e-4  # NaN compared as neither larger nor smaller


def test_notes_of_units_reach_the_scorecard(tmp_path):
    """A unit's notes (the SQuAD split, a pooler the checkpoint lacked) are listed under Notes."""
    results = [
        {**_result("ours", "pretrained", "sst2", {"accuracy": 80.0}), "notes": {"pooler": "not in the checkpoint: new"}},
        {**_result("ours", "pretrained", "squad", {"exact_match": 10.0, "f1": 20.0}), "glue": False,
         "notes": {"squad_split": "first 38 articles train"}},
        _result("random:tiny", "random", "sst2", {"accuracy": 70.0}),
    ]  # fmt: skip
    card = build_scorecard(results, tmp_path)
    md = (tmp_path / "scorecard.md").read_text()
    assert "- SQuAD: first 38 articles train" in md
    assert any(n.endswith(": pooler not in the checkpoint: new") for n in card["notes"])


def test_a_unit_whose_loss_overflows_is_marked_diverged(tmp_path, minilm_dir):
    """A real unit: finite weights so large that the forward pass overflows (as after an fp16
    blow-up) give a NaN training loss; the unit says diverged and the scorecard shows it."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.mul_(1e38)
    write_hf_dir(model, tmp_path / "huge", minilm_dir)
    cfg = FinetuneConfig(
        tasks=["sst2"],
        max_train_examples=32,
        max_eval_examples=32,
        epochs=1.0,
        max_seq_length=32,
        batch_size=16,
    )
    [job] = plan(cfg, [str(tmp_path / "huge")], tmp_path / "ft")
    result = run_finetune_unit(cfg, job)
    assert result["diverged"] is True and math.isnan(result["final_train_loss"])
    build_scorecard([result], tmp_path)
    assert "(diverged)" in (tmp_path / "scorecard.md").read_text()


def test_a_metric_a_one_class_dev_set_leaves_undefined_keeps_the_chance_mark(tmp_path):
    """A one-class dev set leaves MCC undefined, so the task's dev score (the mean of its metrics) is
    too; its accuracy is that of the one class, which the constant answer reaches. The row showed
    '100.0' unmarked (the chance mark was judged on the undefined score only), though the data's
    warning says accuracy measures that one class only: it is judged on the metrics the dev set
    defines, as the chance row's constant answer is chosen."""
    one_class = {"accuracy": 100.0, "mcc": None}
    results = [
        {
            **_result(label, kind, "cola", one_class),
            "chance_metrics": one_class,
            "chance_prediction": "acceptable",
        }
        for label, kind in (("ours", "pretrained"), ("random:tiny", "random"))
    ]
    card = build_scorecard(results, tmp_path)
    assert card["rows"][0]["tasks"]["cola"]["at_chance"] is True
    assert card["headline"]["at_chance"] == ["cola"], card["headline"]
    md = (tmp_path / "scorecard.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| ours |"))
    assert "| 100.0 (chance) | undefined |" in row, row


def test_the_chance_mark_on_defined_metrics_reads_every_seed_and_spares_a_diverged_one(tmp_path):
    """Judged on the metrics the dev set defines: the mean over all the best lr's seeds (not the first
    seed's), None where a seed left a defined metric undefined (a diverged run), and None for a task
    whose results record no chance level."""

    def seeds(label, kind, task, accuracies, chance):
        return [
            {**_result(label, kind, task, {"accuracy": a, "mcc": None}), "seed": i, "unit": f"{task}-s{i}",
             **({"chance_metrics": chance} if chance else {})}
            for i, a in enumerate(accuracies, start=1)
        ]  # fmt: skip

    chance = {"accuracy": 50.0, "mcc": None}
    results = [
        *seeds("ours", "pretrained", "cola", [50.0, 100.0], chance),  # the mean, 75, is above 50
        *seeds("ours", "pretrained", "rte", [None, 100.0], chance),
        *seeds("ours", "pretrained", "sst2", [60.0], None),
    ]
    two = {"accuracy": 50.0, "f1": 50.0, "mcc": None}  # judged on their mean, 50: at chance
    mrpc = {
        **_result("ours", "pretrained", "mrpc", {"accuracy": 90.0, "f1": 10.0, "mcc": None}),
        "chance_metrics": two,
    }
    results.append(mrpc)
    for r in results:
        r["n_eval"] = 10_000  # noise small: 75 is above 50, 50 is not
    tasks = build_scorecard(results, tmp_path)["rows"][0]["tasks"]
    assert tasks["mrpc"]["at_chance"] is True
    assert tasks["cola"]["at_chance"] is False
    assert tasks["rte"]["at_chance"] is None
    assert tasks["sst2"]["at_chance"] is None
