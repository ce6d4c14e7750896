"""Why a stage computes again: the settings that moved its key since the config's last flow run,
and what that run left under the old key (`pipelines/key_change.py`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from common.atomic import IN_PROGRESS_NAME, write_marker
from pipelines.config import load_config
from pipelines.flow_records import stage_record, write_record
from pipelines.key_change import key_change_note
from pipelines.stage_keys import stage_dirs, stage_key_inputs
from tests.flow_support import flow_log_lines, tiny_config


def flow_run_of(cfg, sets: list[str], run_name: str, started: float, stage: str = "pretrain") -> Path:
    """The output dir a flow run of `cfg` with `sets` used for `stage`, recorded as that run."""
    old = load_config(None, [f"run_dir={cfg.run_dir}", *sets])
    out = stage_dirs(old)[stage]
    out.mkdir(parents=True)
    (out / "stage_key.json").write_text(json.dumps(stage_key_inputs(old)[stage]))
    root = Path(cfg.run_dir)
    records = [stage_record(stage, out, "ran", 1.0, 1.0)]
    write_record(root, run_name, f"{cfg.name}-{run_name}", records, started, status="completed")
    return out


def test_a_changed_setting_is_named_with_what_the_old_key_keeps(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}", "pretrain.lr=5e-4"])
    now = stage_dirs(cfg)["pretrain"]
    inputs = stage_key_inputs(cfg)["pretrain"]

    # a killed pretraining under the old lr: its verified checkpoint is progress only that lr resumes
    started = time.time() - 60
    old = flow_run_of(cfg, ["pretrain.lr=1e-3"], "brave-fox", started)
    (old / "checkpoints" / "global_step40").mkdir(parents=True)
    (old / "checkpoints" / "global_step40" / "_VERIFIED.json").write_text("{}")
    (old / "checkpoints" / "global_step50").mkdir()  # killed mid-save: not resumable
    (old / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    note, lost = key_change_note(tmp_path, cfg.name, "pretrain", now, inputs)
    assert lost and note == (
        "pretrain: computes under a new key; since flow run brave-fox ("
        + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))
        + " UTC) of config 'default': pretrain.lr 0.001 -> 0.0005. Its output under the old key, "
        f"{old}, was interrupted at step 40 and stays: only the old settings resume it (`bertflow "
        f"runs clean {old} --yes --run-dir {tmp_path}` deletes it)."
    )
    # a phase that inherits the setting from the main section says so
    note, _ = key_change_note(tmp_path, cfg.name, "pretrain", now, inputs, phase_own={"max_steps"})
    assert "pretrain.lr 0.001 -> 0.0005 (from the main pretrain: section)." in note

    # once finished, it is complete and found again by the old settings: no progress left behind
    write_marker(old, {"stage": "pretrain"})  # (which also ends the in-progress mark)
    note, lost = key_change_note(tmp_path, cfg.name, "pretrain", now, inputs)
    assert not lost and note.endswith(
        f"Its output under the old key, {old}, is complete and stays: the old settings find it again."
    )

    # another config's runs, the same output, and stages that follow the long ones say nothing
    assert key_change_note(tmp_path, "other", "pretrain", now, inputs) == ("", False)
    assert key_change_note(tmp_path, cfg.name, "pretrain", old, inputs) == ("", False)
    assert key_change_note(tmp_path, cfg.name, "finetune", now, inputs) == ("", False)


def test_the_changes_said_are_the_first_four_then_how_many_more() -> None:
    """The notes and the `--output` refusal name up to four changes, then count the rest."""
    from pipelines.key_change import shown

    assert shown(["a 1 -> 2", "b", "c", "d"]) == "a 1 -> 2; b; c; d"
    assert shown(["a", "b", "c", "d", "e", "f"]) == "a; b; c; d and 2 more"


def test_the_clean_command_of_a_left_behind_output_pastes_in_a_shell(tmp_path: Path) -> None:
    """A run directory with a space in its name: the `bertflow runs clean` hint quotes the paths."""
    from pipelines.key_change import left_behind

    root = tmp_path / "my runs"
    old = root / "pretrain-abc"
    (old / "checkpoints" / "global_step40").mkdir(parents=True)
    (old / "checkpoints" / "global_step40" / "_VERIFIED.json").write_text("{}")
    (old / IN_PROGRESS_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    kept, lost = left_behind(old, root)
    assert lost and f"(`bertflow runs clean '{old}' --yes --run-dir '{root}'` deletes it)" in kept, kept


def test_a_fine_tuning_setting_that_moved_the_key_is_named(tmp_path: Path) -> None:
    """README says the flow names the settings that moved a stage's key since the config's last
    flow run, but only tokenizer, preprocess and pretrain were noted: a rerun with
    `--set finetune.epochs=2` retrained every unit without naming the setting."""
    cfg = load_config(None, [f"run_dir={tmp_path}", "finetune.epochs=2"])
    old = flow_run_of(cfg, [], "calm-owl", time.time() - 60, stage="finetune")
    write_marker(old, {"stage": "finetune"})
    note, lost = key_change_note(
        tmp_path, cfg.name, "finetune", stage_dirs(cfg)["finetune"], stage_key_inputs(cfg)["finetune"]
    )
    assert not lost and note.startswith("finetune: computes under a new key; since flow run calm-owl (")
    assert "of config 'default': finetune.epochs 3.0 -> 2.0." in note
    # more than four changes: the first four, then how many more
    sets = ["finetune.epochs=1", "finetune.batch_size=16", "finetune.warmup_proportion=0.2"]
    sets += ["finetune.weight_decay=0.1", "finetune.dropout=0.2"]
    old = flow_run_of(cfg, sets, "slow-elk", time.time() - 30, stage="finetune")
    write_marker(old, {"stage": "finetune"})
    note, _ = key_change_note(
        tmp_path, cfg.name, "finetune", stage_dirs(cfg)["finetune"], stage_key_inputs(cfg)["finetune"]
    )
    assert note.count(" -> ") == 4 and " and 1 more." in note, note


@pytest.mark.slow
def test_the_flow_says_why_its_units_train_again_once_before_they_train(
    tmp_path: Path, data_dir: Path
) -> None:
    from pipelines.flow import bert_pipeline

    config = tiny_config(tmp_path, data_dir, finetune={"tasks": ["rte"], "seeds": [1], "baselines": []})
    first = bert_pipeline(config=str(config))
    with flow_log_lines() as said:
        bert_pipeline(config=str(config), overrides=["finetune.epochs=2"])
    notes = [i for i, line in enumerate(said) if line.startswith("finetune: computes under a new key")]
    assert len(notes) == 1, said
    assert f"since flow run {first['flow_run']} (" in said[notes[0]]
    assert "finetune.epochs 1.0 -> 2.0. Its output under the old key" in said[notes[0]]
    [plan] = [i for i, line in enumerate(said) if line.startswith("finetune: 1 units, 0 already complete")]
    assert notes[0] < plan, said  # said before the units train, not after them beside the scorecard
