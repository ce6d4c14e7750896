"""The pipeline YAML: every shipped config validates; bad input is one clear message naming the key."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.errors import UserError
from common.paths import PROJECT_ROOT, data_root, resolve_data_path
from pipelines.config import PhaseSection, load_config
from pipelines.verify_data import check_data_paths, verify_data
from tests.forbid_imports import env_forbidding

CONFIGS = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate_and_name_existing_data(path: Path, data_dir: Path) -> None:
    cfg = load_config(path)
    files = check_data_paths(cfg)
    assert files and all(p.is_file() for p in files)


def test_default_config_is_the_small_cpu_run() -> None:
    cfg = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    assert cfg.model.preset in ("tiny", "mini")
    assert cfg.tokenizer.input == ["data:wiki/summaries_en.txt"]
    assert set(cfg.finetune.tasks) == {"sst2", "mrpc", "rte", "cola", "stsb"}
    assert "random" in cfg.finetune.baselines


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "pretrain:\n  max_step: 10\n")
    with pytest.raises(UserError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert "pretrain.max_step" in msg and "unknown key" in msg and str(path) in msg


def test_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="pretraining: unknown key"):
        load_config(_write(tmp_path, "pretraining:\n  max_steps: 10\n"))


def test_wrong_type_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        load_config(_write(tmp_path, "finetune:\n  batch_size: lots\n"))
    assert "finetune.batch_size" in str(exc.value) and "'lots'" in str(exc.value)


def test_override_wins_and_is_validated(tmp_path: Path) -> None:
    path = _write(tmp_path, "pretrain:\n  max_steps: 10\n")
    assert load_config(path, ["pretrain.max_steps=7"]).pretrain.max_steps == 7
    with pytest.raises(UserError, match="pretrain.max_steps"):
        load_config(path, ["pretrain.max_steps=-1"])
    with pytest.raises(UserError, match="KEY=VALUE"):
        load_config(path, ["pretrain.max_steps"])


def test_a_bad_override_is_blamed_not_the_file(tmp_path: Path) -> None:
    """The message names what the user got wrong: the --set item, or the file, or the file with it."""
    path = _write(tmp_path, "pretrain:\n  max_steps: 10\n")
    with pytest.raises(UserError) as exc:
        load_config(path, ["pretrain.lr=abc", "pretrain.warmup_steps=5"])
    assert str(exc.value).startswith("--set pretrain.lr=abc is invalid: pretrain.lr:")
    with pytest.raises(UserError) as exc:
        load_config(path, ["pretrain.lrr=1"])
    assert str(exc.value).startswith("--set pretrain.lrr=1 is invalid: pretrain.lrr: unknown key")
    bad = _write(tmp_path, "pretrain:\n  lr: x\n")
    with pytest.raises(UserError) as exc:
        load_config(bad, ["pretrain.max_steps=-1"])
    assert str(exc.value).startswith(f"config file {bad} with --set pretrain.max_steps=-1 is invalid:")
    with pytest.raises(UserError) as exc:
        load_config(bad, ["pretrain.max_steps=3"])
    assert str(exc.value).startswith(f"config file {bad} is invalid: pretrain.lr:")
    # a phase's setting, named by the phase's name as --set names it
    phased = _write(tmp_path, "phases:\n  - name: short\n    pretrain:\n      max_steps: 10\n")
    for item in (
        "phases.short.pretrain.max_steps=abc",
        "phases.short.pretrain.foo=1",
        "phases.short.finetune.epochs=1",
    ):
        with pytest.raises(UserError) as exc:
            load_config(phased, [item])
        assert str(exc.value).startswith(f"--set {item} is invalid: "), str(exc.value)


def test_override_that_is_not_yaml_is_named() -> None:
    glob = "data:wiki/enwiki-2015/AA/wiki_[0-3]*.gz"  # brackets make YAML read a nested list
    with pytest.raises(UserError) as exc:
        load_config(None, [f"tokenizer.input=[{glob}]"])
    assert f"--set tokenizer.input=[{glob}]: the value is not valid YAML" in str(exc.value)
    assert load_config(None, [f"tokenizer.input={glob}"]).tokenizer.input == [glob]  # the fix it names
    assert load_config(None, [f'tokenizer.input=["{glob}"]']).tokenizer.input == [glob]


def test_missing_config_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(_write(tmp_path, "pretrain: [unclosed\n"))


def test_a_key_written_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys: a second `pretrain:` dropped the first one's settings."""
    cases = {
        "pretrain:\n  max_steps: 10\nmodel:\n  preset: tiny\npretrain:\n  lr: 0.1\n": "key 'pretrain' appears twice (lines 1 and 5)",
        "pretrain:\n  max_steps: 10\n  max_steps: 20\n": "key 'pretrain.max_steps' appears twice (lines 2 and 3)",
        "phases:\n  - name: a\n    pretrain: {max_steps: 1, max_steps: 2}\n": "key 'phases[0].pretrain.max_steps' appears twice (line 3)",
    }  # fmt: skip
    for text, words in cases.items():
        path = _write(tmp_path, text)
        with pytest.raises(UserError) as exc:
            load_config(path)
        assert f"config file {path}: {words}" in str(exc.value)


@pytest.mark.parametrize(
    "setting",
    [
        "tokenizer.input=['data:']",
        "preprocess.input=[data:wiki/summaries_en.txt, 'data:']",
        "tokenizer.vocab=data:.",
    ],
)
def test_an_empty_data_path_is_refused_naming_the_key(setting: str) -> None:
    """`data:` with nothing after it (an unset variable) was the whole data root: the corpus then
    held the GLUE, SQuAD and CoNLL evaluation files."""
    with pytest.raises(UserError) as exc:
        load_config(None, [setting])
    assert f"{setting.split('=')[0]}" in str(exc.value) and "whole data root" in str(exc.value)


def test_an_empty_data_path_is_refused_where_it_is_resolved() -> None:
    with pytest.raises(UserError, match="data path 'data:': .* whole data root"):
        resolve_data_path("data:")
    assert resolve_data_path("data:wiki") == data_root() / "wiki"


def test_missing_data_path_names_key_and_path(tmp_path: Path, data_dir: Path) -> None:
    cfg = load_config(None, ["preprocess.input=[data:wiki/no_such_corpus.txt]"])
    with pytest.raises(UserError) as exc:
        check_data_paths(cfg)
    msg = str(exc.value)
    assert "preprocess.input" in msg and "no_such_corpus.txt" in msg and "BERTFLOW_DATA" in msg
    # a path of the user's own is not read under the data root: moving the root is no fix for it
    with pytest.raises(UserError) as exc:
        check_data_paths(load_config(None, [f"preprocess.input=[{tmp_path / 'mine.txt'}]"]))
    assert str(tmp_path / "mine.txt") in str(exc.value) and "data root" not in str(exc.value)


@pytest.mark.parametrize(
    "setting,message",
    [
        ("tokenizer.input=[]", "config key tokenizer.input is empty"),
        ("tokenizer.vocab=data:wiki/no_such_vocab.txt", "config key tokenizer.vocab: .*no_such_vocab.txt does not exist"),
    ],
)  # fmt: skip
def test_no_corpus_and_a_missing_vocab_are_refused_naming_the_key(
    data_dir: Path, setting: str, message: str
) -> None:
    """Before compute, not after: a tokenizer trained on nothing, or a stage failing on the vocab."""
    with pytest.raises(UserError, match=message):
        check_data_paths(load_config(None, [setting]))


def test_init_froms_own_vocabulary_is_named_as_the_file_tokenizer_vocab_takes(
    tmp_path: Path, data_dir: Path
) -> None:
    """With pretrain.init_from=DIR and another tokenizer, the fix said `tokenizer.vocab: DIR`, which the
    flow then refused as "DIR does not exist": it names DIR/vocab.txt, which passes, and a folder given
    to tokenizer.vocab is said to be one, with its vocab.txt named."""
    from training.preflight import check_init_vocabulary

    model = tmp_path / "model"  # a model and a tokenizer with the same tokens in another order
    (model / "tokenizer").mkdir(parents=True)
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nof\n")
    (model / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nof\nthe\n")
    with pytest.raises(UserError) as exc:
        check_init_vocabulary(model, model / "tokenizer" / "vocab.txt", load_config(None))
    said = str(exc.value)
    assert f"tokenizer.vocab: {model / 'vocab.txt'}, and its tokenizer" in said, said
    assert f"`bertflow pretrain CONFIG --tokenizer {model} --shards NEW_SHARDS --output OUT`" in said, said
    check_init_vocabulary(model, model / "vocab.txt", load_config(None))  # the fix, followed
    assert model / "vocab.txt" in check_data_paths(
        load_config(None, [f"tokenizer.vocab={model / 'vocab.txt'}"])
    )
    with pytest.raises(UserError) as exc:
        check_data_paths(load_config(None, [f"tokenizer.vocab={model}"]))
    assert f"tokenizer.vocab: {model} is a folder; name its vocab.txt: {model / 'vocab.txt'}" in str(
        exc.value
    )


def test_empty_glob_is_a_missing_path(data_dir: Path) -> None:
    cfg = load_config(None, ["tokenizer.input=[data:wiki/enwiki-2015/ZZ/*.gz]"])
    with pytest.raises(UserError, match="tokenizer.input"):
        check_data_paths(cfg)


def test_missing_task_data_is_named(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "wiki").mkdir(parents=True)
    (root / "wiki" / "summaries_en.txt").write_text("One. Two.\n")
    cfg = load_config(None, [f"data_root={root}", "finetune.tasks=[rte]"])
    with pytest.raises(UserError) as exc:
        check_data_paths(cfg)
    assert "finetune.tasks" in str(exc.value) and "rte" in str(exc.value)


def test_checksums_catch_a_corrupt_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import hashlib

    root = tmp_path / "data"
    (root / "wiki").mkdir(parents=True)
    corpus = root / "wiki" / "summaries_en.txt"
    corpus.write_text("First sentence. Second sentence.\n")
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    (root / "SHA256SUMS").write_text(f"{digest}  ./wiki/summaries_en.txt\n")
    overrides = [f"data_root={root}", "finetune.tasks=[]", "verify.checksums=true"]
    summary = verify_data(load_config(None, overrides))
    assert summary["checksummed"] == 1 and summary["files"] == 1
    own = tmp_path / "mine.txt"  # a corpus of the user's own, not in the data release's SHA256SUMS
    own.write_text("My sentence. Another one.\n")
    with caplog.at_level("WARNING", logger="bertflow.verify"):
        summary = verify_data(load_config(None, [*overrides, f"tokenizer.input=[{own}]"]))
    assert (summary["checksummed"], summary["not_listed"]) == (1, 1)
    assert (
        f"1 of 2 data files are not listed in {root / 'SHA256SUMS'}" in caplog.text
        and str(own) in caplog.text
    )
    corpus.write_text("First sentence. Second sentence changed.\n")
    with pytest.raises(UserError, match="corrupt"):
        verify_data(load_config(None, overrides))


def test_checksums_in_binary_mode_are_matched_and_other_sums_files_refused(tmp_path: Path) -> None:
    """`sha256sum -b` writes `HASH *PATH`; an md5sum file (or a malformed line) is refused as not
    sha256sum output, not read as checksums that every file then fails."""
    import hashlib

    root = tmp_path / "data"
    (root / "wiki").mkdir(parents=True)
    corpus = root / "wiki" / "summaries_en.txt"
    corpus.write_text("First sentence. Second sentence.\n")
    sums = root / "SHA256SUMS"
    sums.write_text(f"{hashlib.sha256(corpus.read_bytes()).hexdigest()} *wiki/summaries_en.txt\n")
    overrides = [f"data_root={root}", "finetune.tasks=[]", "verify.checksums=true"]
    summary = verify_data(load_config(None, overrides))
    assert (summary["checksummed"], summary["not_listed"]) == (1, 0)
    sums.write_text(f"{hashlib.md5(corpus.read_bytes()).hexdigest()}  wiki/summaries_en.txt\n")
    with pytest.raises(UserError, match="SHA256SUMS line 1 is not `SHA256  PATH`"):
        verify_data(load_config(None, overrides))


@pytest.mark.parametrize("command", ["run", "tokenizer", "pretrain", "finetune", "report"])
def test_cli_prints_one_paragraph_and_exits_2(tmp_path: Path, command: str) -> None:
    """A config mistake is one paragraph and exit 2, said before any heavy package loads: torch,
    DeepSpeed, Prefect, Beam and W&B are made unimportable here (tests/forbid_imports). `bertflow
    preprocess` is not listed: it imports Beam, which it always needs, before it reads the config."""
    path = _write(tmp_path, "finetune:\n  epoch: 3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", command, str(path)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env=env_forbidding(["torch", "deepspeed", "prefect", "apache_beam", "wandb"]),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "finetune.epoch: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _run_cpu_hour(runs: Path, setting: str) -> subprocess.CompletedProcess[str]:
    """`bertflow run configs/cpu-hour.yaml` into `runs` with one setting changed."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/cpu-hour.yaml",
         "--set", f"run_dir={runs}", "--set", *setting.split()],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
        timeout=120,
    )  # fmt: skip


def _cpu_hour_refusal(runs: Path, setting: str) -> str:
    """What `bertflow run configs/cpu-hour.yaml --set run_dir=RUNS SETTING` refuses before Prefect
    starts: its config load and `check_flow`, here in this process (`bertflow run` itself:
    test_bertflow_run_refuses_what_its_checks_find_before_any_stage)."""
    from pipelines.flow_preflight import check_flow
    from pipelines.stage_plan import plan_stages

    with pytest.raises(UserError) as exc:
        cfg = load_config(PROJECT_ROOT / "configs" / "cpu-hour.yaml", [f"run_dir={runs}", *setting.split()])
        check_flow(cfg, plan_stages(None, None, None)[0])
    assert not runs.exists()  # nothing written
    return str(exc.value)


def test_an_unknown_task_says_the_key_the_config_file_and_the_closest_name(tmp_path: Path) -> None:
    """`finetune: {tasks: [rtee]}` in a config file was `unknown task(s) ['rtee']`: no key, no file,
    no "did you mean rte"; the same from --set named no --set item either."""
    from pipelines.flow_preflight import check_flow
    from pipelines.stage_plan import plan_stages

    raw = yaml.safe_load((PROJECT_ROOT / "configs" / "cpu-hour.yaml").read_text())
    raw["finetune"]["tasks"] = ["sst2", "rtee"]
    config = tmp_path / "mine.yaml"
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError) as exc:
        check_flow(load_config(config, [f"run_dir={tmp_path / 'runs'}"]), plan_stages(None, None, None)[0])
    said = f"finetune.tasks in config file {config}: unknown task(s) 'rtee' (did you mean rte?)."
    assert said in str(exc.value)
    refused = _cpu_hour_refusal(tmp_path / "runs", "finetune.tasks=[rtee]")
    assert "--set finetune.tasks=[rtee]: unknown task(s) 'rtee' (did you mean rte?)." in refused


def test_a_missing_init_from_is_refused_before_any_stage(tmp_path: Path) -> None:
    proc = _run_cpu_hour(tmp_path / "runs", f"pretrain.init_from={tmp_path / 'phase1'}")
    assert proc.returncode == 2, proc.stderr
    assert f"pretrain.init_from {tmp_path / 'phase1'} does not exist" in proc.stderr
    assert "phases: section" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before the tokenizer stage wrote anything


def test_bertflow_run_refuses_what_its_checks_find_before_any_stage(tmp_path: Path) -> None:
    """The tests below call the checks in-process; here `bertflow run` itself: exit code 2, the
    message with its fix, no traceback, nothing written."""
    proc = _run_cpu_hour(tmp_path / "runs", "pretrain.optimizer=muon")
    assert proc.returncode == 2, proc.stderr
    assert (
        "pretrain.optimizer muon needs ZeRO stage 0" in proc.stderr
        and "Fix: set pretrain.zero_stage: 0" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def _mark_complete(cfg, *stages: str, model: bool = True) -> None:
    """Complete outputs of `stages` where the flow finds them (a pretraining with its model)."""
    from common.atomic import write_marker
    from pipelines.stage_keys import base_stage, stage_dirs

    for stage in stages:
        out = stage_dirs(cfg)[stage]
        write_marker(out, {"stage": base_stage(stage)})
        if model and base_stage(stage) == "pretrain":
            (out / "model").mkdir()
            (out / "model" / "config.json").write_text("{}")


def test_only_a_stage_whose_inputs_are_missing_is_refused_naming_every_one_and_the_run_that_makes_them(
    tmp_path: Path,
) -> None:
    """`--only finetune` on a run dir without its inputs started Prefect and recorded a failed flow
    run, then named only the pretraining, and advised `--only pretrain`, which was refused in turn
    for the preprocessing. The preflight now names every missing input (and theirs), as the flow
    looks for them (a pretraining with its model, also under an earlier release's key), and the
    `--only` run it suggests passes."""
    from pipelines.flow_preflight import check_flow_inputs
    from pipelines.stage_keys import stage_keys
    from pipelines.stage_plan import plan_stages

    runs = tmp_path / "runs"
    cfg = load_config(None, [f"run_dir={runs}"])

    def refusal(only: list[str], force: list[str] | None = None) -> str:
        with pytest.raises(UserError) as exc:
            check_flow_inputs(cfg, plan_stages(only, None, force)[0])
        return str(exc.value)

    said = refusal(["finetune"], ["finetune"])
    assert said.startswith("--only finetune needs stages that have no complete output for this config: ")
    assert [s for s in ("verify", "tokenizer", "preprocess", "pretrain", "report") if f" {s} (" in said] == [
        "tokenizer",
        "preprocess",
        "pretrain",
    ]
    suggested = re.search(r"`bertflow run CONFIG ((--only \w+ ?)+)--set", said).group(1).split()[1::2]
    assert suggested == ["tokenizer", "preprocess", "pretrain", "finetune"]
    check_flow_inputs(cfg, plan_stages(suggested, None, None)[0])
    for selection in ([None, None], [None, "finetune"]):  # the whole flow, --from: they make every input
        check_flow_inputs(cfg, plan_stages(selection[0], selection[1], None)[0])
    # every stage but the tokenizer: its output is read, and missing
    assert "no complete output for this config: tokenizer (" in refusal(
        ["verify", "preprocess", "pretrain", "finetune", "report"]
    )
    assert not runs.exists()

    _mark_complete(cfg, "tokenizer", "preprocess")
    _mark_complete(cfg, "pretrain", model=False)  # the flow writes its model again: not complete
    said = refusal(["report"])
    assert f"no complete output for this config: pretrain ({runs / 'pretrain'}/" in said
    assert (
        ", finetune (" in said
        and f"`bertflow run CONFIG --only pretrain --only finetune --only report --set run_dir={runs}`"
        in said
    )

    earlier = runs / "pretrain" / stage_keys(cfg, earlier=True)["pretrain"]
    earlier.mkdir()  # a complete pretraining of an earlier release: the flow reuses it
    (earlier / "model").mkdir()
    (earlier / "model" / "config.json").write_text("{}")
    (earlier / "_COMPLETE.json").write_text('{"stage": "pretrain"}')
    shutil.rmtree(runs / "pretrain" / stage_keys(cfg)["pretrain"])
    check_flow_inputs(cfg, ["finetune"])


def test_only_the_main_pretraining_of_a_phased_config_names_the_missing_phase_input(tmp_path: Path) -> None:
    """A phase's stages go with their stage's `--only`: `--only pretrain` trains every phase, so it
    needs each phase's preprocessing."""
    from pipelines.flow_preflight import check_flow_inputs

    cfg = load_config(PROJECT_ROOT / "configs" / "cpu-hour.yaml", [f"run_dir={tmp_path / 'runs'}"])
    _mark_complete(cfg, "tokenizer", "preprocess@seq32")
    with pytest.raises(UserError) as exc:
        check_flow_inputs(cfg, ["pretrain"])
    said = str(exc.value)
    assert "no complete output for this config: preprocess (" in said and "seq32" not in said
    hint = f"`bertflow run {PROJECT_ROOT / 'configs' / 'cpu-hour.yaml'} --only preprocess --only pretrain --set run_dir="
    assert hint in said
    _mark_complete(cfg, "preprocess", "pretrain")
    check_flow_inputs(cfg, ["finetune"])  # the main phase's pretraining: its phase's is not read
    empty = load_config(PROJECT_ROOT / "configs" / "cpu-hour.yaml", [f"run_dir={tmp_path / 'other'}"])
    with pytest.raises(
        UserError, match=r"for this config: tokenizer \(.*\), preprocess@seq32 \(.*\), preprocess \("
    ):
        check_flow_inputs(empty, ["pretrain"])


def test_bertflow_run_refuses_missing_inputs_before_prefect_and_records_no_flow_run(tmp_path: Path) -> None:
    """`bertflow run CONFIG --only finetune` on an empty run dir: exit 2 and the one message, with
    Prefect unimportable (so no temporary server, no flow run); nothing written, so `bertflow runs`
    lists no flow run."""
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", "--only", "finetune",
         "--set", f"run_dir={runs}", "wandb.mode=disabled"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, env=env_forbidding(["prefect"]), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (
        "--only finetune needs stages that have no complete output for this config: tokenizer ("
        in proc.stderr
    )
    assert "Starting temporary server" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not runs.exists()


@pytest.mark.parametrize(
    "setting,said,fix",
    [
        (
            "pretrain.optimizer=muon",
            "pretrain.optimizer muon needs ZeRO stage 0; this run's is 2",
            "pretrain",
        ),
        (
            "phases.seq32.pretrain.optimizer=muon",
            "phase seq32: phases.seq32.pretrain.optimizer muon needs ZeRO stage 0; this run's is 2 (from "
            "infra/deepspeed/zero2.json)",
            "pretrain",  # the phase inherits the main section's ZeRO stage: that is the key to set
        ),
        (
            "phases.seq32.pretrain.optimizer=muon phases.seq32.pretrain.zero_stage=1",
            "phase seq32: phases.seq32.pretrain.optimizer muon needs ZeRO stage 0; this run's is 1 (from "
            "phases.seq32.pretrain.zero_stage)",
            "phases.seq32.pretrain",  # the phase's own: the main section's would not change it
        ),
    ],
)
def test_muon_at_a_zero_stage_it_cannot_use_is_refused_before_any_stage(
    tmp_path: Path, setting: str, said: str, fix: str
) -> None:
    """The ZeRO stage of every phase is resolved up front (2 ranks, the template's ZeRO 2): a flow
    does not tokenize and preprocess first and fail at pretraining. A phase's refusal names the
    settings the phase changes as the phase's: it said `pretrain.zero_stage` for a phase's own, so
    the fix it gave, followed, changed nothing."""
    refused = _cpu_hour_refusal(tmp_path / "runs", setting)
    assert said in refused and f"Fix: set {fix}.zero_stage: 0" in refused


@pytest.mark.parametrize(
    "setting,said",
    [
        ("pretrain.precision=fp16", "pretrain.precision fp16 needs a GPU"),
        ("pretrain.nnodes=2", "needs pretrain.master_addr and pretrain.master_port"),
        ("pretrain.deepspeed_config=TEMPLATE", "has an 'optimizer' section, which the run would ignore"),
        (
            "model.max_position_embeddings=64",
            "preprocess.max_seq_length 128 exceeds the model's 64 positions",
        ),
        (
            "finetune.tasks=[sst-2]",
            "--set finetune.tasks=[sst-2]: unknown task(s) 'sst-2' (did you mean sst2?)",
        ),
        (
            "finetune.max_seq_length=600",
            "finetune.max_seq_length 600 exceeds the 512 positions of the pretrained model",
        ),
        (
            "preprocess.max_predictions_per_seq=200",
            "preprocess.max_predictions_per_seq=200 exceeds the 125 maskable tokens",
        ),
        ("preprocess.runner=FooRunner", "preprocess.runner 'FooRunner' is not a Beam runner"),
        (
            "phases.seq32.preprocess.max_predictions_per_seq=40",
            "phase seq32: phases.seq32.preprocess.max_predictions_per_seq=40 exceeds the 29 maskable tokens of "
            "max_seq_length=32. "
            "Fix: set it to at most 29; about max_seq_length × masked_lm_prob positions are masked (5 here;",
        ),
        ("tokenizer.vocab=NO_MASK/vocab.txt", "the vocabulary lacks the special token [MASK]."),
        (
            "tokenizer.vocab=OTHER_VOCAB_MODEL/tokenizer/vocab.txt pretrain.init_from=OTHER_VOCAB_MODEL",
            "was trained with another vocabulary than",
        ),
        (
            "pretrain.init_from=ONE_TOKEN_TYPE",
            "the pretrained model has type_vocab_size 1, but the tasks ['mrpc', 'rte', 'stsb']",
        ),
        ("finetune.baselines=[random,NO_SUCH_MODEL]", "finetune.baselines: checkpoint directory"),
        ("finetune.baselines=[random,ONE_TOKEN_TYPE]", "finetune.baselines: checkpoint "),
    ],
)
def test_settings_that_would_fail_at_pretraining_or_fine_tuning_are_refused_before_any_stage(
    tmp_path: Path, setting: str, said: str
) -> None:
    """Not after the tokenizer, preprocessing (hours on a real corpus) and, for fine-tuning,
    pretraining have run."""
    template = tmp_path / "zero2_with_optimizer.json"
    template.write_text(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"}}))
    one_token_type = tmp_path / "one_token_type"  # a model without sentence-pair token types
    one_token_type.mkdir()
    shape = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
    (one_token_type / "config.json").write_text(
        json.dumps({"model_type": "bert", "vocab_size": 16384, "type_vocab_size": 1, **shape})
    )
    no_mask = tmp_path / "no_mask"  # a vocabulary without [MASK]
    no_mask.mkdir()
    (no_mask / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\nof\n")
    other_vocab = tmp_path / "other_vocab_model"  # a model whose vocab.txt orders the same tokens otherwise
    (other_vocab / "tokenizer").mkdir(parents=True)
    (other_vocab / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nof\n")
    (other_vocab / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nof\nthe\n")
    (other_vocab / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 7, **shape}))
    replaced = {
        "TEMPLATE": template,
        "ONE_TOKEN_TYPE": one_token_type,
        "NO_MASK": no_mask,
    }
    for name, path in (*replaced.items(), ("NO_SUCH_MODEL", tmp_path / "no_such_model")):
        setting = setting.replace(name, str(path))
    setting = setting.replace("OTHER_VOCAB_MODEL", str(other_vocab))
    refused = _cpu_hour_refusal(tmp_path / "runs", setting)
    assert said in refused and "Fix:" in refused


def test_a_flow_that_does_not_pretrain_is_not_refused_for_pretraining_settings(tmp_path: Path) -> None:
    """`--only verify` (or preprocess) of a GPU config on a CPU machine: fp16 is for the GPU."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "configs/default.yaml", "--only", "verify",
         "--set", f"run_dir={tmp_path / 'runs'}", "pretrain.precision=fp16", "wandb.mode=disabled"],
        capture_output=True, text=True, cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "runs" / "verify").is_dir()


def test_docs_config_md_is_the_schema_and_every_key_is_described() -> None:
    """docs/config.md is written from the schema; a key added without a description, or a schema
    change without regenerating the file, fails here."""
    from pipelines.config_reference import reference

    text = reference()
    undescribed = [line for line in text.splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not undescribed, f"schema fields without a description: {undescribed}"
    assert (PROJECT_ROOT / "docs" / "config.md").read_text() == text, (
        "docs/config.md is stale: python -m pipelines.config_reference > docs/config.md"
    )


@pytest.mark.parametrize("command,stage", [("preprocess", "tokenizer"), ("pretrain", "tokenizer")])
def test_a_stage_command_before_the_flow_made_its_input_says_which_stage_to_run(
    tmp_path: Path, command: str, stage: str
) -> None:
    """`bertflow preprocess CONFIG` before the tokenizer stage ran for CONFIG said "tokenizer file …
    does not exist. Fix: check the --vocab path", a flag nobody had given."""
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", command, "configs/default.yaml",
         "--set", f"run_dir={tmp_path / 'runs'}"],
        capture_output=True, text=True, cwd=PROJECT_ROOT,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"the flow has no complete {stage} output for this config" in proc.stderr
    assert (
        f"bertflow run configs/default.yaml --only {stage} --set run_dir={tmp_path / 'runs'}" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_yaml_control_character_is_one_message_and_merge_keys_are_not_repeats(tmp_path: Path) -> None:
    """PyYAML refuses a control character when its loader is built (a traceback once that moved out
    of the try), and two `<<:` merge keys in one mapping merge both anchors: not a repeated key."""
    from common.yamlfile import read_user_yaml

    bell = tmp_path / "bell.yaml"
    bell.write_text("name: a\x07b\n")
    with pytest.raises(UserError, match="is not valid YAML.*unacceptable character"):
        load_config(bell)
    merged = tmp_path / "merged.yaml"
    merged.write_text("a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: *a\n  <<: *b\n")
    assert read_user_yaml(merged, "task config")["c"] == {"x": 1, "y": 2}


def test_the_flow_preflight_skips_a_complete_preprocess_and_reads_tokenizer_vocab_with_its_casing(
    tmp_path: Path, minilm_dir: Path
) -> None:
    """Run-only preprocess settings (a runner this machine lacks) do not matter for shards the flow
    reuses; and a bare cased vocab.txt is read cased (tokenizer.lowercase), as the tokenizer stage
    reads it, when compared with a cased init_from."""
    from common.atomic import write_marker
    from pipelines.flow_preflight import check_flow_init_vocabulary, check_flow_preprocess
    from pipelines.stage_keys import stage_dir

    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", "preprocess.runner=mycorp.beam.ClusterRunner"])
    with pytest.raises(UserError, match="mycorp.beam.ClusterRunner"):
        check_flow_preprocess(cfg)
    write_marker(stage_dir(cfg, "preprocess"), {"stage": "preprocess"})
    check_flow_preprocess(cfg)

    init = tmp_path / "init"  # a cased model with its vocabulary
    init.mkdir()
    (init / "config.json").write_text((minilm_dir / "config.json").read_text())
    (init / "vocab.txt").write_text((minilm_dir / "vocab.txt").read_text())
    (init / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    bare = tmp_path / "vocab" / "vocab.txt"  # the same vocabulary, no tokenizer_config.json beside it
    bare.parent.mkdir()
    bare.write_text((minilm_dir / "vocab.txt").read_text())
    sets = [f"pretrain.init_from={init}", f"tokenizer.vocab={bare}"]
    check_flow_init_vocabulary(load_config(None, [*sets, "tokenizer.lowercase=false"]))
    with pytest.raises(UserError, match="another vocabulary.*lowercase False vs True"):
        check_flow_init_vocabulary(load_config(None, [*sets, "tokenizer.lowercase=true"]))


@pytest.mark.parametrize("key", ["tokenizer.input", "preprocess.input"])
def test_a_corpus_of_no_text_is_refused_by_the_flow_preflight(tmp_path: Path, key: str) -> None:
    """preprocess.input naming a binary file (/bin/ls copied as corpus.txt, a gzipped PNG) was
    refused only after the flow's tokenizer had trained on tokenizer.input: now `bertflow run`'s
    preflight refuses a corpus with no file of text (binary, or UTF-16) naming the file and the fix,
    by the first 8 KiB of each; a text file beside it, or an empty one, is as before."""
    import gzip

    from pipelines.flow_preflight import check_flow
    from pipelines.stage_plan import STAGES

    binary = tmp_path / "corpus.txt"
    binary.write_bytes(gzip.compress(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 200))
    wide = tmp_path / "a_wide.txt"  # the first file of the three
    wide.write_bytes("Some text. More text.\n".encode("utf-16"))
    (tmp_path / "empty.txt").touch()
    text = tmp_path / "text.txt"
    text.write_text("A sentence. Another one.\n")

    def check(*files: Path) -> None:
        listed = ",".join(map(str, files))
        check_flow(load_config(None, [f"run_dir={tmp_path / 'runs'}", f"{key}=[{listed}]"]), list(STAGES))

    with pytest.raises(
        UserError, match=rf"^{key}: {binary} is a binary file \(NUL bytes\), not text.*Fix: name"
    ) as refused:
        check(binary)
    assert f"not text: the run would find no document. Fix: name your text corpus in {key}: " in str(
        refused.value
    )
    with pytest.raises(
        UserError, match=rf"{key}: {wide} is UTF-16 text, not UTF-8 \(and no other file .*iconv"
    ) as refused:
        check(tmp_path / "empty.txt", wide, binary)
    assert f"`iconv -f UTF-16 -t UTF-8 {wide} > {tmp_path / 'a_wide.utf8.txt'}`" in str(refused.value)
    with pytest.raises(UserError, match=rf"{wide} is UTF-16 text, not UTF-8 \(and no other file of {key}"):
        check(wide, binary)  # two files
    check(binary, text)  # a binary file among text is skipped by the stage, and said (as before)
    bad_header = tmp_path / "more.txt.gz"  # gzip's magic, then no gzip: unopened, left to the stage
    bad_header.write_bytes(b"\x1f\x8b\x00 not a gzip header\n")
    check(binary, bad_header)
    check(tmp_path / "empty.txt")  # no file of text, none skipped either: the stages say it is empty
    if key == "preprocess.input":  # a phase's own corpus, named with its phase
        phase = f"phases=[{{name: a, preprocess: {{input: [{binary}]}}}}]"
        with pytest.raises(
            UserError, match=rf"^phase a: phases.a.preprocess.input: {binary} is a binary file"
        ):
            check_flow(load_config(None, [f"run_dir={tmp_path / 'runs'}", phase]), list(STAGES))
    assert not (tmp_path / "runs").exists()


def test_the_flow_preflight_compares_init_from_with_the_tokenizer_the_flow_trained(
    tmp_path: Path, minilm_dir: Path
) -> None:
    """Without tokenizer.vocab the pretraining reads the flow's trained tokenizer: once that is
    complete, one with another vocabulary than init_from's is refused before any stage runs."""
    from common.atomic import write_marker
    from pipelines.flow_preflight import check_flow_init_vocabulary
    from pipelines.stage_keys import stage_dir

    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text((minilm_dir / "config.json").read_text())
    (init / "vocab.txt").write_text((minilm_dir / "vocab.txt").read_text())
    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", f"pretrain.init_from={init}"])
    trained = stage_dir(cfg, "tokenizer")
    trained.mkdir(parents=True)
    tokens = (minilm_dir / "vocab.txt").read_text().splitlines()
    (trained / "vocab.txt").write_text("\n".join(tokens) + "\n")
    write_marker(trained, {"stage": "tokenizer"})
    check_flow_init_vocabulary(cfg)  # the same vocabulary
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
    (trained / "vocab.txt").write_text("\n".join(tokens) + "\n")
    with pytest.raises(UserError, match="another vocabulary .*token id 2000"):
        check_flow_init_vocabulary(cfg)
    # with phases, init_from starts the first one: the fix's stage commands make and train its shards
    phased = cfg.model_copy(update={"phases": [PhaseSection(name="short", pretrain={"max_steps": 5})]})
    assert stage_dir(phased, "tokenizer") == trained
    with pytest.raises(UserError) as exc:
        check_flow_init_vocabulary(phased)
    assert "`bertflow preprocess CONFIG --phase short --vocab" in str(exc.value), str(exc.value)
    assert "`bertflow pretrain CONFIG --phase short --tokenizer" in str(exc.value), str(exc.value)


def test_a_task_files_data_mistakes_are_refused_by_verify_before_compute(
    tmp_path: Path, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong column name, an empty dev file or a SQuAD file too small for its split was found
    only when its unit ran, after pretraining; verify reads each requested task's data as the
    units will, with their messages, and warns of a one-class dev set."""
    (tmp_path / "train.tsv").write_text("text\tsentiment\ngood\tpos\nbad\tneg\n")
    (tmp_path / "dev.tsv").write_text("text\tsentiment\nfine\tneg\n")
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "qa.json").write_text('{"data": []}')
    tasks = tmp_path / "tasks.yaml"
    body = ("{name}: {{format: tsv, kind: classification, train: train.tsv, dev: {dev}, text_a: {col}, "
            "label: sentiment, labels: [neg, pos], metrics: [accuracy]}}\n")  # fmt: skip
    tasks.write_text(
        body.format(name="ok", dev="dev.tsv", col="text")
        + body.format(name="wrongcol", dev="dev.tsv", col="sentence")
        + body.format(name="emptydev", dev="empty.tsv", col="text")
        + "qa: {format: squad, kind: span_extraction, train: qa.json, dev: qa.json, metrics: [exact_match, f1]}\n"
    )

    def verify(task: str) -> None:
        verify_data(load_config(None, [f"finetune.task_config={tasks}", f"finetune.tasks=[{task}]"]))

    for task, message in (
        ("wrongcol", "train.tsv line 1: header has no column 'sentence' (task 'wrongcol')"),
        ("emptydev", "task 'emptydev': " + str(tmp_path / "empty.tsv") + " is empty"),
        ("qa", "qa.json: squad_train_articles=38 leaves no article for evaluation (the file has 0)"),
    ):
        with pytest.raises(UserError, match=re.escape(message)):
            verify(task)
    with caplog.at_level(logging.WARNING, logger="bertflow.verify"):
        verify("ok")
    assert f"verify: task 'ok': every example of {tmp_path / 'dev.tsv'} has label 'neg'" in caplog.text
    # `--only finetune` runs no verify stage: `bertflow run`'s preflight reads them instead (until
    # 2026-11-28 the units found them, after the worker pool started, and the flow exited 1)
    from pipelines.flow_preflight import check_flow

    cfg = load_config(
        None, [f"run_dir={tmp_path / 'runs'}", f"finetune.task_config={tasks}", "finetune.tasks=[wrongcol]"]
    )
    with pytest.raises(UserError, match=re.escape("train.tsv line 1: header has no column 'sentence'")):
        check_flow(cfg, ["finetune"])
    assert not (tmp_path / "runs").exists()
    check_flow(cfg, ["tokenizer"])  # a flow run that does not fine-tune does not read them


@pytest.mark.parametrize(
    "item, named",
    [
        ("finetune.seeds=[1,2,1]", "finetune.seeds: 1 is listed twice"),
        ("finetune.lrs=[1e-3,0.001]", "finetune.lrs: 0.001 is listed twice"),
        ("finetune.tasks=rte,mrpc,rte", "finetune.tasks: 'rte' is listed twice"),
        ("finetune.baselines=[random,random]", "finetune.baselines: 'random' is listed twice"),
    ],
)
def test_a_finetune_list_entry_given_twice_is_refused(item, named):
    """seeds: [1, 1] ran one unit and the scorecard counted it twice, 'seeds 1, 1' with a spread of
    ±0.0, which narrows the seed-noise margin a Δ row is judged by; a repeated task or lr the same.
    Refused, naming the key and the entry."""
    with pytest.raises(UserError, match=re.escape(named) + ": list each once"):
        load_config(PROJECT_ROOT / "configs" / "default.yaml", [item])
    assert load_config(
        PROJECT_ROOT / "configs" / "default.yaml", ["finetune.seeds=[1,2]"]
    ).finetune.seeds == [1, 2]


def test_a_warmup_longer_than_the_run_is_refused():
    """`--set pretrain.max_steps=20` on the default config (warmup_steps 30) trained every step
    below pretrain.lr, ending at 67% of it, unsaid. Refused, naming both settings; a phase that
    inherits the main section's warmup too. A warmup left at its default is not checked (quick runs)."""
    default = PROJECT_ROOT / "configs" / "default.yaml"
    with pytest.raises(UserError, match=r"pretrain\.warmup_steps: 30 exceeds max_steps 20: .* 66\.7% of lr"):
        load_config(default, ["pretrain.max_steps=20"])
    with pytest.raises(UserError, match=r"phases\.short\.pretrain\.warmup_steps: 30 exceeds max_steps 10"):
        load_config(default, ["phases=[{name: short, pretrain: {max_steps: 10}}]"])
    assert load_config(default, ["pretrain.max_steps=30"]).pretrain.warmup_steps == 30
    assert load_config(None, ["pretrain.max_steps=5"]).pretrain.max_steps == 5
    from training.config import PretrainConfig  # a run made so before is still read (run_spec.json)

    recorded = PretrainConfig.model_validate(
        {"max_steps": 8, "warmup_steps": 1000}, context={"recorded": True}
    )
    assert recorded.warmup_steps == 1000


def test_a_set_item_breaking_a_rule_between_two_settings_is_named(tmp_path: Path) -> None:
    """`--set pretrain.max_steps=3` on the default config (warmup_steps 30) was said as "config file
    configs/default.yaml is invalid": the file alone runs. The message names the --set item with the
    file (the rule is between the two); the file alone when no --set item takes part."""
    default = PROJECT_ROOT / "configs" / "default.yaml"
    with pytest.raises(UserError) as exc:
        load_config(default, ["pretrain.max_steps=3", "pretrain.lr=1e-3"])
    assert str(exc.value).startswith(f"config file {default} with --set pretrain.max_steps=3 is invalid: ")
    with pytest.raises(UserError) as exc:  # both settings of the rule from --set: the file is not at fault
        load_config(default, ["pretrain.max_steps=3", "pretrain.warmup_steps=5"])
    assert str(exc.value).startswith("--set pretrain.max_steps=3 --set pretrain.warmup_steps=5 is invalid: ")
    bad = _write(tmp_path, "pretrain:\n  max_steps: 3\n  warmup_steps: 5\n")
    with pytest.raises(UserError) as exc:
        load_config(bad, ["pretrain.lr=1e-3"])
    assert str(exc.value).startswith(f"config file {bad} is invalid: pretrain.warmup_steps: 5 exceeds")
    # a phase inherits the main section's warmup: the --set of the main section's setting is named
    phased = _write(
        tmp_path, "pretrain:\n  max_steps: 40\nphases:\n  - name: short\n    pretrain:\n      max_steps: 10\n"
    )
    with pytest.raises(UserError) as exc:
        load_config(phased, ["pretrain.warmup_steps=30"])
    assert str(exc.value).startswith(f"config file {phased} with --set pretrain.warmup_steps=30 is invalid: ")
    # the other rules between settings load_config checks
    with pytest.raises(UserError) as exc:
        load_config(default, ["model.preset=null"])
    assert str(exc.value).startswith(
        f"config file {default} with --set model.preset=null: model.preset is null"
    )
    for item, said in (
        ("phases=[{name: a}, {name: a}]", "two pretraining phases are named 'a'"),
        ("phases=[{name: a, pretrain: {init_from: x}}]", "phases.a.pretrain.init_from: a phase starts"),
    ):
        with pytest.raises(UserError) as exc:
            load_config(default, [item])
        assert str(exc.value).startswith(f"--set {item}: {said}"), str(exc.value)


def _pasted(hint: str) -> list:
    """Each `bertflow ...` command in a hint, as the CLI parses it when pasted into a shell."""
    import shlex

    from pipelines.cli import build_parser

    commands = re.findall(r"`(bertflow [^`]+)`|: (bertflow .+)$", hint)
    words = [shlex.split(a or b) for a, b in commands]
    return [build_parser(w[1]).parse_args(w[1:]) for w in words]


def test_a_fix_hint_pasted_runs_this_config_with_its_set_items(tmp_path: Path) -> None:
    """The hints that name a command to run said `bertflow run CONFIG ...` without the user's
    --set items: pasted, they ran a config file named CONFIG, and the --set items left out gave
    other stage keys (another run). They now name the config file and every --set item, quoted
    for a shell; parsed by the CLI and loaded, the command's config has this config's keys."""
    from pipelines.flow_preflight import check_flow_inputs
    from pipelines.stage_keys import code_change_note, flow_input, stage_keys, with_phase_init
    from training.preflight import own_tokenizer_fix

    items = [f"run_dir={tmp_path / 'my runs'}", "finetune.tasks=[sst2, mrpc]", "pretrain.lr=0.0005"]
    cfg = load_config(PROJECT_ROOT / "configs" / "cpu-hour.yaml", items)
    keys = stage_keys(cfg)

    def same_config(args, phase: str | None = None) -> bool:
        pasted = load_config(args.config, args.overrides if args.command == "run" else args.set)
        return stage_keys(pasted.phase_config(pasted.phase_index(phase))) == stage_keys(
            cfg.phase_config(cfg.phase_index(phase))
        )

    with pytest.raises(UserError) as exc:
        check_flow_inputs(cfg, ["pretrain"])
    only, whole = _pasted(str(exc.value))
    assert only.only == ["tokenizer", "preprocess", "pretrain"] and whole.only is None
    assert same_config(only) and same_config(whole)
    with pytest.raises(UserError) as exc:
        flow_input(cfg, tmp_path / "none", "tokenizer", "--vocab")
    [run] = _pasted(str(exc.value))
    assert run.only == ["tokenizer"] and same_config(run)
    with pytest.raises(UserError) as exc:
        with_phase_init(cfg)
    pretrain, preprocess, whole = _pasted(str(exc.value))
    assert (pretrain.command, preprocess.command, whole.command) == ("pretrain", "preprocess", "run")
    assert all(same_config(args, "seq32") for args in (pretrain, preprocess)) and same_config(whole)
    assert pretrain.phase == preprocess.phase == "seq32"  # the phase whose model is missing
    out = tmp_path / "old"
    out.mkdir()
    (out / "_COMPLETE.json").write_text('{"stage": "pretrain"}')  # made before code was recorded
    [force] = _pasted(code_change_note("pretrain", [out], cfg=cfg))
    assert force.force == ["pretrain"] and same_config(force)
    [force] = _pasted(code_change_note("pretrain@seq32", [out], cfg=cfg))  # a phase's: no such --force
    assert force.force == ["pretrain"] and same_config(force)
    init = tmp_path / "init"
    init.mkdir()
    (init / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    # init_from starts the first phase: its stage commands name it (without --phase: the main one)
    _, preprocess, pretrain = _pasted(own_tokenizer_fix(init, cfg.phase_config(0)))  # (first: `run`)
    assert (preprocess.vocab, pretrain.tokenizer) == (str(init), str(init))
    assert preprocess.phase == pretrain.phase == "seq32"
    assert same_config(preprocess, "seq32") and same_config(pretrain, "seq32")
    _, preprocess, pretrain = _pasted(own_tokenizer_fix(init, cfg.model_copy(update={"phases": []})))
    assert preprocess.phase is None and pretrain.phase is None  # a config without phases: the main one
    assert keys == stage_keys(cfg)
    # a config built in code has no file to name: the hint keeps the placeholder
    assert code_change_note("pretrain", [out]).endswith("bertflow run CONFIG --force pretrain")


def test_a_flow_whose_tokenizer_and_preprocess_read_other_files_says_so(tmp_path: Path) -> None:
    """A user who sets preprocess.input to their corpus and leaves tokenizer.input as it was had a
    vocabulary trained on the default Wikipedia summaries, unsaid (a CJK corpus: 80.6% [UNK] after
    the fact; an English one of another domain: nothing at all). The flow says so before it trains."""
    from pipelines.flow_preflight import corpus_mismatch_note

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("One sentence. Two sentences.\n")
    (corpus / "b.txt").write_text("Three sentences. Four.\n")
    note = corpus_mismatch_note(load_config(None, [f"preprocess.input=[{corpus}]"]))
    assert note is not None and note.startswith("tokenizer.input ['data:wiki/summaries_en.txt'] and ")
    assert f"preprocess.input ['{corpus}'] share no file" in note and "set tokenizer.input" in note
    both = [f"preprocess.input=[{corpus}]", f"tokenizer.input=[{corpus / 'a.txt'}]"]  # a sample: fine
    assert corpus_mismatch_note(load_config(None, both)) is None
    assert (
        corpus_mismatch_note(load_config(None, [f"preprocess.input=[{corpus}]", "tokenizer.vocab=v.txt"]))
        is None
    )
    # a phase's own corpus counts too: the main phase reads the tokenizer's files, phase a others
    note = corpus_mismatch_note(
        load_config(None, [f"phases=[{{name: a, preprocess: {{input: [{corpus}]}}}}]"])
    )
    assert note is not None and f"preprocess.input ['{corpus}'] share no file" in note
    # a preprocess.input that matches no file yet: nothing to compare (the stage says it is empty)
    assert corpus_mismatch_note(load_config(None, [f"preprocess.input=[{tmp_path / 'none*.txt'}]"])) is None
    # a corpus on an object store is not read here (its stage checks it)
    from pipelines.flow_preflight import check_corpus_is_text

    check_corpus_is_text(["gs://no-such-bucket/corpus.txt"], None, "preprocess.input")


def test_a_stage_commands_flags_as_set_items_read_back_as_the_flags_values(tmp_path: Path) -> None:
    """Every stage command's hint names its flow command with its flags as --set items, made by
    one helper (`flag_items`; pretrain, finetune and tokenizer/preprocess had one each): read back
    by --set, each item is the flag's value; a string as typed when that reads back as it, JSON
    when not (`yes` would be true); with a phase, its preprocess and pretrain settings as its own."""
    from pipelines.config import flag_items

    settings = {
        "model.preset": "mini",
        "pretrain.max_steps": 7,
        "preprocess.num_shards": 2,
        "tokenizer.vocab": "/my data/vocab.txt",
        "tokenizer.lowercase": False,
        "name": "yes",
        "finetune.lrs": [5e-05, 3e-05],
    }
    items = flag_items(settings, "seq32")
    assert items[:4] == [
        "model.preset=mini",
        "phases.seq32.pretrain.max_steps=7",
        "phases.seq32.preprocess.num_shards=2",
        "tokenizer.vocab=/my data/vocab.txt",
    ]
    assert items[5] == 'name="yes"'
    (config := tmp_path / "c.yaml").write_text("phases: [{name: seq32}]\n")
    cfg = load_config(config, items)
    main, phase = cfg, cfg.phase_config(0)
    assert (main.model.preset, main.tokenizer.vocab, main.tokenizer.lowercase, main.name) == (
        "mini",
        "/my data/vocab.txt",
        False,
        "yes",
    )
    assert (phase.pretrain.max_steps, phase.preprocess.num_shards, main.finetune.lrs) == (
        7,
        2,
        [5e-05, 3e-05],
    )
    assert main.pretrain.max_steps != 7 and main.preprocess.num_shards != 2  # the phase's, not the main one's


@pytest.mark.parametrize("text", ["", "# my settings, to be written\n", "{}  # to be written\n"])
def test_an_empty_config_file_is_refused_not_run_as_the_defaults(tmp_path: Path, text: str) -> None:
    """An empty config file (or only comments) would run every built-in default, as config 'default'."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(
        UserError, match=rf"config file {re.escape(str(path))} holds no settings .*Fix: write"
    ):
        load_config(str(path))


def test_every_error_of_a_phase_names_it_by_its_name() -> None:
    """Two errors in one phase: each says `phases.a.`, as --set names it, not pydantic's `phases.0.`."""
    with pytest.raises(UserError) as err:
        load_config(None, ["phases=[{name: a, preprocess: 5, pretrain: 6}]"])
    assert "phases.a.preprocess: Input should be" in str(err.value)
    assert "phases.a.pretrain: Input should be" in str(err.value) and "phases.0" not in str(err.value)
