"""The whole flow on a tiny config with every real component (Beam, DeepSpeed, fine-tuning, W&B
offline, Prefect): a first run computes everything, with the stage graph recorded in Prefect and
every W&B run in the flow run's project, entity and group; a rerun computes nothing; and a changed
fine-tuning setting reruns exactly the fine-tuning units (here trained by `bertflow finetune` first,
which the flow then reuses), the scorecard and the report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from uuid import uuid4

import pytest

from common.atomic import MARKER_NAME
from common.errors import UserError
from tests.flow_support import USER_TASK, flow_log_lines, tiny_config

pytestmark = pytest.mark.slow


def _status(summary: dict) -> dict[str, str]:
    return {r["stage"]: r["status"] for r in summary["stages"]}


def _marker_times(summary: dict) -> dict[str, int]:
    return {
        r["stage"]: (Path(r["out_dir"]) / MARKER_NAME).stat().st_mtime_ns
        for r in summary["stages"]
        if r["stage"] != "finetune-units"
    }


def _upstream_graph(flow_run_id: str) -> dict[str, set[str]]:
    """task run -> the task runs its inputs came from, as recorded by the Prefect API."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(flow_run_id)]))
        )
    names = {r.id: r.name for r in runs}  # the stage names `bertflow run` prints; one per unit
    return {
        names[r.id]: {
            names[i.id] for inputs in r.task_inputs.values() for i in inputs if i.input_type == "task_run"
        }
        for r in runs
    }


def test_tiny_flow_then_cached_rerun_then_partial_rerun(tmp_path: Path, data_dir: Path) -> None:
    from pipelines.flow import bert_pipeline

    wandb = {"project": "bertflow-e2e", "entity": "bertflow-team"}
    config = str(tiny_config(tmp_path, data_dir, wandb=wandb))

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
    # DeepSpeed's CPU op for inference all-reduce is neither built nor loaded: training never calls it
    assert "deepspeed_shm_comm" not in (pretrain_dir / "launcher.log").read_text()
    # the Prefect graph: tokenizer -> preprocess -> pretrain -> units -> scorecard -> report, every
    # task run of it final in the API before it is read (as before `bertflow run` stops the server)
    from pipelines.prefect_server import wait_for_task_run_records

    assert len(first["task_run_ids"]) == 10  # six stages, four units
    assert wait_for_task_run_records(first["task_run_ids"], timeout_s=30)
    assert not wait_for_task_run_records([*first["task_run_ids"], str(uuid4())], timeout_s=0.5)
    graph = _upstream_graph(first["flow_run_id"])
    unit_runs = {name for name in graph if name.startswith("finetune-")}
    assert len(unit_runs) == 4 and f"finetune-rte-lr5e-05-s42-{pretrain_dir.name}/model" in unit_runs, graph
    assert set(graph) == {"verify", "tokenizer", "preprocess", "pretrain", "finetune", "report"} | unit_runs
    assert graph["tokenizer"] == {"verify"} and graph["preprocess"] == {"tokenizer"}
    assert graph["pretrain"] == {"tokenizer", "preprocess"}
    assert all(graph[unit] == {"pretrain", "tokenizer"} for unit in unit_runs), graph
    assert graph["finetune"] == unit_runs and graph["report"] == {"finetune"}
    # every W&B run of the flow run: the config's project and entity, the flow run's group
    from finetuning.config import FinetuneConfig
    from pipelines.config import ReportSection
    from tests.wandb_records import run_info

    runs = [run_info(Path(p).parent) for p in sorted(run.glob("**/wandb_files"))]
    assert {r["job_type"] for r in runs} == {
        "verify", "tokenizer", "preprocess", "pretrain", "finetune", "scorecard", "report"
    }  # fmt: skip
    assert len(runs) == 10, runs  # one per stage and per unit
    # each with its stage's settings as its config (verify ... report had `_wandb` alone)
    assert all(r["config_keys"] for r in runs), runs
    config_of = {r["job_type"]: r["config_keys"] for r in runs}
    assert config_of["scorecard"] == sorted(FinetuneConfig.model_fields), config_of
    assert config_of["report"] == sorted(ReportSection.model_fields), config_of
    assert all(
        (r["project"], r["entity"], r["group"]) == (wandb["project"], wandb["entity"], first["wandb_group"])
        for r in runs
    ), runs
    # scorecard: the pretrained model, then its random-init twin, on both tasks, from the units' results
    from finetuning.scorecard import build_scorecard
    from pipelines.config import load_config
    from pipelines.stage_finetune import flow_plan

    finetune_dir = Path(next(r["out_dir"] for r in first["stages"] if r["stage"] == "finetune"))
    card = json.loads((finetune_dir / "scorecard.json").read_text())
    ours = f"{pretrain_dir.name}/model"
    assert [(r["checkpoint"], r["kind"]) for r in card["rows"]] == [
        (ours, "pretrained"),
        (f"random:{ours}", "random"),
    ]
    assert card["columns"] == ["rte/accuracy", "stsb/pearson", "stsb/spearman"] and card["failed"] == []
    for row in card["rows"]:
        assert set(row["tasks"]) == {"rte", "stsb"}
        assert all((t["n_train"], t["n_eval"]) == (48, 48) for t in row["tasks"].values()), row
    [delta] = card["deltas"]
    mine, rnd = (r["tasks"] for r in card["rows"])
    assert delta["values"] == {
        f"{t}/{m}": mine[t]["metrics"][m] - rnd[t]["metrics"][m]
        for t, m in (c.split("/") for c in card["columns"])
    }
    tokenizer_dir = Path(next(r["out_dir"] for r in first["stages"] if r["stage"] == "tokenizer"))
    jobs = flow_plan(load_config(config), model_dir, tokenizer_dir)
    results = [json.loads((job.out_dir / "result.json").read_text()) for job in jobs]
    assert build_scorecard(results, tmp_path / "rebuilt")["rows"] == card["rows"]
    # the report: markdown + HTML + curves, timings and W&B links, in the W&B group of this flow run
    report_md = Path(first["report_md"])
    md = report_md.read_text()
    assert Path(first["report_html"]).is_file() and (report_md.parent / "loss.png").is_file()
    assert "| pretrain | ran |" in md and f"pretrain/{pretrain_dir.name}" in md
    assert md.index("## Result") < md.index("## Fine-tuning scorecard") < md.index("## Pretraining")
    assert (report_md.parent / "report_embedded.md").is_file()  # the Prefect artifact's text
    # the model card, and the tokenizer truncating where the model was trained
    assert "| masked-LM accuracy |" in (model_dir / "README.md").read_text()
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["model_max_length"] == 64
    # the flow run's record, and runs/latest pointing at its outputs
    record = json.loads(Path(first["record"]).read_text())
    assert record["status"] == "completed" and len(record["units"]) == 4
    assert (run / "latest" / "model").resolve() == model_dir.resolve()
    assert (run / "latest" / "report" / "report.html").resolve() == Path(first["report_html"]).resolve()
    assert "url=report/report.html" in (run / "latest" / "report.html").read_text()
    assert not list(run.glob("**/_IN_PROGRESS.json"))  # every output finished
    assert "rte" in md and "wandb sync" in md and "offline-run-" in md
    assert first["wandb_group"].startswith("tiny-test-")
    # the W&B runs in the order the flow made them (they were sorted by path: finetune first)
    wandb_rows = md.split("## Weights & Biases runs")[1].split("\n\n")[1].splitlines()[2:]
    order = [
        re.sub(r"^finetune unit .*", "finetune unit", row.split(" | ")[0].lstrip("| ")) for row in wandb_rows
    ]
    assert list(dict.fromkeys(order)) == [
        "verify", "tokenizer", "preprocess", "pretrain", "finetune unit", "finetune", "report"
    ], order  # fmt: skip
    # the record holds every stage as it ended; the report, recorded as running while it was built,
    # lists itself as this page
    assert not [r for r in record["stages"] if r["status"] in ("running", "failed")], record["stages"]
    assert "| report | ran (this page) |" in md and "| running |" not in md

    times = _marker_times(first)
    card_bytes = (finetune_dir / "scorecard.json").read_bytes()

    # --- rerun: nothing recomputes; Prefect reports the stages as Cached. A run-only setting that
    # shows in the finished pretraining (its evaluation cadence) is not applied to it, and said so
    wandb_runs = sorted(run.glob("**/wandb_files/wandb/*run-*"))
    with flow_log_lines() as said:
        second = bert_pipeline(config=config, overrides=["pretrain.eval_every=2"])
    force_pretrain = load_config(config, ["pretrain.eval_every=2"]).command_line("run", "--force", "pretrain")
    assert any(
        line.startswith(
            f"pretrain: reusing the finished run in {pretrain_dir}, which was made with "
            "pretrain.eval_every 4 (this run: 2). These settings are not applied"
        )
        # the whole flow command to apply them, as the stage command and the code-change note say
        # (it said "rerun with `--force pretrain`")
        and line.endswith(f"rerun with `{force_pretrain}` (it trains again).")
        for line in said
    ), said
    assert sorted(run.glob("**/wandb_files/wandb/*run-*")) == wandb_runs  # no W&B run: nothing ran
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

    # --- change a fine-tuning setting with `bertflow finetune CONFIG` alone, then in the flow: only
    # fine-tuning and the report are new, and the flow says the units were reused, not run again
    import os
    import subprocess
    import sys

    from common.paths import PROJECT_ROOT

    def finetune_alone(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "finetune", config, *args],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
        )

    # from here on one fine-tuning worker at a time (run-only: the same keys; the first run had two
    # at a time): each worker spawned imports torch, and the units' results do not depend on it
    one = "finetune.concurrency=1"
    alone = finetune_alone("--set", "finetune.epochs=2", one)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert "4 unit(s), 0 already complete" in alone.stdout
    assert "1 worker(s) of 1 torch thread(s) -> " in alone.stdout  # on CPU, at any concurrency
    from pipelines.stage_keys import stage_dir, stage_key_inputs

    two_epochs = load_config(config, ["finetune.epochs=2"])  # what its key hashes, beside it as in the flow
    written = json.loads((stage_dir(two_epochs, "finetune") / "stage_key.json").read_text())
    assert written == stage_key_inputs(two_epochs)["finetune"]
    third = bert_pipeline(config=config, overrides=["finetune.epochs=2", one])
    status = _status(third)
    assert status == {
        "verify": "cached",
        "tokenizer": "cached",
        "preprocess": "cached",
        "pretrain": "cached",
        "finetune-units": "0 ran, 0 cached, 4 reused",
        "finetune": "reused",  # the scorecard `bertflow finetune` wrote
        "report": "ran",
    }, status
    new_times = _marker_times(third)
    for stage in ("verify", "tokenizer", "preprocess", "pretrain"):
        assert new_times[stage] == times[stage], stage
    third_finetune = Path(next(r["out_dir"] for r in third["stages"] if r["stage"] == "finetune"))
    assert third_finetune != finetune_dir and (finetune_dir / MARKER_NAME).is_file()  # old one kept
    assert Path(third["report_md"]).parent != report_md.parent

    # --- `bertflow finetune CONFIG` alone plans exactly the flow's units: all four are found again
    stamps = {job.out_dir: (job.out_dir / "result.json").stat().st_mtime_ns for job in jobs}
    proc = finetune_alone("--set", one)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"-> {finetune_dir}" in proc.stdout
    assert {d: (d / "result.json").stat().st_mtime_ns for d in stamps} == stamps  # reused, not rerun
    assert json.loads((finetune_dir / "scorecard.json").read_text())["rows"] == card["rows"]

    # --- a new pretraining run: its model's units train, random init's are copied from the first
    # run's (random weights of the same architecture do not depend on the pretrained ones)
    six = ["pretrain.max_steps=6", one]
    fourth = bert_pipeline(config=config, overrides=six)
    # the pretrained model's two units train, random init's two are copied; the scorecard and report are new
    new_model_ran = {"verify": "cached", "tokenizer": "cached", "preprocess": "cached", "pretrain": "ran",
                     "finetune-units": "2 ran, 0 cached, 2 reused", "finetune": "ran", "report": "ran"}  # fmt: skip
    assert _status(fourth) == new_model_ran, _status(fourth)
    new_pretrain = Path(next(r["out_dir"] for r in fourth["stages"] if r["stage"] == "pretrain"))
    fourth_finetune = Path(next(r["out_dir"] for r in fourth["stages"] if r["stage"] == "finetune"))
    fourth_card = json.loads((fourth_finetune / "scorecard.json").read_text())
    [_, first_random] = card["rows"]
    [_, random_row] = fourth_card["rows"]
    assert random_row["checkpoint"] == f"random:{new_pretrain.name}/model" != first_random["checkpoint"]
    assert random_row["tasks"] == first_random["tasks"]

    # --- `--force pretrain`: the same model again, byte for byte (pretraining is deterministic), and
    # the units key the model by its content: they are found again, and nothing after them reruns
    weights = (new_pretrain / "model" / "model.safetensors").read_bytes()
    fifth = bert_pipeline(config=config, overrides=six, force=["pretrain"])
    assert _status(fifth) == {**new_model_ran, "finetune-units": "0 ran, 4 cached", "finetune": "cached",
                              "report": "cached"}, _status(fifth)  # fmt: skip
    assert (new_pretrain / "model" / "model.safetensors").read_bytes() == weights

    # --- a unit deleted: it trains again, and the scorecard and report, though their keys are the
    # same, are rebuilt from the units
    [deleted, *_] = sorted(
        d
        for d in (fourth_finetune.parent / "units").glob(f"*{new_pretrain.name}_model-*")
        if "random" not in d.name
    )
    shutil.rmtree(deleted)
    rebuilt = bert_pipeline(config=config, overrides=six)
    assert _status(rebuilt) == {**new_model_ran, "pretrain": "cached", "finetune-units": "1 ran, 3 cached"}, (
        _status(rebuilt)
    )
    assert (deleted / MARKER_NAME).is_file()
    rebuilt_finetune = Path(next(r["out_dir"] for r in rebuilt["stages"] if r["stage"] == "finetune"))
    assert rebuilt_finetune == fourth_finetune

    # --- a model deleted from a complete pretraining: the flow writes it again from the last checkpoint
    shutil.rmtree(new_pretrain / "model")
    sixth = bert_pipeline(config=config, overrides=six)
    assert _status(sixth)["pretrain"] == "ran" and (new_pretrain / "model" / "config.json").is_file()

    # --- `--force finetune` (what a reuse after a code change advises): every unit trains again
    # (this model's units under every fine-tuning setting tried above; the flow's four retrain)
    units = sorted(fourth_finetune.parent.glob(f"units/*{new_pretrain.name}_model-*/result.json"))
    before = {p: p.stat().st_mtime_ns for p in units}
    seventh = bert_pipeline(config=config, overrides=six, force=["finetune"])
    assert _status(seventh)["finetune-units"] == "4 ran, 0 cached", _status(seventh)
    assert _status(seventh)["pretrain"] == "cached"
    retrained = [p for p, t in before.items() if p.stat().st_mtime_ns != t]
    assert len(retrained) == 4, retrained

    # --- finetune.save_models: all (run-only): the four finished units train again to keep their
    # models (same keys), and the flow says where they are (it said nothing of kept models)
    with flow_log_lines() as said:
        eighth = bert_pipeline(config=config, overrides=[*six, "finetune.save_models=all"])
    assert _status(eighth)["finetune-units"] == "4 ran, 0 cached", _status(eighth)
    kept = sorted(fourth_finetune.parent.glob(f"units/*{new_pretrain.name}_model-*/model/model.safetensors"))
    assert len(kept) == 4 and any("4 fine-tuned model(s) kept" in line for line in said), said[-5:]
    assert any("4 finished unit(s) have no kept model" in line for line in said)  # said before they ran

    # --- units that fail on bad input (a user task whose TSV has a label it does not list; verify,
    # which reads task files, does not run under --only finetune) are not retried (flow.retries=1):
    # until 2026-11-28 each failed unit ran again, as after a lost worker
    bad = tmp_path / "movies.tsv"
    bad.write_text("text\tsentiment\ngood film\tpos\nbad film\tneg\nok film\tmeh\n")
    (tmp_path / "tasks.yaml").write_text(USER_TASK.format(tsv=bad))
    bad_task = [*six, "flow.retries=1", "flow.retry_delay_seconds=0", "finetune.tasks=[movies]"]
    bad_task.append(f"finetune.task_config={tmp_path / 'tasks.yaml'}")
    with flow_log_lines() as said, pytest.raises(UserError, match="2 of 2 fine-tuning units failed") as exc:
        bert_pipeline(config=config, overrides=bad_task, only="finetune")
    assert str(exc.value).count(f"{bad} line 4: unknown label 'meh'") == 2
    assert len([line for line in said if "movies-lr" in line and "FAILED" in line]) == 2, said[-10:]
    assert not [line for line in said if " - Retry " in line], [line for line in said if " - Retry " in line]

    # --- `--only finetune` on a pretraining whose model is gone: said before any unit, not later
    shutil.rmtree(new_pretrain / "model")
    with pytest.raises(
        UserError,
        match=r"--only finetune needs stages that have no complete output for this config: pretrain \(",
    ):
        bert_pipeline(config=config, overrides=six, only="finetune")
