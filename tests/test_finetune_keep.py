"""Kept fine-tuned models (`finetune.save_models`): Hugging Face directories that transformers
opens with the task's architecture and labels and that score what the unit's result.json says;
the default keeps nothing; the setting is run-only, so a finished unit without its model trains
again, and `best` keeps only the best lr's models."""

from __future__ import annotations

import json

import psutil
import pytest
import torch
from torch import nn

from common.atomic import read_marker
from finetuning import keep
from finetuning.config import FinetuneConfig
from finetuning.fanout import UnitPool, plan
from finetuning.tasks import get_task
from finetuning.trainer import predict
from finetuning.units import _task_class, run_finetune_unit
from preprocessing.wordpiece import load_tokenizer, pad_id
from tests.test_finetune import TINY, _cli, one_torch_thread  # noqa: F401 (an autouse fixture)

AUTO_CLASSES = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "span_extraction": "AutoModelForQuestionAnswering",
}


class _AsOurs(nn.Module):
    """A transformers task model answering as ours do: (loss, *outputs)."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf, self.config = hf, hf.config

    def forward(self, **inputs: torch.Tensor) -> tuple:
        return (None, *self.hf(**inputs, return_dict=False))


def _kept_unit(cfg: FinetuneConfig, root, minilm_dir):
    [job] = keep.first_pass(cfg, plan(cfg, ["random:tiny"], root, tokenizer_dir=minilm_dir))
    return job, run_finetune_unit(cfg, job)


@pytest.mark.parametrize("task_name", ["sst2", "stsb", "conll2003", "squad"])
def test_a_kept_model_opens_in_transformers_with_its_labels_and_scores_the_units_result(
    tmp_path, minilm_dir, data_dir, task_name
):
    import transformers

    cfg = FinetuneConfig(tasks=[task_name], save_models="all", **TINY)
    job, result = _kept_unit(cfg, tmp_path, minilm_dir)
    model_dir = keep.kept_model(job.out_dir)
    assert model_dir == job.out_dir / "model"
    spec = get_task(task_name)
    auto = getattr(transformers, AUTO_CLASSES[spec.kind])
    hf, info = auto.from_pretrained(model_dir, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert hf.config.architectures == [keep.ARCHITECTURES[spec.kind]]
    if spec.labels:
        assert hf.config.id2label == dict(enumerate(spec.labels))
        assert hf.config.label2id == {name: i for i, name in enumerate(spec.labels)}
    if spec.kind == "regression":
        assert (hf.config.num_labels, hf.config.problem_type) == (1, "regression")
    card = (model_dir / "README.md").read_text()
    assert f"fine-tuned on {task_name}" in card and "lr 5e-05, seed 42" in card and "random:tiny" in card

    # the transformers model scores the dev set exactly as the unit did
    tok, _ = load_tokenizer(model_dir)  # the tokenizer files kept with it
    task = _task_class(spec)(
        spec, tok, cfg.max_seq_length, cfg.max_train_examples, cfg.max_eval_examples, None
    )
    hf_outputs = predict(_AsOurs(hf), task.eval_features, task.eval_outputs, torch.device("cpu"), pad_id(tok))
    # (transformers' float sums differ in the last bits: a regression's correlation by ~1e-4 points)
    assert task.metrics(hf_outputs) == pytest.approx(result["metrics"], abs=1e-2)

    rows = [json.loads(line) for line in (job.out_dir / keep.PREDICTIONS_FILE).read_text().splitlines()]
    assert len(rows) == result["n_eval"]
    if spec.kind in ("classification", "regression"):  # `id`: the 0-based position, `line`: the file's
        assert [r["id"] for r in rows] == list(range(len(rows)))
        dev_file = spec.path("dev", None).read_text(encoding="utf-8").splitlines()
        assert [r["line"] for r in rows] == [e.line for e in task.dev_examples] and rows[0]["line"] == 2
        assert task.dev_examples[0].text_a in dev_file[rows[0]["line"] - 1].split("\t")
    if spec.kind == "classification":  # what a pipeline says, by label name
        assert {r["gold"] for r in rows} <= set(spec.labels)
        accuracy = 100 * sum(r["gold"] == r["prediction"] for r in rows) / len(rows)
        assert accuracy == pytest.approx(result["metrics"]["accuracy"])
        classify = transformers.pipeline("text-classification", model=str(model_dir), device="cpu")
        sentences = [e.text_a for e in task.dev_examples[:8]]
        assert [p["label"] for p in classify(sentences)] == [r["prediction"] for r in rows[:8]]


def test_the_default_keeps_nothing_and_the_setting_is_out_of_the_unit_key(tmp_path, minilm_dir):
    assert FinetuneConfig().save_models == "none"
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    [job] = plan(cfg, ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir)
    [kept] = plan(
        cfg.model_copy(update={"save_models": "all"}), ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir
    )
    assert kept.key == job.key  # only files are added: the same unit
    run_finetune_unit(cfg, job)
    names = sorted(p.name for p in job.out_dir.iterdir())
    assert names == [".lock", "_COMPLETE.json", "metrics.jsonl", "result.json", "wandb_files"]
    assert keep.kept_model(job.out_dir) is None


def test_a_finished_unit_without_its_model_trains_again_to_keep_it(tmp_path, minilm_dir):
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    [job] = plan(cfg, ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir)
    before = run_finetune_unit(cfg, job)
    mtime = (job.out_dir / "result.json").stat().st_mtime_ns

    wanting = cfg.model_copy(update={"save_models": "all"})
    [again] = keep.first_pass(wanting, plan(wanting, ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir))
    assert again.out_dir == job.out_dir and not keep.unit_complete(again)
    # said before it runs (the command said '1 unit(s), 0 already complete' and no more)
    assert keep.retrain_note([again], "all").startswith("1 finished unit(s) have no kept model")
    after = run_finetune_unit(wanting, again)
    assert keep.retrain_note([again], "all") is None
    assert (job.out_dir / "result.json").stat().st_mtime_ns != mtime  # trained again, not pretended
    assert after["metrics"] == before["metrics"]  # one thread on CPU: the same training
    assert keep.kept_model(job.out_dir) is not None and read_marker(job.out_dir)["key"] == job.key
    mtime = (job.out_dir / "result.json").stat().st_mtime_ns
    assert run_finetune_unit(wanting, again) == after and keep.unit_complete(again)
    assert (job.out_dir / "result.json").stat().st_mtime_ns == mtime  # now reused


def test_units_all_finished_are_read_without_starting_a_worker(tmp_path, minilm_dir):
    """A `bertflow finetune` or flow run whose units are done (cached, reused) started its worker
    processes anyway, each importing torch (seconds of CPU) to read a result.json."""
    cfg = FinetuneConfig(tasks=["sst2"], **TINY)
    [job] = plan(cfg, ["random:tiny"], tmp_path, tokenizer_dir=minilm_dir)
    before = run_finetune_unit(cfg, job)
    children = set(psutil.Process().children(recursive=True))
    with UnitPool(cfg, 1) as pool:
        assert pool.run(job) == before
        assert set(psutil.Process().children(recursive=True)) == children  # no worker started


def test_best_keeps_the_best_lrs_model_of_each_seed_and_removes_the_others(tmp_path, minilm_dir):
    out = tmp_path / "out"
    common = ["--checkpoint", "random:tiny", "--tokenizer", str(minilm_dir), "--tasks", "sst2"]
    common += ["--max-train-examples", "64", "--max-eval-examples", "64", "--max-seq-length", "64"]
    common += ["--epochs", "1", "--batch-size", "16", "--workers", "1", "--baselines", "none"]
    common += ["--output", str(out), "--lr", "5e-5,1e-3"]
    proc = _cli(*common, "--set", "finetune.save_models=best")
    assert proc.returncode == 0, proc.stderr
    results = {
        d: json.loads((d / "result.json").read_text()) for d in (out / "units").iterdir() if d.is_dir()
    }
    best = json.loads((out / "scorecard.json").read_text())["rows"][0]["tasks"]["sst2"]["lr"]
    kept = {r["lr"] for d, r in results.items() if keep.kept_model(d) is not None}
    assert kept == {best} and len(results) == 2
    assert all((d / keep.PREDICTIONS_FILE).is_file() for d in results)  # predictions stay
    assert "removed the models of 1 unit(s)" in proc.stdout
    best_model = next(d for d, r in results.items() if r["lr"] == best) / "model"
    # each unit's line said 'model kept: PATH' of both lrs, one of them removed after: a line says
    # the model is saved and kept only if its lr wins, and the command ends with the models kept
    saved = [line for line in proc.stdout.splitlines() if line.startswith("  done ")]
    assert len(saved) == 2 and all("model saved, kept if its lr is the best" in line for line in saved), saved
    assert "model kept" not in "\n".join(saved)
    assert proc.stdout.rstrip().endswith(
        f"bertflow finetune: 1 fine-tuned model(s) kept (finetune.save_models: best):\n  {best_model}"
    ), proc.stdout[-2000:]

    # `--unit` of the other lr: the best is the plan's, not that one unit's (it was: the unit, alone
    # in its run, was "the best lr", trained again to keep its model, which the scorecard did not pick)
    [other] = [d for d, r in results.items() if r["lr"] != best]
    mtime = (other / "result.json").stat().st_mtime_ns
    proc = _cli(*common, "--set", "finetune.save_models=best", "--unit", f"sst2-lr{results[other]['lr']}-s42")
    assert proc.returncode == 0, proc.stderr
    assert keep.kept_model(other) is None and (other / "result.json").stat().st_mtime_ns == mtime
    assert "training them again" not in proc.stdout
