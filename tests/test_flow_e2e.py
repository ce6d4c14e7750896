"""The whole flow on a tiny config with every real component (Beam, DeepSpeed, fine-tuning, W&B
offline, Prefect): a first run computes everything, a rerun computes nothing, and a changed
fine-tuning setting reruns exactly the fine-tuning units, the scorecard and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.atomic import MARKER_NAME
from tests.flow_support import stop_ephemeral_prefect, tiny_config

pytestmark = pytest.mark.slow

WANDB_VARS = (
    "WANDB_RUN_GROUP",
    "WANDB_PROJECT",
    "WANDB_MODE",
    "BERTFLOW_WANDB_GROUP",
    "BERTFLOW_WANDB_PROJECT",
)


@pytest.fixture(autouse=True, scope="module")
def _stop_prefect():
    yield
    stop_ephemeral_prefect()


def _status(summary: dict) -> dict[str, str]:
    return {r["stage"]: r["status"] for r in summary["stages"]}


def _marker_times(summary: dict) -> dict[str, int]:
    return {
        r["stage"]: (Path(r["out_dir"]) / MARKER_NAME).stat().st_mtime_ns
        for r in summary["stages"]
        if r["stage"] != "finetune-units"
    }


def test_tiny_flow_then_cached_rerun_then_partial_rerun(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in WANDB_VARS:  # the flow sets these for its stages; restore them afterwards
        monkeypatch.setenv(var, "")
    monkeypatch.delenv("WANDB_MODE")
    from pipelines.flow import bert_pipeline

    config = str(tiny_config(tmp_path, data_dir))

    first = bert_pipeline(config=config)
    status = _status(first)
    assert status == {
        "verify": "ran",
        "tokenizer": "ran",
        "preprocess": "ran",
        "pretrain": "ran",
        "finetune-units": "4 ran, 0 cached",
        "finetune": "ran",
        "report": "ran",
    }, status
    run = tmp_path / "run"
    # every stage directory is complete and keyed
    for r in first["stages"]:
        if r["stage"] != "finetune-units":
            assert (Path(r["out_dir"]) / MARKER_NAME).is_file(), r
            assert Path(r["out_dir"]).parent.parent == run
    pretrain_dir = Path(next(r["out_dir"] for r in first["stages"] if r["stage"] == "pretrain"))
    model_dir = pretrain_dir / "model"
    # the pretrained model opens in transformers with no missing keys
    from transformers import BertForPreTraining

    model, info = BertForPreTraining.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"], info
    # the DeepSpeed log went through the Prefect task logger into the pretrain curves
    metrics = [json.loads(line) for line in (pretrain_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] or 0 for m in metrics) == 8
    # scorecard: both checkpoints on both tasks
    finetune_dir = Path(next(r["out_dir"] for r in first["stages"] if r["stage"] == "finetune"))
    card = json.loads((finetune_dir / "scorecard.json").read_text())
    card_text = json.dumps(card)
    assert "rte" in card_text and "stsb" in card_text and "random" in card_text
    # the report: markdown + HTML + curves, timings and W&B links, in the W&B group of this flow run
    report_md = Path(first["report_md"])
    md = report_md.read_text()
    assert Path(first["report_html"]).is_file() and (report_md.parent / "loss.png").is_file()
    assert f"| pretrain | `{pretrain_dir.name}` | ran |" in md
    assert "rte" in md and "wandb sync" in md and "offline-run-" in md
    assert first["wandb_group"].startswith("tiny-test-")

    times = _marker_times(first)
    card_bytes = (finetune_dir / "scorecard.json").read_bytes()

    # --- rerun: nothing recomputes; Prefect reports the stages as Cached
    second = bert_pipeline(config=config)
    assert _status(second) == {
        "verify": "cached",
        "tokenizer": "cached",
        "preprocess": "cached",
        "pretrain": "cached",
        "finetune-units": "0 ran, 4 cached",
        "finetune": "cached",
        "report": "cached",
    }
    assert _marker_times(second) == times
    assert (finetune_dir / "scorecard.json").read_bytes() == card_bytes

    # --- change a fine-tuning setting: only fine-tuning and the report rerun
    third = bert_pipeline(config=config, overrides=["finetune.epochs=2"])
    status = _status(third)
    assert status == {
        "verify": "cached",
        "tokenizer": "cached",
        "preprocess": "cached",
        "pretrain": "cached",
        "finetune-units": "4 ran, 0 cached",
        "finetune": "ran",
        "report": "ran",
    }, status
    new_times = _marker_times(third)
    for stage in ("verify", "tokenizer", "preprocess", "pretrain"):
        assert new_times[stage] == times[stage], stage
    third_finetune = Path(next(r["out_dir"] for r in third["stages"] if r["stage"] == "finetune"))
    assert third_finetune != finetune_dir and (finetune_dir / MARKER_NAME).is_file()  # old one kept
    assert Path(third["report_md"]).parent != report_md.parent
