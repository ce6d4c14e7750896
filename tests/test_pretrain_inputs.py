"""Bad input to `bertflow pretrain`: one clear UserError before any process starts, nothing written."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.atomic import sha256_file, write_marker
from common.errors import UserError
from common.paths import PROJECT_ROOT
from pipelines.config import load_config
from pipelines.flow_preflight import check_flow_init_vocabulary
from pipelines.stage_pretrain import run_pretrain_stage
from preprocessing import shard_format
from tests.pretrain_runs import cli_env, config, settings
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from training import checkpoint, preflight


@pytest.fixture(scope="module")
def data(tmp_path_factory, minilm_dir, data_dir):
    root = tmp_path_factory.mktemp("inputs")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    return make_shards(root / "shards", tok, data_dir, num_docs=120), tok


def _snapshot(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else {}


def _fails(cfg, shards, tok, out, match):
    before = _snapshot(out)
    with pytest.raises(UserError, match=match):
        run_pretrain_stage(cfg, shards, tok, out, log_line=lambda line: pytest.fail(f"launched: {line}"))
    assert _snapshot(out) == before  # nothing written or overwritten
    return before


def _rewrite_manifest(shards, **changes):
    path = shards / shard_format.MANIFEST_NAME
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))
    return manifest


def test_no_shards_at_the_path(data, tmp_path):
    _fails(config(), tmp_path / "nowhere", data[1], tmp_path / "out", "no shards at")


def test_tokenizer_that_did_not_make_the_shards(data, tmp_path):
    shards, tok = data
    other = tmp_path / "tok2"
    shutil.copytree(tok, other)
    (other / "vocab.txt").write_text((tok / "vocab.txt").read_text().replace("zebra", "zebras"))
    (other / "tokenizer.json").unlink()
    _fails(config(), shards, other, tmp_path / "out", "different tokenizer")


def test_token_ids_beyond_the_vocabulary(data, tmp_path):
    shards, tok = data
    small = tmp_path / "tok-small"
    small.mkdir()
    (small / "vocab.txt").write_text("\n".join((tok / "vocab.txt").read_text().splitlines()[:2000]) + "\n")
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    _rewrite_manifest(copy, tokenizer_sha256=sha256_file(small / "vocab.txt"))
    _fails(config(), copy, small, tmp_path / "out", r"token id \d+ in input_ids.*only 2000 entries")


def _our_columns_as_int64() -> pa.Table:
    """Our column names, but every integer 64-bit (as pandas writes them)."""
    lists = {
        "input_ids": [[2, 5, 3]],
        "segment_ids": [[0, 0, 0]],
        "masked_lm_positions": [[1]],
        "masked_lm_ids": [[7]],
    }
    return pa.table(
        {
            **{k: pa.array(v, pa.list_(pa.int64())) for k, v in lists.items()},
            "next_sentence_label": pa.array([0], pa.int64()),
        }
    )


@pytest.mark.parametrize(
    "make_table",
    [lambda: pa.table({"input_ids": pa.array([[1, 2, 3]]), "label": pa.array([0])}), _our_columns_as_int64],
    ids=["other columns", "our columns in other types"],
)
def test_shard_with_a_foreign_schema(data, tmp_path, make_table):
    shards, tok = data
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    bad = copy / "train" / shard_format.shard_name(0, 2)
    pq.write_table(make_table(), bad)
    manifest = json.loads((copy / shard_format.MANIFEST_NAME).read_text())
    manifest["splits"]["train"][0]["sha256"] = sha256_file(bad)
    _rewrite_manifest(copy, splits=manifest["splits"])
    _fails(config(), copy, tok, tmp_path / "out", "does not have the bertflow example schema")


def test_shards_without_masked_positions(data, tmp_path):
    """Train shards with no MLM target (a vocabulary that made every token [UNK]) are refused
    before a rank starts: the masked-LM loss would be NaN at step 1."""
    shards, tok = data
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    manifest = json.loads((copy / shard_format.MANIFEST_NAME).read_text())
    for entry in manifest["splits"]["train"]:
        path = copy / "train" / entry["path"]
        table = pq.read_table(path)
        for column in ("masked_lm_positions", "masked_lm_ids"):
            field = table.schema.field(column)
            empty = pa.array([[]] * table.num_rows, type=field.type)
            table = table.set_column(table.schema.get_field_index(column), field, empty)
        pq.write_table(table, path)
        entry["sha256"] = sha256_file(path)
    _rewrite_manifest(copy, splits=manifest["splits"])
    _fails(
        config(),
        copy,
        tok,
        tmp_path / "out",
        r"training split of .* has no masked-LM targets.*Fix: preprocess again",
    )


@pytest.mark.parametrize(
    "sets,match",
    [
        (["pretrain.zero_stage=4"], "ZeRO stage 4 does not exist"),
        (["pretrain.precision=fp16"], "fp16 needs a GPU"),
        (["pretrain.hostfile=/nonexistent/hostfile"], "hostfile /nonexistent/hostfile does not exist"),
        (["model.max_position_embeddings=64"], "only 64 positions"),
        (["pretrain.init_from=/nonexistent/model"], "init_from /nonexistent/model does not exist"),
    ],
)
def test_settings_that_cannot_work(data, tmp_path, sets, match):
    _fails(config(*sets), *data, tmp_path / "out", match)


def test_init_from_a_model_of_another_vocabulary_of_the_same_size(data, tmp_path):
    """Its embedding rows are its own vocab.txt's ids: the same number of other tokens (here two
    swapped) trained it on the wrong words without a word; only the sizes were compared."""
    shards, tok = data
    vocab = (tok / "vocab.txt").read_text().splitlines()
    vocab[1000], vocab[1001] = vocab[1001], vocab[1000]
    init = tmp_path / "init"
    init.mkdir()
    (init / "vocab.txt").write_text("\n".join(vocab) + "\n")
    shape = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": len(vocab), **shape}))
    _fails(config(f"pretrain.init_from={init}"), shards, tok, tmp_path / "out", "another vocabulary than")


def test_init_from_a_model_of_another_vocabulary_size_says_to_make_the_shards_again(data, tmp_path):
    """The fix said to pretrain with init_from's own tokenizer, but the shards hold the ids of the
    tokenizer that made them: it now says to make them again with it, in the flow (tokenizer.vocab)
    and with the stage commands (preprocess --vocab, then pretrain --tokenizer --shards)."""
    shards, tok = data
    init = tmp_path / "init"
    init.mkdir()
    (init / "vocab.txt").write_text(
        "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "".join(f"w{i}\n" for i in range(59))
    )
    shape = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 64, **shape}))

    def fix(*extra: str) -> str:  # the stage commands with the config's --set items
        items = shlex.join(settings(*extra))
        return (
            "Fix: pretrain with init_from's own tokenizer, on shards made with it (shards hold the token ids of "
            f"the tokenizer that made them): in the flow (`bertflow run`), set tokenizer.vocab: {init / 'vocab.txt'}, "
            "and its tokenizer and preprocess stages run again for that vocabulary; with the stage commands, "
            f"`bertflow preprocess CONFIG --vocab {init} --output NEW_SHARDS --set {items}`, then "
            f"`bertflow pretrain CONFIG --tokenizer {init} --shards NEW_SHARDS --output OUT --set {items}`."
        )

    cfg = config(f"pretrain.init_from={init}")
    _fails(
        cfg,
        shards,
        tok,
        tmp_path / "out",
        r"has vocab_size 64, the tokenizer .* has 30522\. " + re.escape(fix(f"pretrain.init_from={init}")),
    )
    flow = config(f"pretrain.init_from={init}", f"tokenizer.vocab={tok / 'vocab.txt'}")
    with pytest.raises(
        UserError,
        match=r"another vocabulary than .*"
        + re.escape(fix(f"pretrain.init_from={init}", f"tokenizer.vocab={tok / 'vocab.txt'}")),
    ):
        check_flow_init_vocabulary(flow)


def test_init_from_a_model_whose_own_vocab_txt_is_truncated(data, tmp_path):
    """The vocabulary mismatch's fix recommended init_from's own vocab.txt, also when that file was
    truncated (1,000 lines for 30,522 embeddings): the broken file is named as broken instead."""
    shards, tok = data
    vocab = (tok / "vocab.txt").read_text().splitlines()
    init = tmp_path / "init"
    init.mkdir()
    (init / "vocab.txt").write_text("\n".join(vocab[:1000]) + "\n")
    shape = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": len(vocab), **shape}))
    _fails(
        config(f"pretrain.init_from={init}"), shards, tok, tmp_path / "out",
        f"its own tokenizer does not fit its weights: the tokenizer has 1,000 tokens for the model's {len(vocab):,}",
    )  # fmt: skip


def test_checkpoint_of_another_model_shape(data, tmp_path):
    out = tmp_path / "out"
    tag = out / "checkpoints" / "global_step4"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    shape = {"vocab_size": 30522, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 1024, "max_position_embeddings": 512, "type_vocab_size": 2}  # fmt: skip
    checkpoint.write_verification(
        tag, {"step": 4, "world_size": 2, "global_batch": 16, "model_config": shape}
    )
    _fails(config(), *data, out, "other settings.*model.hidden_size: 256 -> 128")
    # same shape but another process count: ZeRO partitions cannot be reused
    shape.update(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    checkpoint.write_verification(
        tag, {"step": 4, "world_size": 4, "global_batch": 32, "model_config": shape}
    )
    _fails(config(), *data, out, "written by 4 processes")
    checkpoint.write_verification(
        tag, {"step": 4, "world_size": 1, "global_batch": 16, "model_config": shape}
    )
    _fails(config(), *data, out, "written by 1 process with global batch 16; this run has 2 processes")


def test_finished_run_with_other_settings(data, tmp_path):
    out = tmp_path / "out"
    write_marker(out, {"fingerprint": "from-another-run"})
    _fails(config(), *data, out, "finished pretraining run with other settings")


def test_a_finished_run_with_its_checkpoints_is_refused_as_finished_not_as_a_resume(data, tmp_path):
    """A rerun of a finished pretraining with another lr into its --output was told "holds checkpoint
    global_step30 of a run with other settings ... A resume would carry on its optimizer state ...
    rerun with the recorded settings to resume it": the checkpoints a finished run keeps were
    checked as a resume's before the finished run's own refusal (delete it or choose a new --output)."""
    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings()})
    write_marker(out, {"fingerprint": spec.fingerprint(), "settings": spec.settings()})
    with pytest.raises(UserError) as refused:
        run_pretrain_stage(config("pretrain.lr=0.001"), shards, tok, out, log_line=print)
    text = str(refused.value)
    assert (
        f"holds a finished pretraining run with other settings: pretrain.lr: {spec.pretrain.lr} -> 0.001"
        in text
    )
    assert "resume" not in text and f"delete {out} to retrain it" in text, text


def test_cli_prints_one_paragraph_and_exits_2(data, tmp_path):
    shards, tok = data
    cmd = [sys.executable, "-m", "pipelines.cli", "pretrain", "--shards", str(shards), "--tokenizer", str(tok),
           "--output", str(tmp_path / "out"), "--zero-stage", "4"]  # fmt: skip
    res = subprocess.run(cmd, cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "ZeRO stage 4 does not exist" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


def _spec(cfg, shards, tok, out):
    return preflight.build_spec(cfg, shards, tok, out, False, False, 2, cfg.wandb.target(group=None))


def _checkpoint(out, info, step=4):
    tag = out / "checkpoints" / f"global_step{step}"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"x")
    checkpoint.write_verification(tag, {"step": step, "world_size": 2, "global_batch": 16, **info})
    return tag


def test_another_nodes_run_spec_is_the_runs_own_before_node_0_holds_the_lock(data, tmp_path):
    """The nodes of a run on a shared OUT start in any order: node 1's run_spec.json and launcher.log,
    written before node 0 took OUT's lock, are the run's. Node 0 was refused as on a user's folder
    (the two-node tests of test_pretrain.py failed 3 of 3 in a loaded full-suite run). A spec
    copied in from elsewhere, or `{}`, is still no sign of a run."""
    from pipelines.stage_pretrain import refuse_a_users_folder

    shards, tok = data
    out = (tmp_path / "out").resolve()
    out.mkdir()
    _spec(config(), shards, tok, out).write(out / "run_spec.json")
    (out / "launcher.log").write_text("node 1\n")
    refuse_a_users_folder(out)  # node 1's: node 0 goes on
    elsewhere = (tmp_path / "copied").resolve()
    elsewhere.mkdir()
    shutil.copy(out / "launcher.log", elsewhere / "launcher.log")
    for copied in ((out / "run_spec.json").read_text(), "{}"):  # another output's spec, or none
        (elsewhere / "run_spec.json").write_text(copied)
        with pytest.raises(UserError, match="already holds launcher.log, run_spec.json"):
            refuse_a_users_folder(elsewhere)
    (tmp_path / ".copied.lock").write_text("1\n")  # beside the lock a run held: a killed run's own
    refuse_a_users_folder(elsewhere)


def test_resume_with_other_settings_names_each_key(data, tmp_path):
    """Issue 14 item 1: a resume with another lr kept the checkpoint's schedule and weights while
    run_spec.json recorded the new lr. Now each differing key is named and nothing starts."""
    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings()})
    changed = config("pretrain.lr=1e-3", "pretrain.warmup_steps=3")
    _fails(changed, shards, tok, out, r"pretrain\.lr: 0\.002 -> 0\.001; pretrain\.warmup_steps: 2 -> 3")
    # how a run is watched and checkpointed may change on a resume; the weights do not depend on it
    _spec(
        config("pretrain.log_every=5", "pretrain.checkpoint_every=2", "pretrain.eval_every=3"),
        shards,
        tok,
        out,
    )


def test_a_cpu_resume_on_another_thread_count_says_it_will_not_match_bit_for_bit(data, tmp_path, monkeypatch):
    """A checkpoint written by ranks on one torch thread each, resumed on a machine with more cores
    or under OMP_NUM_THREADS=2, went on under the same key with weights that differed from an
    uninterrupted run's in the 7th digit, unsaid. The count is recorded; another one is said, with
    the way to continue exactly; the same one, a GPU run or a checkpoint without the record is not."""
    from training.launch import cpu_threads_per_rank

    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings(), "cpu_threads": 1})
    note = preflight.resume_threads_note(spec, 2)
    assert "global_step4 with 2 torch thread(s) per rank, where it was written with 1" in note
    assert "OMP_NUM_THREADS=1" in note
    assert preflight.resume_threads_note(spec, 1) is None
    assert preflight.resume_threads_note(spec.model_copy(update={"on_gpu": True}), 2) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's count is what the ranks get
    assert cpu_threads_per_rank(2) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_threads_per_rank(2) == max(1, (os.cpu_count() or 1) // 2)
    older = tmp_path / "older"
    _checkpoint(older, {"model_config": spec.model, "settings": spec.settings()})
    assert preflight.resume_threads_note(spec.model_copy(update={"out_dir": older}), 2) is None
    # a newer tag with a file missing is not the one resumed: the note names the tag that is
    broken = _checkpoint(
        out, {"model_config": spec.model, "settings": spec.settings(), "cpu_threads": 2}, step=8
    )
    (broken / "mp_rank_00_model_states.pt").unlink()
    assert "resuming " + str(out / "checkpoints" / "global_step4") in preflight.resume_threads_note(spec, 2)


def test_resume_of_a_checkpoint_from_before_a_setting_existed(data, tmp_path):
    """A checkpoint recorded before pretrain.muon_lr existed (`Section.added_later`) resumes while the
    setting keeps its default, and is refused, naming it, once it is set."""
    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    recorded = spec.settings()
    assert "muon_lr" not in recorded["pretrain"]  # what an older bertflow recorded, too
    _checkpoint(out, {"model_config": spec.model, "settings": recorded})
    _spec(config("pretrain.muon_lr=0.01"), shards, tok, out)
    _fails(config("pretrain.muon_lr=0.02"), shards, tok, out, r"pretrain\.muon_lr: '\(unset\)' -> 0\.02")


def test_a_run_made_with_its_batch_split_spelled_out_is_the_run_global_batch_size_resolves_to(data, tmp_path):
    """Before 2026-11-26 the shipped configs gave ranks, micro batch and accumulation; now they give
    a global batch (`training/ranks.py`). The same split is the same run: its finished output and
    checkpoints are reused and resumed, and another split of the same global batch is refused."""
    from training.ranks import resolve_ranks

    shards, tok = data
    spelled_out = _spec(config(), shards, tok, tmp_path / "a")  # 2 ranks x micro 8 x 1
    for gpus, same in ((0, True), (1, False)):
        cfg = config("pretrain.num_processes=auto", "pretrain.global_batch_size=16")
        resolved = cfg.model_copy(update={"pretrain": resolve_ranks(cfg.pretrain, gpus)})
        world = resolved.pretrain.num_processes
        spec = preflight.build_spec(
            resolved, shards, tok, tmp_path / "b", False, False, world, cfg.wandb.target(group=None)
        )
        assert (spec.fingerprint() == spelled_out.fingerprint()) is same, spec.differences(
            spelled_out.settings()
        )


def test_resume_of_a_checkpoint_without_recorded_settings_uses_run_spec(data, tmp_path):
    """Checkpoints written before _VERIFIED.json held the settings: run_spec.json of that run decides."""
    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model})
    spec.write(out / "run_spec.json")
    _fails(config("pretrain.seed=6"), shards, tok, out, r"pretrain\.seed: 5 -> 6")


def test_preset_that_is_not_the_shape_of_init_from(data, tmp_path, minilm_dir):
    """Issue 14 item 1: `--preset mini` with init_from a model of another shape trained init_from's
    shape while the record said mini. Named explicitly, a preset must match; unset, the record says
    the model is init_from's (preset null)."""
    shards, tok = data
    sets = ["pretrain.num_processes=2", "pretrain.micro_batch_size=8", f"pretrain.init_from={minilm_dir}"]
    _fails(load_config(None, [*sets, "model.preset=mini"]), shards, tok, tmp_path / "out",
           r"model.preset 'mini' describes another model than pretrain.init_from .*hidden_size 256 vs 384")  # fmt: skip
    cfg = load_config(None, sets)
    spec = _spec(cfg, shards, tok, tmp_path / "out")
    assert cfg.model.preset is None and spec.pipeline_config["model"]["preset"] is None
    assert spec.model["hidden_size"] == 384
    with pytest.raises(UserError, match="model.preset is null"):
        load_config(None, ["model.preset=null"])


def test_init_from_trained_at_fewer_tokens_than_the_shards(data, tmp_path, minilm_dir):
    """Phase 2 on longer examples than phase 1 was trained at (its model_max_length): the spec tells
    the ranks the trained length, whose positions the new ones start as copies of. A model trained
    at the shards' length or longer, or one that does not say, has nothing to copy."""
    shards, tok = data  # 128-token shards
    phase1 = tmp_path / "phase1"
    phase1.mkdir()
    for f in minilm_dir.iterdir():
        if f.name != "tokenizer_config.json":
            (phase1 / f.name).symlink_to(f)
    sets = ["pretrain.num_processes=2", "pretrain.micro_batch_size=8"]

    def trained(init_dir):
        cfg = load_config(None, [*sets, f"pretrain.init_from={init_dir}"])
        return _spec(cfg, shards, tok, tmp_path / "out").init_trained_length

    assert trained(minilm_dir) is None  # model_max_length 512
    assert trained(phase1) is None  # no tokenizer_config.json
    (phase1 / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    assert trained(phase1) == 32
    (phase1 / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    assert trained(phase1) is None
    (phase1 / "tokenizer_config.json").write_text('{"model_max_length": 3')  # cut short
    with pytest.raises(UserError, match=r"phase1/tokenizer_config.json is not valid JSON"):
        trained(phase1)
    assert _spec(load_config(None, sets), shards, tok, tmp_path / "out").init_trained_length is None


def test_other_inputs_without_output_are_refused_before_anything_is_written(data, tmp_path):
    """The flow's pretraining directory is keyed by the flow's own shards and tokenizer: a model
    trained there on others would be reused by the flow as its own."""
    shards, tok = data
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "pipelines.cli", "pretrain", "--shards", str(shards), "--tokenizer", str(tok),
           "--set", f"run_dir={runs}"]  # fmt: skip
    res = subprocess.run(cmd, cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "--shards and --tokenizer other than the flow's for this config need --output" in res.stderr
    assert "Fix: add --output DIR." in res.stderr and "Traceback" not in res.stderr
    assert not runs.exists()  # not the pretrain folder, nor any other of the run directory


def test_a_relative_output_works_from_any_directory(data, tmp_path):
    """The launcher runs in the project root: a relative --output given elsewhere made every rank
    look for its run spec there ("launcher exit code 1")."""
    from tests.pretrain_runs import settings

    shards, tok = data
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    sets = [x for s in settings("pretrain.num_processes=1", "pretrain.max_steps=2", "pretrain.checkpoint_every=2")
            for x in ("--set", s)]  # fmt: skip
    cmd = [sys.executable, "-m", "pipelines.cli", "pretrain", "--shards", str(shards), "--tokenizer", str(tok),
           "--output", "relative_run", *sets]  # fmt: skip
    res = subprocess.run(cmd, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert (cwd / "relative_run" / "model" / "model.safetensors").is_file()
    # the banner naming the launcher's log, once the checks passed (a refusal prints none)
    assert res.stdout.count("DeepSpeed's warnings included: relative_run/launcher.log)") == 1, res.stdout
    assert (cwd / "relative_run" / "launcher.log").is_file()


def test_an_output_inside_the_tokenizer_directory_is_refused(data, tmp_path):
    """Pretraining writes (and clears parts of) its output: inside an input it would change that
    input, so `--output TOK/run` is refused like `--output TOK`."""
    shards, shared_tok = data
    tok = tmp_path / "tok"  # a copy: a regression would write into the module's tokenizer
    shutil.copytree(shared_tok, tok)
    _fails(config(), shards, tok, tok / "run", r"pretrain output .*/run lies inside the tokenizer directory")
    assert not (tok / "run").exists()


def test_an_output_that_holds_another_stages_output_is_refused(data, tmp_path):
    """`--output` naming a finished tokenizer (another one than the run's input) would overwrite it."""
    shards, tok = data
    other = tmp_path / "tok2"
    shutil.copytree(tok, other)
    write_marker(other, {"stage": "tokenizer"})
    _fails(config(), shards, tok, other, r"pretrain output .*tok2 holds a bertflow tokenizer output")


def test_a_refusal_of_the_preset_names_the_preset_flag_typed(data, tmp_path, minilm_dir, capsys):
    """`bertflow pretrain --preset mini` refused for a model.preset that mismatches init_from, or for
    the model shape it decides when resuming an output of another shape, named only the config key
    model.preset (or model.hidden_size ...): the refusal now names the flag typed, to change or drop."""
    from pipelines.cli import main as cli

    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings()})
    sets = [a for s in settings() for a in ("--set", s)]
    argv = ["pretrain", "--shards", str(shards), "--tokenizer", str(tok), *sets, "--preset", "mini"]

    assert cli([*argv, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model.hidden_size: 128 -> 256" in err, err
    assert "model.preset is the `--preset mini` you typed, which decides model.num_hidden_layers, " in err, (
        err
    )
    assert "change or drop --preset" in err, err

    init = ["--set", f"pretrain.init_from={minilm_dir}"]
    assert cli([*argv, *init, "--output", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "model.preset 'mini' describes another model than pretrain.init_from" in err, err
    assert "model.preset is the `--preset mini` you typed: change or drop --preset" in err, err


def test_a_resume_refused_for_another_zero_stage_names_the_setting_and_the_flag_typed(data, tmp_path, capsys):
    """`bertflow pretrain --zero-stage 3` into an --output interrupted at ZeRO 2 was refused with
    `ds_config.zero_optimization.stage: 2 -> 3`, a key of the resolved DeepSpeed JSON that no
    config or flag spells; the refusal now names the settings that decide it and the flag typed."""
    from pipelines.cli import main as cli

    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings()})
    sets = [a for s in settings() for a in ("--set", s)]
    argv = ["pretrain", "--shards", str(shards), "--tokenizer", str(tok), *sets, "--output", str(out)]
    assert cli([*argv, "--zero-stage", "3"]) == 2
    err = capsys.readouterr().err
    assert (
        f"ds_config.zero_optimization.stage (pretrain.zero_stage, else the stage of the pretrain.deepspeed_config JSON): {spec.zero_stage} -> 3"
        in err
    ), err
    assert "pretrain.zero_stage is the `--zero-stage 3` you typed: change or drop --zero-stage" in err, err


def test_a_finished_run_refused_for_another_number_of_processes_names_the_flag_typed(data, tmp_path, capsys):
    """`bertflow pretrain --num-processes 1` into a finished 2-process run's --output was refused with
    `ds_config.train_batch_size: 16 -> 8` alone: no setting a user gives, and no note on the flag."""
    from pipelines.cli import main as cli

    shards, tok = data
    out = tmp_path / "out"
    spec = _spec(config(), shards, tok, out)
    _checkpoint(out, {"model_config": spec.model, "settings": spec.settings()})
    write_marker(out, {"fingerprint": spec.fingerprint(), "settings": spec.settings()})
    sets = [a for s in settings() for a in ("--set", s)]
    argv = ["pretrain", "--shards", str(shards), "--tokenizer", str(tok), *sets, "--output", str(out)]
    assert cli([*argv, "--num-processes", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished pretraining run with other settings: ds_config.train_batch_size (" in err, err
    assert (
        "pretrain.num_processes is the `--num-processes 1` you typed: change or drop --num-processes" in err
    )


@pytest.mark.parametrize("given", [[], ["--zero-stage", "2"], ["--set", "pretrain.zero_stage=1"]])
def test_muon_refused_by_the_pretrain_command_names_its_zero_stage_flag(data, tmp_path, capsys, given):
    """`bertflow pretrain --set pretrain.optimizer=muon` at ZeRO 1-3 (the template's, `--zero-stage 2`
    or pretrain.zero_stage) was told "set pretrain.zero_stage: 0", and with `--zero-stage 2` typed
    also "change or drop --zero-stage" (dropped, the template's stage 2 is refused again). The
    command's fix is its flag, `--zero-stage 0`, which wins over the config and --set."""
    from pipelines.cli import main as cli

    shards, tok = data
    out = tmp_path / "out"
    argv = ["pretrain", "--shards", str(shards), "--tokenizer", str(tok), "--output", str(out),
            "--num-processes", "2", "--set", "pretrain.optimizer=muon", *given]  # fmt: skip
    assert cli(argv) == 2
    said = capsys.readouterr()
    err = said.err
    assert "pretrain.optimizer muon needs ZeRO stage 0" in err, err
    assert "launcher.log" not in said.out and not (out / "launcher.log").exists(), said.out
    assert (
        err.count("Fix: pass --zero-stage 0 (= pretrain.zero_stage), or --set pretrain.optimizer=adamw.") == 1
    )
    assert "set pretrain.zero_stage: 0" not in err and "drop --zero-stage" not in err, err
    followed = config("pretrain.optimizer=muon", "pretrain.zero_stage=0")  # as --zero-stage 0 sets it
    assert _spec(followed, shards, tok, out).ds_config["zero_optimization"]["stage"] == 0


def test_a_master_port_in_use_is_refused_before_a_rank_starts(data, tmp_path):
    """pretrain.master_port naming a port another program listens on failed the launch with a
    38-line torch traceback ending EADDRINUSE, as a RuntimeError the flow then retried. Now one
    UserError names the setting before anything is launched or written."""
    import socket

    shards, tok = data
    out = tmp_path / "out"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lines: list[str] = []
        with pytest.raises(UserError, match=f"pretrain.master_port {port} is in use on this machine"):
            run_pretrain_stage(
                config(f"pretrain.master_port={port}"), shards, tok, out, log_line=lines.append
            )
    assert not any(line.startswith("launch:") for line in lines)
    assert not out.exists()


def test_a_tokenizer_directory_that_does_not_exist_is_said_so(data, tmp_path):
    """`--tokenizer /no/such/dir` said the directory 'has no vocab.txt', sending the user to look
    inside a folder that is not there; an existing folder without one still says that."""
    shards, _ = data
    missing, empty = tmp_path / "no" / "such", tmp_path / "empty"
    empty.mkdir()
    _fails(config(), shards, missing, tmp_path / "run", rf"tokenizer directory {missing} does not exist\.")
    _fails(config(), shards, empty, tmp_path / "run", rf"tokenizer directory {empty} has no vocab\.txt\.")
