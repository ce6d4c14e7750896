"""Pretraining in phases (config `phases:`, BERT's 128 tokens before 512, our 32 before 128): each
phase is the config's preprocess and pretrain sections with some settings changed, its stages are
keyed like the main ones, and the flow trains them in order, each from the model of the one before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from common.atomic import MARKER_NAME
from common.errors import UserError
from pipelines.config import load_config
from pipelines.stage_keys import stage_dirs, stage_keys, with_phase_init
from tests.flow_support import flow_log_lines, tiny_config

SEQ32 = {
    "name": "seq32",
    "preprocess": {"max_seq_length": 32, "max_predictions_per_seq": 5},
    "pretrain": {"max_steps": 6, "micro_batch_size": 16},
}


def _config(tmp_path: Path, phases: list[dict], name: str = "phased.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "phases": phases}))
    return path


def test_a_phase_is_the_main_sections_with_its_settings_changed(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, [SEQ32]))
    phase = cfg.phase_config(0)
    assert (phase.preprocess.max_seq_length, phase.preprocess.max_predictions_per_seq) == (32, 5)
    assert (phase.pretrain.max_steps, phase.pretrain.micro_batch_size) == (6, 16)
    assert phase.pretrain.lr == cfg.pretrain.lr and phase.preprocess.input == cfg.preprocess.input
    assert phase.phases == [] and cfg.phase_config(1) is cfg
    assert cfg.preprocess.max_seq_length == 128  # the main phase keeps its own
    # --set reaches a phase by name
    changed = load_config(_config(tmp_path, [SEQ32]), ["phases.seq32.pretrain.max_steps=9"])
    assert (
        changed.phase_config(0).pretrain.max_steps == 9
        and changed.pretrain.max_steps == cfg.pretrain.max_steps
    )


@pytest.mark.parametrize(
    "phases,overrides,message",
    [
        # a phase is named as --set names it, phases.seq32.pretrain.lr, in the message too (it said
        # phases[0].pretrain.lr there, after '--set phases.seq32.pretrain.lr=-1 is invalid:')
        ([{"name": "seq32", "preprocess": {"max_seq_lenght": 32}}], [],
         "phases.seq32.preprocess.max_seq_lenght: unknown key (did you mean phases.seq32.preprocess.max_seq_length?)"),
        ([{"name": "seq32", "pretrain": {"lr": -1}}], [], "phases.seq32.pretrain.lr: Input should be greater than 0"),
        ([SEQ32], ["phases.seq32.pretrain.lr=-1"],
         "--set phases.seq32.pretrain.lr=-1 is invalid: phases.seq32.pretrain.lr: Input should be greater than 0"),
        ([{"name": "seq32", "pretrainn": {}}], [], "phases.seq32.pretrainn: unknown key"),
        ([{"name": "seq32", "pretrain": {"init_from": "x"}}], [],
         "phases.seq32.pretrain.init_from: a phase starts from the phase before it"),
        ([{"name": "a"}, {"name": "a"}], [], "two pretraining phases are named 'a'"),
        ([SEQ32], ["phases.seq3.pretrain.max_steps=4"], "no pretraining phase named 'seq3' (did you mean seq32?)"),
    ],
)  # fmt: skip
def test_a_bad_phase_is_one_message_naming_it(
    tmp_path: Path, phases: list[dict], overrides: list[str], message: str
) -> None:
    with pytest.raises(UserError) as err:
        load_config(_config(tmp_path, phases), overrides)
    assert message in str(err.value)


def test_phase_keys_chain_and_match_a_config_of_their_own(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, [SEQ32]))
    keys, dirs = stage_keys(cfg), stage_dirs(cfg)
    assert list(keys) == [
        "verify", "tokenizer", "preprocess@seq32", "pretrain@seq32", "preprocess", "pretrain", "finetune", "report"
    ]  # fmt: skip
    assert dirs["pretrain@seq32"] == tmp_path / "run" / "pretrain" / keys["pretrain@seq32"]
    # a phase's stages are the main stages of the config it is: the same keys (a phase trained
    # by a config of its own, as the one-hour recipe's phase 1 once was, is found)
    alone = stage_keys(cfg.phase_config(0))
    assert (alone["preprocess"], alone["pretrain"]) == (keys["preprocess@seq32"], keys["pretrain@seq32"])
    # without the phase the main pretraining starts elsewhere: another key, the same shards
    plain = stage_keys(load_config(None, [f"run_dir={tmp_path / 'run'}"]))
    assert plain["preprocess"] == keys["preprocess"] and plain["pretrain"] != keys["pretrain"]
    # a phase setting moves that phase's pretraining and everything after it, nothing before
    longer = stage_keys(load_config(_config(tmp_path, [SEQ32]), ["phases.seq32.pretrain.max_steps=7"]))
    assert {s for s in keys if keys[s] != longer[s]} == {"pretrain@seq32", "pretrain", "finetune", "report"}
    # the main pretraining starts from the phase's model, once there is one
    with pytest.raises(UserError, match=r"model of phase 'seq32', which has none yet .*--phase seq32"):
        with_phase_init(cfg)
    dirs["pretrain@seq32"].mkdir(parents=True)
    (dirs["pretrain@seq32"] / MARKER_NAME).write_text("{}")
    assert with_phase_init(cfg).pretrain.init_from == str(dirs["pretrain@seq32"] / "model")


def test_a_phase_only_corpus_is_checked_before_compute_and_verified_again_when_edited(
    tmp_path: Path, data_dir: Path
) -> None:
    """A corpus only a phase reads is a data file of the flow: missing, the flow refuses to start
    (naming the phase's key), not after the stages before it; edited, the data check runs again."""
    from pipelines.verify_data import check_data_paths

    corpus = tmp_path / "phase_corpus.txt"
    phase = {**SEQ32, "preprocess": {**SEQ32["preprocess"], "input": [str(corpus)]}}
    with pytest.raises(UserError, match=r"phases\.seq32\.preprocess\.input: data path .*phase_corpus.txt"):
        check_data_paths(load_config(_config(tmp_path, [phase])))
    corpus.write_text("A first sentence. A second one.\n")
    cfg = load_config(_config(tmp_path, [phase]))
    assert corpus in check_data_paths(cfg)
    before = stage_keys(cfg)
    corpus.write_text("A first sentence. A second one, edited.\n")
    after = stage_keys(load_config(_config(tmp_path, [phase])))
    assert {s for s in before if before[s] != after[s]} == {
        "verify", "preprocess@seq32", "pretrain@seq32", "pretrain", "finetune", "report"
    }  # fmt: skip


def test_with_two_phases_each_finds_the_one_before_it(tmp_path: Path) -> None:
    """Phase b's own config (and the main one's) must key phase a as the flow does. Phase a's
    changes used to be applied to phase b's sections, not the main ones: a and b's directories as
    b and the main phase looked for them were ones the flow never wrote."""
    a = {"name": "a", "preprocess": {"max_seq_length": 32}, "pretrain": {"max_steps": 6}}
    b = {"name": "b", "preprocess": {"max_seq_length": 64, "dupe_factor": 2}, "pretrain": {"lr": 0.001}}
    cfg = load_config(_config(tmp_path, [a, b]))
    dirs, b_alone = stage_dirs(cfg), stage_dirs(cfg.phase_config(1))
    assert (b_alone["preprocess@a"], b_alone["pretrain@a"]) == (dirs["preprocess@a"], dirs["pretrain@a"])
    assert (b_alone["preprocess"], b_alone["pretrain"]) == (dirs["preprocess@b"], dirs["pretrain@b"])
    for stage in ("pretrain@a", "pretrain@b"):  # both phases trained: each starts from the one before
        dirs[stage].mkdir(parents=True)
        (dirs[stage] / MARKER_NAME).write_text("{}")
    assert with_phase_init(cfg.phase_config(1)).pretrain.init_from == str(dirs["pretrain@a"] / "model")
    assert with_phase_init(cfg).pretrain.init_from == str(dirs["pretrain@b"] / "model")


@pytest.mark.slow
def test_the_flow_trains_the_phases_in_order_and_reuses_them(tmp_path: Path, data_dir: Path) -> None:
    """One temporary Prefect API for the test's four flow runs (a restart between them cost ~5 s of
    CPU each), stopped after the last test by tests/conftest.py."""
    from pipelines.flow import bert_pipeline

    config = tiny_config(tmp_path, data_dir, finetune={"tasks": ["rte"], "seeds": [1], "baselines": []})
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "phases": [SEQ32]}, sort_keys=False))
    first = bert_pipeline(config=str(config))
    again = bert_pipeline(config=str(config))
    stages = {r["stage"]: r for r in first["stages"]}
    assert list(stages)[:6] == [
        "verify",
        "tokenizer",
        "preprocess@seq32",
        "pretrain@seq32",
        "preprocess",
        "pretrain",
    ]
    assert all(r["status"] == "ran" for name, r in stages.items() if name != "finetune-units")
    assert {r["status"] for r in again["stages"] if r["stage"] != "finetune-units"} == {"cached"}
    phase_dir, main_dir = Path(stages["pretrain@seq32"]["out_dir"]), Path(stages["pretrain"]["out_dir"])
    assert (phase_dir / MARKER_NAME).is_file() and phase_dir.parent == main_dir.parent
    # the phase trained at 32 tokens, the main phase started from its model
    assert json.loads((phase_dir / "model" / "tokenizer_config.json").read_text())["model_max_length"] == 32
    assert f"initialized weights from {phase_dir / 'model'}" in (main_dir / "launcher.log").read_text()
    # each phase's W&B run is named for its stage, in the flow run's group
    from tests.wandb_records import run_info

    runs = [run_info(d) for d in (phase_dir, main_dir)]
    assert [r["name"] for r in runs] == ["tiny-test-pretrain@seq32", "tiny-test-pretrain"], runs
    assert {r["group"] for r in runs} == {first["wandb_group"]}
    marker = json.loads((main_dir / MARKER_NAME).read_text())
    assert (marker["steps_before"], marker["max_steps"]) == ([6], 8)
    # the model card, the scorecard and the report name both phases' steps
    model_card = (main_dir / "model" / "README.md").read_text()
    assert "(6 + 8 steps, bertflow)" in model_card
    assert f"continued from: `{phase_dir / 'model'}`" in model_card
    card = json.loads((Path(stages["finetune"]["out_dir"]) / "scorecard.json").read_text())
    assert card["rows"][0]["name"] == "pretrained (tiny, 6 + 8 steps)", card["rows"][0]
    report = (Path(stages["report"]["out_dir"]) / "report.md").read_text()
    assert "| seq32 | 32 | 6 × 16 |" in report and "| main | 64 | 8 × 8 |" in report, report
    assert "> **Pretraining (6 + 8 steps):**" in report, report

    # `--force pretrain` retrains every phase's pretraining; the stages before them are reused
    forced = bert_pipeline(config=str(config), force=["pretrain"])
    status = {r["stage"]: r["status"] for r in forced["stages"]}
    assert (status["pretrain@seq32"], status["pretrain"]) == ("ran", "ran"), status
    assert (status["preprocess@seq32"], status["preprocess"], status["tokenizer"]) == ("cached",) * 3, status

    # a main pretrain setting that the phase inherits retrains it too, and the flow says why
    with flow_log_lines() as said:
        bert_pipeline(config=str(config), overrides=["pretrain.weight_decay=0.02"], only="pretrain")
    [note] = [line for line in said if line.startswith("pretrain@seq32: computes under a new key")]
    assert f"since flow run {forced['flow_run']} (" in note, note
    assert (
        "pretrain.weight_decay 0.01 -> 0.02 (from the main pretrain: section). Its output under the old "
        f"key, {phase_dir}, is complete and stays" in note
    )
