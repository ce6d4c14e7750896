"""Stage keys: a change recomputes exactly the stages downstream of it; nothing else moves."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from common.errors import UserError
from common.fingerprint import content_stamp, digest
from common.paths import PROJECT_ROOT, user_cache_dir
from pipelines.config import load_config
from pipelines.stage_keys import STAGES, base_stage, stage_dir, stage_dirs, stage_key_inputs, stage_keys
from pipelines.stage_plan import plan_stages

DOWNSTREAM = {
    "tokenizer": {"tokenizer", "preprocess", "pretrain", "finetune", "report"},
    "preprocess": {"preprocess", "pretrain", "finetune", "report"},
    "pretrain": {"pretrain", "finetune", "report"},
    "finetune": {"finetune", "report"},
    "report": {"report"},
}


def _changed(a: dict[str, str], b: dict[str, str]) -> set[str]:
    return {s for s in STAGES if a[s] != b[s]}


def test_keys_are_stable_and_dict_order_free(tmp_path: Path) -> None:
    one = load_config(None, [f"run_dir={tmp_path}", "pretrain.max_steps=5", "finetune.epochs=1"])
    two = load_config(None, [f"run_dir={tmp_path}", "finetune.epochs=1", "pretrain.max_steps=5"])
    assert stage_keys(one) == stage_keys(two)
    assert stage_dir(one, "pretrain") == tmp_path / "pretrain" / stage_keys(one)["pretrain"]
    # the same YAML with its keys in another order: sections, settings and a phase's changes
    # (dicts that keep the file's order: they reach the stage keys as they were written)
    (tmp_path / "a.yaml").write_text(
        f"name: a\nrun_dir: {tmp_path}\npretrain: {{max_steps: 5, lr: 0.001}}\nphases:\n"
        "  - name: p1\n    preprocess: {max_seq_length: 32, max_predictions_per_seq: 5}\n"
        "    pretrain: {max_steps: 3, lr: 0.002}\n"
    )
    (tmp_path / "b.yaml").write_text(
        "phases:\n  - pretrain: {lr: 0.002, max_steps: 3}\n"
        "    preprocess: {max_predictions_per_seq: 5, max_seq_length: 32}\n    name: p1\n"
        f"pretrain: {{lr: 0.001, max_steps: 5}}\nrun_dir: {tmp_path}\nname: a\n"
    )
    a, b = load_config(str(tmp_path / "a.yaml")), load_config(str(tmp_path / "b.yaml"))
    assert list(a.phases[0].pretrain) != list(b.phases[0].pretrain)
    assert stage_keys(a) == stage_keys(b)
    assert digest({"a": 1, "b": {"c": 2, "d": 3}}) == digest({"b": {"d": 3, "c": 2}, "a": 1})


@pytest.mark.parametrize(
    "override,stage",
    [
        ("tokenizer.vocab_size=4000", "tokenizer"),
        ("preprocess.dupe_factor=2", "preprocess"),
        ("pretrain.max_steps=7", "pretrain"),
        ("model.hidden_dropout_prob=0.2", "pretrain"),
        ("finetune.epochs=1.5", "finetune"),
        ("finetune.tasks=[rte]", "finetune"),
        ("report.title=other", "report"),
    ],
)
def test_a_change_moves_exactly_the_downstream_keys(override: str, stage: str) -> None:
    base = stage_keys(load_config(None))
    changed = _changed(base, stage_keys(load_config(None, [override])))
    # the data check re-runs when the set of files it checks changes (corpus, task list)
    expected = DOWNSTREAM[stage] | ({"verify"} if "tasks" in override else set())
    assert changed == expected, override


# one value other than the default for every run-only setting (Section.run_only)
RUN_ONLY_CHANGES = {
    "preprocess": ["workers=7", "runner=SparkRunner", "beam_options=[--max_num_workers=3]"],
    "pretrain": [
        "log_every=3", "eval_every=7", "checkpoint_every=9", "keep_checkpoints=5", "prefetch_batches=2",
        "peak_tflops=100", "dist_timeout_s=1200", "master_port=29555", "master_addr=node-001",
        "data_cache_dir=/tmp/cache", "launcher=deepspeed", "stop_grace_s=30",
    ],
    "finetune": ["concurrency=5", "units_per_gpu=4", "save_models=all"],
}  # fmt: skip


def test_run_only_settings_keep_every_key_and_nothing_else_does() -> None:
    base = load_config(None)
    listed = {section: {c.split("=")[0] for c in changes} for section, changes in RUN_ONLY_CHANGES.items()}
    for section, names in listed.items():  # the list above covers every run-only setting
        assert names == set(type(getattr(base, section)).run_only), section
    for section, changes in RUN_ONLY_CHANGES.items():
        for change in changes:
            changed = load_config(None, [f"{section}.{change}"])
            assert getattr(changed, section) != getattr(base, section)  # the override took
            assert stage_keys(changed) == stage_keys(base), change
    # a setting that changes what the stage reports is not run-only: it moves the key
    eval_size = stage_keys(load_config(None, ["pretrain.eval_batches=3"]))
    assert _changed(stage_keys(base), eval_size) == DOWNSTREAM["pretrain"]


def test_outputs_made_before_run_only_settings_left_the_keys_are_found(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}"])
    earlier = stage_keys(cfg, earlier=True)
    assert earlier["pretrain"] != stage_keys(cfg)["pretrain"]
    made_then = tmp_path / "pretrain" / earlier["pretrain"]
    made_then.mkdir(parents=True)  # a finished or half-done pretraining of an older bertflow
    assert stage_dir(cfg, "pretrain") == made_then
    assert stage_dir(cfg, "finetune") == tmp_path / "finetune" / stage_keys(cfg)["finetune"]  # none then
    # with another run-only value the earlier key (which held it) differs: a new output
    other = load_config(None, [f"run_dir={tmp_path}", "pretrain.log_every=3"])
    assert stage_dir(other, "pretrain") == tmp_path / "pretrain" / stage_keys(cfg)["pretrain"]
    # a run-only setting added since (RUN_ONLY_SINCE) was in no earlier key
    newer = load_config(None, [f"run_dir={tmp_path}", "pretrain.stop_grace_s=30"])
    assert stage_dir(newer, "pretrain") == made_then
    # once an output has the current key, it is the one (also while another stage has outputs,
    # so that stage_dirs looks for earlier keys at all)
    (tmp_path / "pretrain" / stage_keys(cfg)["pretrain"]).mkdir()
    (tmp_path / "finetune").mkdir()
    assert stage_dir(cfg, "pretrain") == tmp_path / "pretrain" / stage_keys(cfg)["pretrain"]


def test_a_setting_added_later_is_in_a_key_only_once_it_is_set() -> None:
    """`Section.added_later` (pretrain.muon_lr, 2026-11-25): at its default it is in no key, so
    outputs made before it existed are found after an upgrade; set, it moves the keys downstream."""
    base = load_config(None)
    assert "muon_lr" not in stage_key_inputs(base)["pretrain"]["config"]
    assert "global_batch_size" not in stage_key_inputs(base)["pretrain"]["config"]  # 2026-11-26
    assert "muon_lr" not in stage_key_inputs(base, earlier=True)["pretrain"]["config"]
    changed = stage_keys(load_config(None, ["pretrain.muon_lr=0.02"]))
    assert _changed(stage_keys(base), changed) == DOWNSTREAM["pretrain"]
    assert stage_keys(load_config(None, ["pretrain.muon_lr=0.01"])) == stage_keys(
        base
    )  # the default, spelled out
    # finetune.threads (run-only until 2026-11-27: torch's float sums depend on it): the units and
    # scorecards made before keep their keys; a set count is a new fine-tuning
    assert "threads" not in stage_key_inputs(base)["finetune"]["config"]
    threads = stage_keys(load_config(None, ["finetune.threads=2"]))
    assert _changed(stage_keys(base), threads) == DOWNSTREAM["finetune"]
    assert stage_keys(load_config(None, ["finetune.threads=1"])) == stage_keys(base)  # null's count on CPU


def test_corpus_content_is_part_of_the_key_and_its_mtime_is_not(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A first sentence. A second one.\n")
    overrides = [f"tokenizer.input=[{corpus}]", f"preprocess.input=[{corpus}]"]
    before = stage_keys(load_config(None, overrides))
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # copied again, touched
    assert stage_keys(load_config(None, overrides)) == before
    corpus.write_text("A first sentence. A second one!\n")  # same size, other bytes
    after = stage_keys(load_config(None, overrides))
    assert _changed(before, after) == DOWNSTREAM["tokenizer"] | {"verify"}


def test_files_read_by_content_move_their_stage_and_downstream_when_edited_in_place(tmp_path: Path) -> None:
    """A DeepSpeed JSON, a given vocab.txt and init_from's weights edited or retrained at the same
    path: the stages that read them recompute, not reuse the output made from the old content."""
    deepspeed = tmp_path / "zero2.json"
    deepspeed.write_text((PROJECT_ROOT / "infra" / "deepspeed" / "zero2.json").read_text())
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text('{"model_type": "bert"}')
    (init / "model.safetensors").write_bytes(b"weights of the first training")
    sets = [
        f"pretrain.deepspeed_config={deepspeed}",
        f"tokenizer.vocab={vocab}",
        f"pretrain.init_from={init}",
    ]
    before = stage_keys(load_config(None, sets))
    deepspeed.write_text(deepspeed.read_text().replace("{", '{"prescale_gradients": true, ', 1))
    edited = stage_keys(load_config(None, sets))
    assert _changed(before, edited) == DOWNSTREAM["pretrain"]
    (init / "model.safetensors").write_bytes(b"weights of another training")  # retrained in place
    retrained = stage_keys(load_config(None, sets))
    assert _changed(edited, retrained) == DOWNSTREAM["pretrain"]
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nand\n")  # a token added
    assert _changed(retrained, stage_keys(load_config(None, sets))) == DOWNSTREAM["tokenizer"]


def test_with_checksums_an_edited_checksum_file_is_verified_again(tmp_path: Path) -> None:
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("0" * 64 + "  wiki/summaries_en.txt\n")
    sets = ["verify.checksums=true", f"verify.checksum_file={sums}"]
    before = stage_keys(load_config(None, sets))
    sums.write_text("1" * 64 + "  wiki/summaries_en.txt\n")
    assert _changed(before, stage_keys(load_config(None, sets))) == {"verify"}


def test_an_edited_task_file_moves_the_scorecards_key_as_it_moves_the_units(tmp_path: Path) -> None:
    """An edited dev TSV gave its units new keys (retrained) while the finetune stage, the
    scorecard, kept its key and was reused with the old scores; now both move, and the report."""
    (tmp_path / "tasks.yaml").write_text(
        f"movies:\n  format: tsv\n  kind: classification\n  train: {tmp_path / 'train.tsv'}\n"
        f"  dev: {tmp_path / 'dev.tsv'}\n  text_a: review\n  label: polarity\n  labels: [neg, pos]\n"
        "  metrics: [accuracy]\n"
    )
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("review\tpolarity\ngood film\tpos\n")
    sets = ["finetune.tasks=[movies]", f"finetune.task_config={tmp_path / 'tasks.yaml'}"]
    before = stage_keys(load_config(None, sets))
    (tmp_path / "dev.tsv").write_text("review\tpolarity\nbad film\tneg\n")
    # and the verify stage: a task file damaged after a verified run is verified again
    assert _changed(before, stage_keys(load_config(None, sets))) == DOWNSTREAM["finetune"] | {"verify"}


def test_a_data_root_moved_keeps_the_pretraining_and_a_renamed_file_does_not(tmp_path: Path) -> None:
    def keys(data_root: Path) -> dict[str, str]:
        corpus = "[data:corpus/*.txt]"
        sets = [f"data_root={data_root}", f"tokenizer.input={corpus}", f"preprocess.input={corpus}"]
        return stage_keys(load_config(None, sets))

    first, moved = tmp_path / "disk1", tmp_path / "disk2" / "data"
    for root in (first, moved):
        (root / "corpus").mkdir(parents=True)
        (root / "corpus" / "a.txt").write_text("A first sentence. A second one.\n")
        (root / "corpus" / "b.txt").write_text("Another document. With two sentences.\n")
    # documents are named by label (a.txt:0), as in the shards' manifest; the fine-tuning data moved
    assert _changed(keys(first), keys(moved)) == {"verify", "finetune", "report"}
    (moved / "corpus" / "b.txt").rename(moved / "corpus" / "c.txt")  # other document names
    assert _changed(keys(first), keys(moved)) == DOWNSTREAM["tokenizer"] | {"verify"}


def test_the_suite_keeps_out_of_the_users_cache() -> None:
    """conftest points the per-user cache at a temporary folder: the tmp corpora the tests stamp
    would otherwise leave their file-hash memos in the user's ~/.cache/bertflow for good."""
    assert user_cache_dir().is_relative_to(tempfile.gettempdir())
    assert not user_cache_dir().is_relative_to(Path.home() / ".cache")


def test_a_file_version_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text\n")
    first = content_stamp(corpus)
    assert first["sha256"] == hashlib.sha256(b"text\n").hexdigest()
    (memo,) = (tmp_path / "cache").rglob("*/file_sha256/*/*")
    memo.write_text("f" * 64)  # what was remembered is what a second stamp reports: no re-read
    assert content_stamp(corpus)["sha256"] == "f" * 64
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a new version is read again
    assert content_stamp(corpus) == first


def test_stage_selection() -> None:
    assert plan_stages(None, None, None) == (list(STAGES), set())
    assert plan_stages("pretrain", None, None) == (["pretrain"], set())
    assert plan_stages(None, "finetune", ["tokenizer"]) == (list(STAGES), {"tokenizer", "finetune", "report"})
    with pytest.raises(UserError, match="unknown stage"):
        plan_stages("pretraining", None, None)
    with pytest.raises(UserError, match="exclude"):
        plan_stages("report", "report", None)
    assert plan_stages("pretrain", None, ["pretrain"]) == (["pretrain"], {"pretrain"})
    with pytest.raises(
        UserError, match="--force pretrain with --only finetune: a forced stage that does not run"
    ):
        plan_stages("finetune", None, ["pretrain"])  # was accepted, and nothing recomputed
    # --only is repeatable (a second one replaced the first): the stages run in the flow's order
    assert plan_stages(["preprocess", "tokenizer"], None, ["tokenizer"]) == (
        ["tokenizer", "preprocess"],
        {"tokenizer"},
    )
    with pytest.raises(UserError, match="--force report with --only tokenizer --only preprocess"):
        plan_stages(["tokenizer", "preprocess"], None, ["report"])


@pytest.mark.parametrize("earlier", [False, True], ids=["explicit", "explicit-before-run-only"])
@pytest.mark.parametrize(
    "path,spelled_out",
    [
        ("default.yaml", ["pretrain.num_processes=2"]),
        ("cpu-hour.yaml", ["pretrain.num_processes=2", "phases.seq32.pretrain.global_batch_size=null"]),
        ("bert-base-gpu.yaml", ["pretrain.num_processes=8", "pretrain.gradient_accumulation_steps=4"]),
    ],
)
def test_outputs_of_the_shipped_configs_from_before_num_processes_auto_are_found(
    tmp_path: Path, path: str, spelled_out: list[str], earlier: bool
) -> None:
    """The shipped configs spelled out ranks, micro batch and accumulation before 2026-11-26 (2 CPU
    ranks; 8 GPUs for the GPU configs); their pretraining (every phase) is found after the upgrade,
    also one made before 2026-11-25 (`earlier`: keyed with the run-only settings)."""
    shipped = PROJECT_ROOT / "configs" / path
    now = load_config(shipped, [f"run_dir={tmp_path}"])
    before = load_config(shipped, [f"run_dir={tmp_path}", "pretrain.global_batch_size=null", *spelled_out])
    stages = [s for s in stage_keys(now) if base_stage(s) == "pretrain"]
    old, new = stage_keys(before, earlier=earlier), stage_keys(now)
    assert all(old[s] != new[s] for s in stages)  # the keys did change
    for s in stages:
        (tmp_path / "pretrain" / old[s]).mkdir(parents=True)
    dirs = stage_dirs(now)
    assert {s: dirs[s] for s in stages} == {s: tmp_path / "pretrain" / old[s] for s in stages}


def test_a_hostfile_enters_the_key_by_its_ranks_not_its_hosts(tmp_path: Path) -> None:
    """A multi-node run requeued onto other nodes (another hostfile, same slots) is the same run
    and resumes; it used to get a new key and start from step 0. Outputs keyed by the hostfile's
    path and content (before 2026-11-27) are found."""
    from pipelines.stage_keys import stage_dirs

    def hostfile(name: str, hosts: list[str], slots: int = 8) -> str:
        path = tmp_path / name
        path.write_text("".join(f"{h} slots={slots}\n" for h in hosts))
        return f"pretrain.hostfile={path}"

    runs = f"run_dir={tmp_path / 'runs'}"
    first = stage_keys(load_config(None, [runs, hostfile("a", ["gpu-1", "gpu-2"])]))
    requeued = stage_keys(load_config(None, [runs, hostfile("b", ["gpu-7", "gpu-9"])]))
    assert requeued == first
    bigger = stage_keys(load_config(None, [runs, hostfile("c", ["gpu-1", "gpu-2"], slots=4)]))
    assert _changed(first, bigger) == DOWNSTREAM["pretrain"]  # other ranks: another run
    assert stage_keys(load_config(None, [runs])) != first
    # made by the previous version, keyed by path and content: still found
    cfg = load_config(None, [runs, hostfile("a", ["gpu-1", "gpu-2"])])
    before = stage_keys(cfg, hostfile_by_file=True)
    made_then = tmp_path / "runs" / "pretrain" / before["pretrain"]
    made_then.mkdir(parents=True)
    assert before["pretrain"] != first["pretrain"] and stage_dirs(cfg)["pretrain"] == made_then


def test_the_default_configs_keys_are_those_its_outputs_were_made_under(
    tmp_path: Path, data_dir: Path
) -> None:
    """The tokenizer, shards and pretraining of `make run` keep their keys (they name its outputs
    on disk; these depend on the settings and the corpus' content, not on where the data lives).
    A change to the key recipe would orphan every user's finished outputs: if this fails on
    purpose, make `stage_dirs` find the old keys (as `explicit_layouts` and `earlier` do) and then
    update the values here."""
    keys = stage_keys(load_config(PROJECT_ROOT / "configs" / "default.yaml", [f"run_dir={tmp_path}"]))
    made_under = {"tokenizer": "f8329824db9a", "preprocess": "02f8976d9d95", "pretrain": "16d81b4ccba1"}
    assert {stage: keys[stage] for stage in made_under} == made_under


def test_with_phases_fine_tuning_follows_the_main_phases_pretraining() -> None:
    """The fine-tuning and report keys hold the main phase's pretraining key (the model they read),
    not an earlier phase's: a change to the main phase alone moves them, and not the earlier phase."""
    phased = "phases=[{name: a, pretrain: {max_steps: 10}}]"
    base = stage_keys(load_config(None, [phased]))
    changed = _changed(base, stage_keys(load_config(None, [phased, "pretrain.max_steps=7"])))
    assert changed == {"pretrain", "finetune", "report"}, changed


def test_with_phases_the_data_check_follows_the_main_phases_corpus(tmp_path: Path) -> None:
    """The verify stage checks the main phase's corpus (and each earlier phase's): a change to the
    main phase's alone moves its key, as it moves the main preprocessing's."""
    corpus, other = tmp_path / "c.txt", tmp_path / "d.txt"
    corpus.write_text("One sentence. Two sentences.\n")
    other.write_text("Three sentences. Four.\n")
    phased = f"phases=[{{name: a, preprocess: {{input: [{corpus}]}}}}]"
    base = stage_keys(load_config(None, [phased]))
    changed = _changed(base, stage_keys(load_config(None, [phased, f"preprocess.input=[{other}]"])))
    assert {"verify", "preprocess"} <= changed, changed


def test_a_pretraining_without_its_model_is_not_complete_in_a_phase_either(tmp_path: Path) -> None:
    """The flow writes a deleted model/ again from the last checkpoint: a pretraining output, the
    main one's or a phase's (pretrain@NAME), is complete only with its model."""
    from pipelines.stage_keys import complete

    out = tmp_path / "pretrain"
    out.mkdir()
    (out / "_COMPLETE.json").write_text('{"stage": "pretrain"}')
    assert not complete("pretrain", out) and not complete("pretrain@a", out)
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("{}")
    assert complete("pretrain", out) and complete("pretrain@a", out)
