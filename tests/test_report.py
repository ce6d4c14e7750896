"""The report builder: curves land on the right panels, PNGs are real images, the HTML carries
the same tables as the markdown, W&B run folders are linked."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from common.atomic import write_marker
from common.tracking import Tracker, WandbTarget
from pipelines.config import load_config
from pipelines.flow_records import FLOW_RECORDS
from pipelines.report_builder import build_report
from pipelines.report_plots import PANELS, series
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


def test_report_from_a_run_directory(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}", "wandb.mode=offline", "finetune.tasks=[]"])
    dirs = stage_dirs(cfg)
    # pretrain metrics, written the way every stage writes them (a real offline W&B run)
    tracker = Tracker(dirs["pretrain"], WandbTarget(project="bertflow-test"), name="pretrain")
    for row in _rows():
        step = row.pop("step")
        tracker.log(row, step=step)
    tracker.finish()
    write_marker(dirs["pretrain"])
    dirs["finetune"].mkdir(parents=True)
    (dirs["finetune"] / "scorecard.md").write_text(
        "# Scorecard\n\n| task | ours | random-tiny |\n|---|---:|---:|\n| sst2 | 0.81 | 0.55 |\n"
    )
    record = {
        "flow_run": "test-run",
        "wandb_group": "default-test-run",
        "started_utc": "2026-01-01 00:00:00",
        "stages": [
            {"stage": "pretrain", "key": dirs["pretrain"].name, "out_dir": str(dirs["pretrain"]),
             "status": "ran", "seconds": 12.5, "compute_seconds": 12.0},
            {"stage": "finetune", "key": dirs["finetune"].name, "out_dir": str(dirs["finetune"]),
             "status": "cached", "seconds": 0.2, "compute_seconds": 0.0},
        ],
    }  # fmt: skip
    record_path = tmp_path / FLOW_RECORDS / "r.json"
    record_path.parent.mkdir()
    record_path.write_text(json.dumps(record))

    paths = build_report(cfg, dirs["report"], record_path=record_path)

    pngs = [paths[s] for s in ("loss", "accuracy", "lr", "throughput")]
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, png
    assert len({p.read_bytes() for p in pngs}) == 4  # four different plots
    md = paths["report_md"].read_text()
    html = paths["report_html"].read_text()
    assert "| pretrain | `" in md and "| ran |" in md and "| cached |" in md
    assert "Cache hits: 1 of 2" in md
    assert "| sst2 | 0.81 | 0.55 |" in md and "### Scorecard" in md
    assert "![loss](loss.png)" in md
    # W&B: the pretrain run folder is linked and the sync command is shown
    assert "wandb_files/wandb/offline-run-" in md and "wandb sync" in md
    # HTML: real tables and images, not markdown source
    assert html.count("<table>") >= 3 and '<img src="loss.png"' in html and "| sst2 |" not in html
    assert re.search(r"<td[^>]*>0.81</td>", html)
    # the report stage's own W&B run exists
    assert list((dirs["report"] / "wandb_files" / "wandb").glob("offline-run-*"))
