"""The report builder: curves land on the right panels, PNGs are real images, the HTML carries
the same tables as the markdown, W&B run folders are linked."""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

import pytest

from common.atomic import write_marker
from common.tracking import Tracker, WandbTarget
from pipelines.config import load_config
from pipelines.report_builder import build_report
from pipelines.report_plots import PANELS, series
from pipelines.flow_records import FLOW_RECORDS
from pipelines.stage_keys import stage_dirs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(n: int = 30) -> list[dict]:
    rows = []
    for step in range(10, 10 * n + 1, 10):
        rows.append(
            {
                "step": step,
                "train/loss": 10.0 * math.exp(-step / 100) + 1,
                "train/mlm_loss": 9.0 * math.exp(-step / 100) + 0.5,
                "train/mlm_accuracy": 1 - math.exp(-step / 150),
                "train/nsp_accuracy": 0.5 + 0.4 * (1 - math.exp(-step / 80)),
                "train/lr": 5e-4 * min(1.0, step / 30),
                "train/samples_per_s": 200.0 + step % 7,
                "train/tokens_per_s": 25000.0 + step % 11,
                "train/loss_scale": 1.0,
            }
        )
        if step % 100 == 0:
            rows.append(
                {"step": step, "eval/mlm_accuracy": 1 - math.exp(-step / 160), "eval/loss": float("nan")}
            )
    return rows


def test_series_panels_pick_the_right_metrics() -> None:
    rows = _rows()
    by_panel = {stem: set(series(rows, match)) for stem, _, _, match in PANELS}
    assert by_panel["loss"] == {"train/loss", "train/mlm_loss"}  # eval/loss is all NaN: no series
    assert by_panel["accuracy"] == {"train/mlm_accuracy", "train/nsp_accuracy", "eval/mlm_accuracy"}
    assert by_panel["lr"] == {"train/lr"}
    assert by_panel["throughput"] == {"train/samples_per_s", "train/tokens_per_s"}
    xs, ys = series(rows, lambda k: k == "eval/mlm_accuracy")["eval/mlm_accuracy"]
    assert xs == [100.0, 200.0, 300.0] and ys[0] < ys[-1]


def _logged_rows(steps: int = 300) -> list[dict]:
    """Rows named as training/train.py logs them (training every 10 steps, held-out every 100)."""
    rows = []
    for step in range(10, steps + 1, 10):
        rows.append(
            {"step": step, "loss": 10.0 * math.exp(-step / 100) + 1, "mlm_loss": 9.0 * math.exp(-step / 100),
             "nsp_loss": 0.69, "mlm_acc": 0.3 * (1 - math.exp(-step / 150)), "nsp_acc": 0.6, "lr": 5e-4,
             "tokens_per_s": 11139.2, "samples_per_s": 114.4, "data_wait_fraction": 0.01, "memory_mb": 2010.0,
             "consumed_samples": step * 64}
        )  # fmt: skip
        if step % 100 == 0:
            rows.append({"step": step, "val_mlm_acc": 0.25, "val_mlm_loss": 5.0, "val_nsp_acc": 0.63})
    return rows


def _unit_result(label: str, checkpoint: str, kind: str, task: str, metrics: dict) -> dict:
    return {
        "unit": f"{task}-lr0.0001-s42", "task": task, "metric_names": list(metrics), "metrics": metrics,
        "score": sum(metrics.values()) / len(metrics), "lr": 1e-4, "seed": 42, "checkpoint": checkpoint,
        "checkpoint_label": label, "checkpoint_kind": kind, "glue": True, "n_train": 100, "n_eval": 408,
        "epochs": 1.0, "max_seq_length": 64, "train_examples_per_s": 9.0, "notes": {},
        "chance_metrics": {m: 50.0 for m in metrics},
    }  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, minilm_dir: Path, data_dir: Path) -> tuple:
    """A run directory as the flow leaves it: shards and their stats, a pretraining output with its
    metrics and model config, a scorecard, W&B runs, and the flow-run record; then its report."""
    from finetuning.scorecard import build_scorecard
    from tests.shard_fixtures import make_shards, make_tokenizer_dir

    tmp = tmp_path_factory.mktemp("report")
    cfg = load_config(None, [f"run_dir={tmp / 'runs'}", "wandb.mode=offline", "finetune.tasks=[]"])
    dirs = stage_dirs(cfg)
    tok = make_tokenizer_dir(minilm_dir, dirs["tokenizer"])
    make_shards(dirs["preprocess"], tok, data_dir, num_docs=200, max_seq_length=64)
    (dirs["preprocess"] / "stats.json").write_text(json.dumps({
        "examples": 180, "documents_used": {"train": 170, "validation": 30}, "is_next_ratio": 0.496,
        "masked_replacement_split": {"mask_token": 0.8, "random_token": 0.1, "unchanged": 0.1},
        "skipped": {"files_empty": 1}, "input_bytes": 3 * 2**20,
    }))  # fmt: skip
    pre = dirs["pretrain"]
    tracker = Tracker(pre, WandbTarget(project="bertflow-test"), name="pretrain")
    for row in _logged_rows():
        step = row.pop("step")
        tracker.log(row, step=step)
    tracker.finish()
    (pre / "model").mkdir()
    (pre / "model" / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512,
         "vocab_size": 30522, "model_type": "bert"}
    ))  # fmt: skip
    (pre / "run_spec.json").write_text(json.dumps({
        "shards_dir": str(dirs["preprocess"]), "tokenizer_dir": str(tok), "world_size": 1,
        "pretrain": {"micro_batch_size": 8, "eval_batches": 2, "lr": 5e-4, "warmup_steps": 30},
        "ds_config": {"train_batch_size": 64, "zero_optimization": {"stage": 2}},
    }))  # fmt: skip
    write_marker(pre, {"max_steps": 300})
    results = [
        _unit_result("abc/model", str(pre / "model"), "pretrained", "mrpc", {"accuracy": 70.0, "f1": 80.0}),
        _unit_result("random:tiny", "random:tiny", "random", "mrpc", {"accuracy": 60.0, "f1": 70.0}),
    ]
    build_scorecard(results, dirs["finetune"])
    record = {
        "flow_run": "test-run",
        "wandb_group": "default-test-run",
        "started_utc": "2026-01-01 00:00:00",
        "seconds": 500.0,
        "stages": [
            {"stage": "pretrain", "key": pre.name, "out_dir": str(pre),
             "status": "ran", "seconds": 350.5, "compute_seconds": 350.0},
            {"stage": "finetune", "key": dirs["finetune"].name, "out_dir": str(dirs["finetune"]),
             "status": "cached", "seconds": 0.2, "compute_seconds": 0.0},
        ],
    }  # fmt: skip
    record_path = tmp / "runs" / FLOW_RECORDS / "r.json"
    record_path.parent.mkdir()
    record_path.write_text(json.dumps(record))
    return cfg, dirs, build_report(cfg, dirs["report"], record_path=record_path), tmp


def test_report_leads_with_the_result_then_the_evidence(run_dir) -> None:
    _, dirs, paths, _ = run_dir
    md = paths["report_md"].read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings == ["## Result", "## Fine-tuning scorecard", "## Pretraining", "## Data",
                        "## How the run went", "## Weights & Biases runs"]  # fmt: skip
    result = md.split("## Result")[1].split("## Fine-tuning")[0]
    assert "**pretrained (tiny, 300 steps) vs random init (tiny):** GLUE-style average +10.0 points" in result
    assert "held-out masked-LM accuracy 25.0% (always the most frequent token: " in result
    assert "(unigram entropy: " in result and "pretrain/" in result  # the model directory
    # the scorecard, once, with readable names and what "dev score" means for MRPC
    assert md.count("Fine-tuning scorecard") == 1
    assert "| pretrained (tiny, 300 steps) | 70.0 | 80.0 | 75.0 |" in md
    assert "lrs tried (dev score)" in md and "mrpc = (acc + F1) / 2" in md
    # pretraining: held-out figures next to the baselines; metrics with meanings and units
    assert "| masked-LM accuracy | 25.0% |" in md and "(always the most frequent token) |" in md
    assert "| throughput, all ranks, padding excluded | 11,139 | tokens/s | 300 | `tokens_per_s` |" in md
    # data: nested statistics are shown, with their keys
    assert "| documents held out (validation split) | 30 | `documents_used.validation` |" in md
    assert "| masked positions shown as [MASK] | 80.0% |" in md and "| skipped: files empty | 1 |" in md
    # stages: every row, the report's own, and the total
    assert "| pretrain | ran | 5 min 50 s | 5 min 50 s |" in md and "| finetune | cached |" in md
    assert (
        "| report | ran (this page) |" in md
        and "| **total** | 1 of 2 stages cached or reused | **8 min 20 s**" in md
    )
    # curves: four real, different PNGs, linked relative to the report
    pngs = [paths[s] for s in ("loss", "accuracy", "lr", "throughput")]
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, png
    assert len({p.read_bytes() for p in pngs}) == 4
    assert "![loss curve](loss.png)" in md
    # W&B: the pretrain run folder is linked and the sync command is shown
    assert "wandb_files/wandb/offline-run-" in md and "wandb sync" in md
    assert list((dirs["report"] / "wandb_files" / "wandb").glob("offline-run-*"))  # the report's own run
    # HTML: real tables and images, not markdown source
    html = paths["report_html"].read_text()
    assert html.count("<table>") >= 5 and '<img src="loss.png"' in html and "| mrpc |" not in html
    assert re.search(r"<td[^>]*>70.0</td>", html)


def test_embedded_report_is_self_contained(run_dir) -> None:
    """The Prefect artifact's text: shown at a UI address, so no relative link, images inline."""
    _, dirs, paths, _ = run_dir
    text = paths["report_embedded"].read_text()
    targets = re.findall(r"\]\(([^)]*)\)", text)
    assert targets and all(t.startswith("data:image/png;base64,") for t in targets), targets[:3]
    assert len(targets) == 4
    for target in targets:
        assert base64.b64decode(target.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert f"`{dirs['pretrain'] / 'model'}`" in text  # where things are: absolute paths, as text


def test_report_in_a_real_browser(run_dir) -> None:
    """Headless Chromium opens report.html: every image loads, the scorecard table is there, and
    the result comes before the evidence on the page."""
    from tests.browser import Browser, require_chromium

    require_chromium()
    _, _, paths, tmp = run_dir
    browser = Browser(tmp / "chromium-profile")
    try:
        browser.open(paths["report_html"].as_uri(), "Array.from(document.images).every(i => i.complete)")
        images = browser.images()
        assert len(images) == 4 and all(i["loaded"] and i["width"] > 300 for i in images), images
        headers = browser.evaluate(
            "Array.from(document.querySelectorAll('table')).map(t => t.rows[0].innerText)"
        )
        assert any("GLUE avg" in h and "mrpc acc" in h for h in headers), headers
        order = browser.evaluate(
            "['blockquote', 'table', 'img'].map(s => document.querySelector(s).getBoundingClientRect().top)"
        )
        assert order == sorted(order), order  # result box, then the scorecard, then the curves
        shot = browser.screenshot(tmp / "report.png")
        assert shot.read_bytes().startswith(PNG_MAGIC)
    finally:
        browser.close()
