"""The report builder: curves land on the right panels, PNGs are real images, the HTML carries
the same tables as the markdown, W&B run folders are linked."""

from __future__ import annotations

import base64
import json
import math
import os
import re
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.flow_records import FLOW_RECORDS
from pipelines.report_builder import build_report
from pipelines.report_plots import PANELS, series
from tests.report_fixtures import make_stage_outputs

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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, minilm_dir: Path, data_dir: Path) -> tuple:
    """A run directory as the flow leaves it, with its flow-run record; then its report."""
    tmp = tmp_path_factory.mktemp("report")
    cfg = load_config(None, [f"run_dir={tmp / 'runs'}", "wandb.mode=offline", "finetune.tasks=[]"])
    dirs = make_stage_outputs(cfg, minilm_dir, data_dir)
    record = {
        "flow_run": "test-run",
        "wandb_group": "default-test-run",
        "started_utc": "2026-01-01 00:00:00",
        "seconds": 500.0,
        "stages": [
            {"stage": "pretrain", "key": dirs["pretrain"].name, "out_dir": str(dirs["pretrain"]),
             "status": "ran", "seconds": 350.5, "compute_seconds": 350.0},
            {"stage": "preprocess", "key": dirs["preprocess"].name, "out_dir": str(dirs["preprocess"]),
             "status": "reused", "seconds": 30.0, "compute_seconds": 0.0},
            {"stage": "finetune", "key": dirs["finetune"].name, "out_dir": str(dirs["finetune"]),
             "status": "cached", "seconds": 0.2, "compute_seconds": 0.0,
             "code_note": "finetune: reusing 3 of 3 complete outputs made by other code (changed since: "
                          "finetuning/trainer.py); to recompute with this code: bertflow run CONFIG --force finetune"},
        ],
    }  # fmt: skip
    record_path = tmp / "runs" / FLOW_RECORDS / "r.json"
    record_path.parent.mkdir()
    record_path.write_text(json.dumps(record))
    return cfg, dirs, build_report(cfg, dirs["report"], record_path=record_path), tmp


def test_the_sync_command_names_every_offline_run_once(run_dir) -> None:
    """The report's `wandb sync` command reaches every offline run of the run directory, a
    `bertflow finetune` scorecard's (`scorecard_run/`) included, and none twice through the
    `latest/` links."""
    import shutil
    import subprocess

    _, dirs, paths, tmp = run_dir
    runs = tmp / "runs"
    lines = paths["report_md"].read_text().splitlines()
    (command,) = [line for line in lines if "wandb sync" in line and not line.startswith("|")]
    extra = runs / "finetune" / "k1" / "scorecard_run" / "wandb_files" / "wandb" / "offline-run-x"
    latest = runs / "latest" / "pretrain"
    try:  # added to the shared run directory for this test only
        extra.mkdir(parents=True)
        latest.parent.mkdir()
        latest.symlink_to(dirs["pretrain"])
        listing = command.replace("wandb sync", "printf '%s\\n'")
        listed = subprocess.run(
            ["bash", "-c", listing], capture_output=True, text=True, check=True
        ).stdout.split()
        expected = [str(d) for d in runs.rglob("offline-run-*") if d.is_dir()]  # rglob follows no links
        assert sorted(listed) == sorted(expected) and str(extra) in listed and len(expected) >= 3
    finally:
        shutil.rmtree(runs / "finetune" / "k1", ignore_errors=True)
        shutil.rmtree(runs / "latest", ignore_errors=True)


def test_report_leads_with_the_result_then_the_evidence(run_dir) -> None:
    _, dirs, paths, _ = run_dir
    md = paths["report_md"].read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    # the corpus read, under the title (a config's title may name another: its default's)
    assert "· corpus `data:wiki/summaries_en.txt` ·" in md.split("## ")[0]
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
    # data: the preprocess stage's warnings first, said as warnings, not as a statistic
    data = md.split("## Data")[1].split("## How the run went")[0]
    assert data.lstrip().startswith("**Warning:** 5 of 45 documents repeat an earlier one")
    assert "`warnings`" not in data
    # data: nested statistics are shown, with their keys
    assert "| documents held out (validation split) | 30 | `documents_used.validation` |" in md
    assert "| masked positions shown as [MASK] | 80.0% |" in md and "| skipped: files empty | 1 |" in md
    # stages: every row, the report's own, and the total
    assert "| pretrain | ran | 5 min 50 s | 5 min 50 s |" in md and "| finetune | cached |" in md
    assert (
        "| report | ran (this page) |" in md
        and "| **total** | 2 of 3 stages cached or reused | **8 min 20 s**" in md
    )
    # an output reused although its code changed since is said, with the files and the fix
    made_by_other_code = md.split("**Made by other code than this run's:**")[1].split("## ")[0]
    assert (
        "- finetune: reusing 3 of 3 complete outputs made by other code (changed since: finetuning/trainer.py)"
        in made_by_other_code
    )
    assert "--force finetune" in made_by_other_code and "pretrain" not in made_by_other_code
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


def test_the_flow_rebuilds_a_report_built_alone(tmp_path, minilm_dir, data_dir) -> None:
    """A report `bertflow report` built before any flow run says that no flow-run record was found;
    the flow builds it again with its own record instead of presenting that page as its result."""
    from common.atomic import read_marker
    from pipelines.cli import main as cli
    from pipelines.flow import bert_pipeline

    overrides = [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"]
    dirs = make_stage_outputs(load_config(None, overrides), minilm_dir, data_dir)
    assert cli(["report", "--set", *overrides]) == 0
    assert "No flow-run record found" in (dirs["report"] / "report.md").read_text()
    summary = bert_pipeline(config=None, overrides=overrides, only="report")
    assert [s["status"] for s in summary["stages"] if s["stage"] == "report"] == ["ran"]
    md = (dirs["report"] / "report.md").read_text()
    assert "No flow-run record found" not in md and summary["flow_run"] in md
    assert read_marker(dirs["report"]).get("by") != "bertflow report"
    again = bert_pipeline(config=None, overrides=overrides, only="report")  # the flow's own page is reused
    assert [s["status"] for s in again["stages"] if s["stage"] == "report"] in (["cached"], ["reused"])


def test_report_alone_is_marked_complete_only_once_its_run_is(tmp_path, minilm_dir, data_dir, capsys) -> None:
    """`bertflow report` while the flow still fine-tunes writes a partial page, which the flow's
    report stage must not reuse as final; and it reports on the last flow run of its own config,
    not on the newest record of the run directory (another config's, or an `--only verify` run)."""
    from common.atomic import read_marker
    from pipelines.cli import main as cli

    overrides = [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"]
    dirs = make_stage_outputs(load_config(None, overrides), minilm_dir, data_dir)
    records = tmp_path / "runs" / FLOW_RECORDS
    records.mkdir()
    for age, name, stage, out_dir in (
        (100, "this-configs-run", "finetune", dirs["finetune"]),
        (0, "a-verify-run", "verify", tmp_path / "runs" / "verify" / "v1"),
    ):
        path = records / f"{name}.json"
        entry = {
            "stage": stage,
            "key": out_dir.name,
            "out_dir": str(out_dir),
            "status": "ran",
            "seconds": 1.0,
        }
        path.write_text(
            json.dumps({"flow_run": name, "started_utc": "2026-01-01 00:00:00", "stages": [entry]})
        )
        os.utime(path, (path.stat().st_mtime - age,) * 2)

    aside = tmp_path / "scorecard-not-written-yet"
    dirs["finetune"].rename(aside)
    assert cli(["report", "--set", *overrides]) == 0
    assert "partial and not marked complete" in capsys.readouterr().out
    assert read_marker(dirs["report"]) is None
    aside.rename(dirs["finetune"])
    assert cli(["report", "--set", *overrides]) == 0
    assert read_marker(dirs["report"]) is not None
    md = (dirs["report"] / "report.md").read_text()
    assert "this-configs-run" in md and "a-verify-run" not in md


def test_result_states_the_pretraining_figures_and_verdict(run_dir) -> None:
    """The headline compares the held-out accuracy with the context-free baseline of the same
    examples (not with itself) and ends with the verdict; its step count is the run's 300 steps,
    not the 30 rows logged every 10 steps."""
    _, _, paths, _ = run_dir
    md = paths["report_md"].read_text()
    assert (
        "> **Pretraining (300 steps):** held-out masked-LM accuracy 25.0% (always the most frequent "
        "token: 16.7%), loss 5.00 nats (unigram entropy: 7.84). The masked-LM loss is below the unigram "
        "entropy, and its accuracy above always guessing the most frequent token: the model uses the "
        "context." in md
    )
    assert "300 steps × 64 sequences on 1 process(es), adamw, peak lr 0.0005, fp32, ZeRO stage 2." in md


def test_result_names_every_phases_steps_as_the_scorecard_does(run_dir, tmp_path) -> None:
    """With `phases:` the scorecard's row says "60 + 300 steps" (the phase before, then this
    pretraining) while the report's result said "Pretraining (300 steps)"."""
    import shutil

    from common.atomic import write_marker
    from finetuning.scorecard import display_name
    from pipelines.pretrain_card import pretraining_card
    from pipelines.report_sections import Links, result_section

    _, dirs, _, _ = run_dir
    phase, main = tmp_path / "pretrain" / "phase", tmp_path / "pretrain" / "main"
    (phase / "model").mkdir(parents=True)
    write_marker(phase, {"max_steps": 60})
    (phase / "run_spec.json").write_text("{}")  # a pretraining output has one (scorecard.pretraining_steps)
    shutil.copytree(dirs["pretrain"], main)
    spec = json.loads((main / "run_spec.json").read_text())
    spec["pretrain"]["init_from"] = str(phase / "model")
    (main / "run_spec.json").write_text(json.dumps(spec))
    write_marker(main, {"max_steps": 300, "steps_before": [60]})  # as stage_pretrain writes it
    lines = result_section(None, pretraining_card(main), main / "model", {}, Links(tmp_path, tmp_path))
    assert display_name(str(main / "model"), "main/model") == "pretrained (tiny, 60 + 300 steps)"
    assert any(line.startswith("> **Pretraining (60 + 300 steps):** held-out") for line in lines), lines


def test_last_logged_accuracies_are_shown_in_percent(run_dir) -> None:
    _, _, paths, _ = run_dir
    md = paths["report_md"].read_text()
    assert "| held-out masked-LM accuracy | 25.00 | % | 300 | `val_mlm_acc` |" in md
    assert "| training masked-LM accuracy (last logged batches) | 25.94 | % | 300 | `mlm_acc` |" in md


def test_data_and_stage_totals_are_counted_right(run_dir) -> None:
    """3 MiB of corpus is 3.0 MiB (not 3.1: MiB are 2**20 bytes); a skipped file means the
    "nothing was skipped" line is not shown, and is not counted as read; a reused stage counts as cached; the compute total adds
    up compute seconds (5 min 50 s), not wall seconds (6 min 21 s)."""
    _, _, paths, _ = run_dir
    md = paths["report_md"].read_text()
    assert "| corpus size (uncompressed) | 3.0 MiB | `input_bytes` |" in md
    assert "Nothing was skipped" not in md
    # input_files counts the files skipped whole too: it was shown as 'corpus files read'
    assert "| corpus files given (those skipped whole too) | 2 | `input_files` |" in md
    assert "| corpus files skipped whole (no text read) | 1: empty.txt | `files_skipped` |" in md
    assert (
        "| **total** | 2 of 3 stages cached or reused | **8 min 20 s** | 5 min 50 s | up to this report |"
        in md
    )


def test_curves_draw_the_context_free_baselines(run_dir, tmp_path, monkeypatch) -> None:
    """The dashed lines: the unigram entropy on the loss panel, the most-frequent-token accuracy on
    the accuracy panel, both of the held-out examples the report states, and nothing elsewhere."""
    from matplotlib.axes import Axes

    from pipelines.report_builder import gather

    cfg, _, _, _ = run_dir
    drawn = []
    axhline = Axes.axhline

    def record(ax, y=0, *args, **kwargs):
        drawn.append((ax, y))
        return axhline(ax, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "axhline", record)
    inputs = gather(cfg, tmp_path, {})
    baselines = inputs.card.evaluation.baselines
    levels = {ax.get_title(): y for ax, y in drawn}
    assert levels == {
        "Pretraining loss": pytest.approx(baselines["unigram_entropy"]),
        "Masked-LM (MLM) and next-sentence (NSP) accuracy": pytest.approx(
            baselines["most_frequent_token_acc"]
        ),
    }
    assert len(drawn) == 2 and baselines["most_frequent_token_acc"] == pytest.approx(1 / 6)


def test_a_report_built_in_a_copied_run_dir_links_to_the_copys_outputs(run_dir) -> None:
    """The stage table linked the absolute paths the flow recorded, i.e. into the run directory the
    copy was made from; the other links already pointed into the copy."""
    import shutil

    from pipelines.flow_records import FLOW_RECORDS

    cfg, dirs, _, tmp = run_dir
    copy = tmp / "copied-runs"
    shutil.copytree(tmp / "runs", copy)
    report_dir = copy / "report" / dirs["report"].name
    paths = build_report(
        cfg.model_copy(update={"run_dir": str(copy)}), report_dir, record_path=copy / FLOW_RECORDS / "r.json"
    )
    md = paths["report_md"].read_text()
    key = dirs["pretrain"].name
    assert f"| [pretrain/{key}](../../pretrain/{key}) |" in md, md
    assert "](../../../runs/" not in md


def test_the_report_w_and_b_run_summary_says_the_result_and_the_compute_times_the_page_shows(run_dir) -> None:
    """The report's W&B run summarised stage wall times only: a cached stage's was the moment it
    took to find its output (`seconds/pretrain` 0.019 where the page says 1 min 36 s), and the
    result (the verdict, the held-out MLM accuracy against the no-context baselines) was not there."""
    from finetuning.scorecard import headline_text
    from model.model_card import verdict
    from pipelines.report_builder import gather
    from tests.wandb_records import summary

    cfg, dirs, paths, _ = run_dir
    logged = summary(dirs["report"], newest=True)
    assert {k: v for k, v in logged.items() if "seconds/" in k} == {
        "compute_seconds/pretrain": 350.0,  # the page's compute-time column
        "compute_seconds/preprocess": 0.0,
        "compute_seconds/finetune": 0.0,
    }
    inputs = gather(cfg, dirs["report"], {})
    e = inputs.card.evaluation
    assert logged["result/verdict"] == headline_text(inputs.scorecard["headline"])
    assert logged["pretrain/val_mlm_acc"] == e.metrics["val_mlm_acc"]
    assert logged["pretrain/baseline/most_frequent_token_acc"] == e.baselines["most_frequent_token_acc"]
    assert logged["pretrain/baseline/unigram_entropy"] == e.baselines["unigram_entropy"]
    assert logged["pretrain/verdict"] == verdict(e)
    assert f"{100 * e.metrics['val_mlm_acc']:.1f}" in paths["report_md"].read_text()  # as the page says


def test_report_output_in_another_stages_folder_is_refused(tmp_path, minilm_dir, data_dir, capsys) -> None:
    """`bertflow report --output` of a shard or pretraining output replaced its _COMPLETE.json with
    the report's: the flow no longer found that stage complete and computed it again. Refused before
    anything is written, as a model folder is; the stage's marker stays."""
    from common.atomic import read_marker
    from pipelines.cli import main as cli

    overrides = [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "finetune.tasks=[]"]
    dirs = make_stage_outputs(load_config(None, overrides), minilm_dir, data_dir)
    for stage in ("preprocess", "pretrain"):
        marker = read_marker(dirs[stage])
        assert cli(["report", "--set", *overrides, "--output", str(dirs[stage])]) == 2
        assert f"holds a bertflow {stage} output; report would overwrite it" in capsys.readouterr().err
        assert read_marker(dirs[stage]) == marker and not (dirs[stage] / "report.md").exists()
    assert cli(["report", "--set", *overrides, "--output", str(dirs["pretrain"] / "model")]) == 2
    assert "is a model folder (it holds config.json)" in capsys.readouterr().err


def test_a_run_that_computed_nothing_counts_every_stage_as_cached(tmp_path) -> None:
    """A second run of the same config found every output: the fine-tuning units' row says
    "0 ran, 30 cached", and the total said "5 of 6 stages cached or reused" as if one stage had
    computed something (the end summary's W&B line already read that row as nothing new)."""
    from pipelines.report_sections import Links, stages_section

    rows = [("pretrain", "cached"), ("finetune-units", "0 ran, 28 cached, 2 reused"), ("finetune", "reused")]
    record = {
        "flow_run": "again",
        "stages": [
            {"stage": s, "status": status, "seconds": 0.1, "out_dir": str(tmp_path / s)} for s, status in rows
        ],
    }
    md = "\n".join(stages_section(record, tmp_path / "report", Links(tmp_path / "report", tmp_path)))
    assert "| **total** | 3 of 3 stages cached or reused |" in md
    record["stages"][1]["status"] = "2 ran, 28 cached"
    md = "\n".join(stages_section(record, tmp_path / "report", Links(tmp_path / "report", tmp_path)))
    assert "| **total** | 2 of 3 stages cached or reused |" in md


def test_the_run_section_names_the_command_of_the_flow_runs_settings(tmp_path) -> None:
    """The page said which config a flow run used, not its --set items: two runs of one config with
    different settings read the same there. It names the record's command (`bertflow runs show`'s)."""
    from pipelines.report_sections import Links, stages_section

    command = "bertflow run configs/default.yaml --set pretrain.max_steps=30"
    record = {"flow_run": "thirty", "wandb_group": "default-thirty", "command": command, "stages": []}
    md = "\n".join(stages_section(record, tmp_path / "report", Links(tmp_path / "report", tmp_path)))
    assert f"W&B group `default-thirty`, its command `{command}`. *ran*" in md


def test_the_w_and_b_section_says_how_its_runs_were_logged(tmp_path) -> None:
    """The page said "Runs are offline unless WANDB_MODE=online and WANDB_API_KEY are set" under any
    run: wrong for a WANDB_API_KEY alone (it turns `wandb.mode: offline` online), and under runs that
    W&B uploaded as they ran it offered a `wandb sync` of offline runs there were none of."""
    from pipelines.report_sections import Links, wandb_section

    links = Links(tmp_path / "report", tmp_path)
    stage = tmp_path / "pretrain" / "k" / "wandb_files" / "wandb"
    online = "\n".join(wandb_section([stage / "run-20261128_061907-abc"], tmp_path, links))
    assert "wandb sync" not in online and "offline unless" not in online
    assert "Each run was logged online: W&B uploaded it as it ran." in online
    offline = "\n".join(wandb_section([stage / "offline-run-20261128_061907-abc"], tmp_path, links))
    assert "wandb sync" in offline and "WANDB_MODE=online and WANDB_API_KEY" not in offline
    assert "a `WANDB_API_KEY` in the environment turns the config's `offline` into `online`" in offline


def test_the_dashed_baselines_say_which_curves_they_are_the_baseline_of(
    run_dir, tmp_path, monkeypatch
) -> None:
    """The loss panel draws the MLM baseline (unigram entropy) beside the training loss of MLM + NSP,
    which sits above it by the NSP loss whatever the model learned; the legend said only "no context:
    unigram entropy" and the caption "what a model that ignores the context scores", so that curve
    read as a model no better than no context. Each dashed line names the curves it is the level of."""
    from matplotlib.axes import Axes

    from pipelines.report_builder import gather

    cfg, _, paths, _ = run_dir
    labels = []
    axhline = Axes.axhline

    def record(ax, y=0, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return axhline(ax, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "axhline", record)
    gather(cfg, tmp_path, {})
    assert sorted(labels) == [
        "no context, masked-LM accuracy: most frequent token",
        "no context, masked-LM losses: unigram entropy",
    ]
    assert "the masked-LM curves' level without context" in paths["report_md"].read_text()


def test_the_accuracy_axis_says_its_scale(run_dir, tmp_path, monkeypatch) -> None:
    """The page states accuracies in percent (12.1%), the accuracy panel plots fractions (0.121)
    under a y label of "accuracy" alone: its label says the scale."""
    from matplotlib.axes import Axes

    from pipelines.report_builder import gather

    cfg, _, _, _ = run_dir
    ylabels = []
    set_ylabel = Axes.set_ylabel
    monkeypatch.setattr(
        Axes, "set_ylabel", lambda ax, label, *a, **k: ylabels.append(label) or set_ylabel(ax, label, *a, **k)
    )
    gather(cfg, tmp_path, {})
    assert "accuracy (fraction: 0.12 = 12%)" in ylabels and "loss (nats)" in ylabels


def test_tokens_seen_are_the_logged_count_not_an_estimate(run_dir, tmp_path) -> None:
    """The phases table and the model card gave steps × batch × the corpus's mean example length
    (1,880,681 in the default run) beside the last-logged table's exact `consumed_tokens`
    (1,881,591): two figures for one quantity. The logged count is used where there is one."""
    import shutil

    from pipelines.pretrain_card import pretraining_card

    _, dirs, _, _ = run_dir
    copy = tmp_path / "pretrain"
    shutil.copytree(dirs["pretrain"], copy)
    with (copy / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 100, "loss": 3.0, "consumed_tokens": 626_864}) + "\n")  # an earlier one
        f.write(json.dumps({"step": 300, "loss": 2.0, "consumed_tokens": 1_881_591}) + "\n")
    assert pretraining_card(copy).training.tokens_seen == 1_881_591  # the count at the card's step


def test_the_w_and_b_table_names_a_units_checkpoint_as_the_scorecard_does(run_dir, tmp_path) -> None:
    """A fine-tuning unit's W&B run was listed under its folder's label, "(random_16d81b4ccba1_model)",
    which the scorecard's rows ("random init (tiny)") never show: its result.json names the
    checkpoint, and the table now says it as the scorecard does."""
    from pipelines.report_sections import Links, wandb_section

    _, dirs, _, _ = run_dir
    unit = tmp_path / "finetune" / "units" / "cola-lr0.001-s1__random_k_model-e8ee575862ed"
    run = unit / "wandb_files" / "wandb" / "offline-run-20261128_062554-vv1ef01c"
    run.mkdir(parents=True)
    model = dirs["pretrain"] / "model"
    (unit / "result.json").write_text(
        json.dumps(
            {
                "checkpoint": f"random:{model}",
                "checkpoint_label": "random:k/model",
                "checkpoint_kind": "random",
            }
        )
    )
    md = "\n".join(wandb_section([run], tmp_path, Links(tmp_path / "report", tmp_path)))
    assert "| finetune unit cola-lr0.001-s1, random init (tiny) |" in md, md


def test_a_report_output_holding_the_users_files_is_refused(tmp_path, capsys) -> None:
    """`bertflow report --output D` where D held the user's own report.md and loss.png (no bertflow
    output) overwrote both, rc 0. Refused before anything is written, naming them; a partial report
    written there before (report_embedded.md, no marker: its run was unfinished) is its own."""
    from common.stage_output import refuse_foreign_files
    from pipelines.cli import main as cli
    from pipelines.report_builder import EMBEDDED_NAME, OUTPUT_NAMES

    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("report.md", "loss.png", "notes.md"):
        (mine / name).write_text("mine\n")
    overrides = [f"run_dir={tmp_path / 'runs'}", "wandb.mode=disabled"]
    assert cli(["report", "--set", *overrides, "--output", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"the report output {mine} already holds loss.png, report.md, and it is not" in err
    assert sorted(p.name for p in mine.iterdir()) == ["loss.png", "notes.md", "report.md"]
    assert all(p.read_text() == "mine\n" for p in mine.iterdir())
    (mine / "_COMPLETE.json").write_text("{}\n")  # the user's, naming no stage: no report's marker
    assert cli(["report", "--set", *overrides, "--output", str(mine)]) == 2
    assert (
        f"the report output {mine} already holds _COMPLETE.json, loss.png, report.md"
        in capsys.readouterr().err
    )
    assert (mine / "report.md").read_text() == "mine\n"
    (mine / "_COMPLETE.json").unlink()
    (mine / EMBEDDED_NAME).write_text("# bertflow\n")
    refuse_foreign_files(mine, "report", OUTPUT_NAMES, own=(EMBEDDED_NAME,))  # a partial report's: used
