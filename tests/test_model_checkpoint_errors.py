"""Bad checkpoints and bad targets: one UserError naming the file or key, through the CLI too
(exit 2, one paragraph, no traceback), and nothing of the user's lost."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.atomic import write_marker
from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.hf_io import load_checkpoint, write_hf_dir
from pipelines.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A small valid model directory without a tokenizer."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("good") / "model"
    write_hf_dir(BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64)), d)
    return d


def copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def expect_cli_error(argv: list[str], capsys, *fragments: str) -> str:
    """Run the CLI in-process; it must exit 2 and print one paragraph containing `fragments`."""
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def test_directory_that_is_not_a_bert_checkpoint(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("hello")
    expect_cli_error(
        ["import-hf", str(notes), str(tmp_path / "o")], capsys, "not a BERT checkpoint", "config.json"
    )
    expect_cli_error(
        ["export-hf", str(notes), str(tmp_path / "o")], capsys, "not a BERT checkpoint", str(notes)
    )
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    expect_cli_error(["import-hf", str(gpt), str(tmp_path / "o")], capsys, str(gpt / "config.json"), "'gpt2'")
    expect_cli_error(["import-hf", str(tmp_path / "absent"), str(tmp_path / "o")], capsys, "does not exist")
    # export-hf reads a path that is no folder as a model directory too: what is wrong with it is said
    expect_cli_error(["export-hf", str(tmp_path / "absent"), str(tmp_path / "o")], capsys, "does not exist")
    expect_cli_error(
        ["export-hf", str(gpt / "config.json"), str(tmp_path / "o")], capsys, "is a file, not a checkpoint"
    )
    assert not (tmp_path / "o").exists()


def test_missing_weights_file(good, tmp_path, capsys):
    d = copy_dir(good, tmp_path / "ckpt")
    (d / "model.safetensors").unlink()
    expect_cli_error(["export-hf", str(d), str(tmp_path / "o")], capsys, str(d), "no weights file")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "part-1.safetensors"}}))
    expect_cli_error(
        ["export-hf", str(d), str(tmp_path / "o")], capsys, str(d / "part-1.safetensors"), "missing"
    )


@pytest.mark.parametrize("damage", ["truncated-safetensors", "garbage-bin"])
def test_truncated_or_corrupt_weights_file(good, tmp_path, capsys, damage):
    d = copy_dir(good, tmp_path / "ckpt")
    weights = d / "model.safetensors"
    if damage == "truncated-safetensors":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.unlink()
        weights = d / "pytorch_model.bin"
        weights.write_bytes(random.Random(0).randbytes(4096))  # the same junk every run
    expect_cli_error(["import-hf", str(d), str(tmp_path / "o")], capsys, str(weights), "corrupt or truncated")


def test_config_whose_shapes_disagree_with_the_weights(good, tmp_path, capsys):
    d = copy_dir(good, tmp_path / "wide")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "hidden_size": 256, "intermediate_size": 1024}))
    expect_cli_error(
        ["import-hf", str(d), str(tmp_path / "o")],
        capsys,
        str(d / "config.json"),
        "bert.embeddings.",
        "(128,)",
        "(256,)",
    )
    d = copy_dir(good, tmp_path / "deep")
    (d / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    expect_cli_error(
        ["import-hf", str(d), str(tmp_path / "o")], capsys, str(d / "config.json"), "encoder.layer.2"
    )
    d = copy_dir(good, tmp_path / "shallow")  # fewer layers than the weights: not silently dropped
    (d / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    expect_cli_error(
        ["import-hf", str(d), str(tmp_path / "o")],
        capsys,
        str(d / "config.json"),
        "unexpected",
        "encoder.layer.1",
    )
    d = copy_dir(good, tmp_path / "odd-heads")
    (d / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3}))
    expect_cli_error(["import-hf", str(d), str(tmp_path / "o")], capsys, str(d / "config.json"), "divisible")


def test_tokenizer_missing_or_too_large_for_the_model(good, minilm_dir, tmp_path, capsys):
    expect_cli_error(["export-hf", str(good), str(tmp_path / "o")], capsys, "has no tokenizer", "--tokenizer")
    # the MiniLM vocabulary has 30,522 tokens; this model's embedding table has 64 rows
    expect_cli_error(
        ["export-hf", str(good), str(tmp_path / "o"), "--tokenizer", str(minilm_dir)],
        capsys,
        "vocab_size is 64",
    )
    assert not (tmp_path / "o").exists()


def test_the_tokenizer_files_written_next_to_a_model(tmp_path):
    """tokenizer_config.json gets a usable model_max_length (not Hugging Face's 1e30 "no limit"),
    the casing the tokenizer.json's normalizer applies, and a vocabulary that fits the model."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece
    from tokenizers.normalizers import BertNormalizer

    from model.hf_io import copy_tokenizer_files

    vocab = SPECIALS.split() + ["the", "cat"]
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = BertNormalizer(lowercase=True)
    src = tmp_path / "src"
    src.mkdir()
    tok.save(str(src / "tokenizer.json"))
    no_limit = int(1e30)
    (src / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": False, "model_max_length": no_limit})
    )
    out = tmp_path / "out"
    out.mkdir()
    copy_tokenizer_files(src, out, vocab_size=len(vocab))  # exactly as many tokens as rows: fits
    written = json.loads((out / "tokenizer_config.json").read_text())
    assert written["model_max_length"] == 512 and written["do_lower_case"] is True
    assert (out / "vocab.txt").read_text().splitlines() == vocab
    with pytest.raises(
        UserError,
        match=f"the tokenizer has {len(vocab)} tokens but the model's vocab_size is {len(vocab) - 1}",
    ):
        copy_tokenizer_files(src, tmp_path, vocab_size=len(vocab) - 1)
    with pytest.raises(UserError, match=f"for the model's {3 * len(vocab):,} embeddings: a truncated"):
        copy_tokenizer_files(src, tmp_path, vocab_size=3 * len(vocab))


def test_a_bad_tokenizer_config_next_to_the_tokenizer_is_named_as_such(tmp_path):
    """A source tokenizer_config.json holding a list was called 'not valid JSON' (it is valid JSON,
    not an object), and a cut-short one did not say what was wrong: both are said as every other
    JSON file a user gives is (common.jsonfile), and nothing is written."""
    from model.hf_io import copy_tokenizer_files

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "vocab.txt").write_text("".join(f"{t}\n" for t in SPECIALS.split()))
    (src / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(
        UserError, match=r"tokenizer config .*tokenizer_config.json must hold a JSON object, not list"
    ):
        copy_tokenizer_files(src, out)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 3')
    with pytest.raises(
        UserError, match=r"tokenizer config .*tokenizer_config.json is not valid JSON \(corrupt or truncated"
    ):
        copy_tokenizer_files(src, out)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("value", ["false", 1, None])
def test_a_do_lower_case_that_is_not_a_json_boolean_is_refused(tmp_path, value):
    """A do_lower_case "false" (a string) beside a cased vocab.txt was read as true (Python
    truthiness): the export wrote do_lower_case true and the loader lowercased, so 'Paris' became
    [UNK]. transformers writes a JSON boolean; anything else is refused naming the file, the key and
    the fix, by both readers, before anything is written."""
    from model.hf_io import copy_tokenizer_files
    from preprocessing.wordpiece import load_tokenizer

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "vocab.txt").write_text("".join(f"{t}\n" for t in [*SPECIALS.split(), "Paris"]))
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": value}))
    message = (
        rf"src/tokenizer_config\.json: do_lower_case is {re.escape(json.dumps(value))}, not true or false"
    )
    with pytest.raises(UserError, match=message) as err:
        copy_tokenizer_files(src, out)
    assert '"do_lower_case": false' in str(err.value)
    assert list(out.iterdir()) == []
    with pytest.raises(UserError, match=message):
        load_tokenizer(src)
    (src / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tok, lowercase = load_tokenizer(src)
    assert not lowercase and tok.encode("Paris").tokens == ["[CLS]", "Paris", "[SEP]"]


def test_a_tokenizer_other_than_the_checkpoints_own_is_refused(good, tmp_path, capsys):
    """--tokenizer is for a checkpoint without one: a different one used to replace the
    checkpoint's vocabulary in the export silently; an identical copy is accepted."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(59))]
    own, other, copy = tmp_path / "own", tmp_path / "other", tmp_path / "copy"
    for directory, vocab in ((own, words), (other, [*words[:-1], "zebra"]), (copy, words)):
        directory.mkdir()
        (directory / "vocab.txt").write_text("".join(w + "\n" for w in vocab))
    ckpt = tmp_path / "ckpt"
    write_hf_dir(load_checkpoint(good).model, ckpt, own)
    out = tmp_path / "o"
    argv = ["export-hf", str(ckpt), str(out), "--tokenizer"]
    expect_cli_error(
        [*argv, str(other)], capsys, str(ckpt), str(other), "'w58' vs 'zebra'", "drop --tokenizer"
    )
    assert not out.exists()
    assert cli([*argv, str(copy)]) == 0
    assert (out / "vocab.txt").read_text() == (own / "vocab.txt").read_text()


def test_nan_weights_are_not_exported(good, minilm_dir, tmp_path, capsys):
    model = load_checkpoint(good).model
    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.weight[0, 0] = float("nan")
    d = tmp_path / "nan"
    write_hf_dir(model, d)
    expect_cli_error(
        ["export-hf", str(d), str(tmp_path / "o"), "--tokenizer", str(good)],
        capsys,
        "bert.encoder.layer.1.output.dense.weight",
        "NaN",
    )
    assert not (tmp_path / "o").exists()  # refused before anything is written
    # import-hf of a downloaded model: the fix is not only about a diverged training run
    expect_cli_error(["import-hf", str(d), str(tmp_path / "i")], capsys, "NaN", "download it again")
    assert not (tmp_path / "i").exists()


def test_nan_weights_are_not_fine_tuned(minilm_dir, tmp_path, capsys):
    """Fine-tuning a checkpoint with a NaN weight used to run every unit, each marked diverged."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    with torch.no_grad():
        model.bert.encoder.layer[0].attention.self.query.weight[1, 2] = float("inf")
    write_hf_dir(model, tmp_path / "inf", minilm_dir)
    argv = [
        "finetune",
        "--checkpoint",
        str(tmp_path / "inf"),
        "--tasks",
        "sst2",
        "--output",
        str(tmp_path / "o"),
    ]
    expect_cli_error(
        argv, capsys, "bert.encoder.layer.0.attention.self.query.weight", "NaN or Inf", "earlier"
    )
    assert not (tmp_path / "o").exists()  # refused before any unit


def test_nan_in_a_head_fine_tuning_replaces_is_not_refused(tmp_path):
    """A unit takes only the encoder: a NaN in the pretraining heads does not reach it."""
    from finetuning.fanout import check_encoder_finite, nonfinite_encoder_weight

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    with torch.no_grad():
        model.cls.seq_relationship.weight[0, 0] = float("nan")
    write_hf_dir(model, tmp_path / "head")
    check_encoder_finite(str(tmp_path / "head"))
    with torch.no_grad():
        model.bert.embeddings.LayerNorm.bias[3] = float("-inf")
    write_hf_dir(model, tmp_path / "both")
    assert nonfinite_encoder_weight(tmp_path / "both") == "bert.embeddings.LayerNorm.bias"


def test_existing_output_is_never_clobbered_and_leftovers_are_ignored(good, minilm_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    model = BertForPreTraining(BertConfig.from_preset("tiny"))
    write_hf_dir(model, ckpt, minilm_dir)
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "thesis.tex").write_text("precious")
    expect_cli_error(["export-hf", str(ckpt), str(user_dir)], capsys, str(user_dir), "not overwriting")
    assert (user_dir / "thesis.tex").read_text() == "precious"
    # a _COMPLETE.json of the user's (one recording no model.safetensors, as every export's does)
    # made the folder a finished model directory: it was replaced as a whole, thesis.tex with it
    (user_dir / "_COMPLETE.json").write_text("{}\n")
    err = expect_cli_error(["import-hf", str(ckpt), str(user_dir)], capsys, str(user_dir), "not overwriting")
    assert (
        "its _COMPLETE.json is none export-hf or import-hf writes" in err and "no _COMPLETE.json" not in err
    )
    assert (user_dir / "thesis.tex").read_text() == "precious"

    # a run killed mid-write leaves only a .tmp- sibling (`.tmp-out.` and mkdtemp's 8 characters):
    # never taken for the result, swept on rerun; a user's `.tmp-out.notes`, and the build folder of
    # another OUT_DIR (out.v1, perhaps being written now), are not its leftovers and stay
    out = tmp_path / "out"
    leftover = tmp_path / ".tmp-out.k2j_9x0a"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    theirs = [tmp_path / ".tmp-out.notes", tmp_path / ".tmp-out.v1.abcd1234"]
    for folder in theirs:
        folder.mkdir()
        (folder / "todo.txt").write_text("mine")
    # the previous model an earlier version moved aside as `.tmp-out.old`, killed before removing it
    earlier = tmp_path / ".tmp-out.old"
    write_hf_dir(model, earlier, minilm_dir)
    write_marker(earlier, {"model.safetensors": "0" * 64, "command": "export-hf"})
    assert cli(["export-hf", str(ckpt), str(out)]) == 0
    assert not leftover.exists() and not earlier.exists()
    assert json.loads((out / "_COMPLETE.json").read_text())["command"] == "export-hf"
    assert all((folder / "todo.txt").read_text() == "mine" for folder in theirs)
    assert cli(["export-hf", str(ckpt), str(out)]) == 0  # replacing the finished one leaves no .old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")) == sorted(
        p.name for p in theirs
    )
    with pytest.raises(UserError, match="is a file"):
        load_checkpoint(out / "config.json")


def test_a_second_export_or_import_into_one_out_dir_at_once_is_refused(minilm_dir, tmp_path, capsys):
    """export-hf / import-hf took no lock: a second one into the same OUT_DIR swept the first's build
    folder (`.tmp-OUT.<random>`, a killed run's leftover to it) while it was written. They now hold
    the stages' lock (`PARENT/.OUT.lock`) and refuse, before reading the checkpoint, while another holds it."""
    from common.dir_lock import exclusive_dir

    out = tmp_path / "out"
    with exclusive_dir(out, "export-hf"):  # another export writing OUT now
        for command in ("export-hf", "import-hf"):
            expect_cli_error(
                [command, str(minilm_dir), str(out)],
                capsys,
                f"{command} in {out} is being run by another process",
                str(tmp_path / ".out.lock"),
            )
    assert not out.exists()
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0  # once it is done


def test_replacing_a_finished_model_directory_with_another_model_is_said(minilm_dir, tmp_path, capsys):
    """import-hf / export-hf onto a finished model directory replace it: silently when it held the
    same weights (a rerun), with a warning naming what it held when it held another model."""
    out = tmp_path / "out"
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0
    capsys.readouterr()
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0  # a rerun: the same weights
    assert "warning" not in capsys.readouterr().out
    other = tmp_path / "other"
    write_hf_dir(BertForPreTraining(BertConfig.from_preset("tiny")), other, minilm_dir)
    assert cli(["export-hf", str(other), str(out)]) == 0
    said = capsys.readouterr().out
    assert (
        f"warning: {out} held another model (import-hf from {minilm_dir.absolute()}, other weights)" in said
    ), said
    assert json.loads((out / "_COMPLETE.json").read_text())["source"] == str(other.absolute())


def test_a_stage_output_is_not_replaced_by_an_exported_model(minilm_dir, tmp_path, capsys):
    """export-hf / import-hf onto a tokenizer output, or onto a pretraining output that also held
    the user's corpus, took their _COMPLETE.json for a finished model directory's and replaced the
    folder as a whole ("held another model (bertflow, other weights)"): the vocabulary, the
    checkpoints and the corpus were gone. Now refused, naming the stage, and nothing is touched."""
    from pipelines.stage_tokenizer import run_tokenizer_stage
    from preprocessing.config import TokenizerConfig

    ckpt = tmp_path / "ckpt"
    write_hf_dir(BertForPreTraining(BertConfig.from_preset("tiny")), ckpt, minilm_dir)
    tok = run_tokenizer_stage(TokenizerConfig(vocab=str(minilm_dir / "vocab.txt")), tmp_path / "tok")
    run = tmp_path / "run"
    run.mkdir()
    (run / "corpus.txt").write_text("precious")
    (run / "run_spec.json").write_text("{}")
    write_marker(run, {"stage": "pretrain"})
    for out, stage in ((tok, "tokenizer"), (run, "pretrain")):
        before = {f.name: f.read_bytes() for f in out.iterdir()}
        for command, source in (("export-hf", ckpt), ("import-hf", minilm_dir)):
            expect_cli_error(
                [command, str(source), str(out)],
                capsys,
                f"{out} holds a bertflow {stage} output",
                "new output",
            )
            assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    mine = (
        tmp_path / "mine"
    )  # a marker naming no stage bertflow has: a user's folder, not "a bertflow mine output"
    mine.mkdir()
    write_marker(mine, {"stage": "mine"})
    expect_cli_error(
        ["export-hf", str(ckpt), str(mine)],
        capsys,
        f"{mine} already exists and is not a finished bertflow model directory (its _COMPLETE.json is none",
        "choose a new output directory",
    )


def test_a_pretraining_output_is_not_exported_onto_its_own_model(good, tmp_path, capsys):
    """export-hf RUN RUN/model said the finished model 'is not a finished bertflow model directory
    ... remove this one': now it is refused as nothing to export, and no fix suggests deleting it."""
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text(SPECIALS + "".join(f"w{i}\n" for i in range(59)))
    run = tmp_path / "run"
    write_hf_dir(load_checkpoint(good).model, run / "model", tok)
    (run / "run_spec.json").write_text("{}")
    write_marker(run, {"stage": "pretrain"})
    model = run / "model"
    before = {f.name: f.read_bytes() for f in model.iterdir()}
    for ckpt in (run, model):
        err = expect_cli_error(
            ["export-hf", str(ckpt), str(model)],
            capsys,
            f"{model} is the model directory of the pretraining output {run}",
            "nothing to export",
            "already is a Hugging Face model directory",
        )
        assert "remove" not in err and "delete" not in err, err
    err = expect_cli_error(
        ["export-hf", str(run / "checkpoints"), str(model)], capsys, "would replace that run's model"
    )
    assert "remove" not in err and "delete" not in err, err
    other = copy_dir(model, tmp_path / "someone_elses_model")  # a model without an export marker
    err = expect_cli_error(["export-hf", str(model), str(other)], capsys, str(other), "not overwriting")
    assert "remove" not in err, err
    assert {f.name: f.read_bytes() for f in model.iterdir()} == before


def test_an_export_into_the_pretraining_output_it_reads_is_refused(good, tmp_path, capsys):
    """`export-hf RUN/checkpoints/global_step2 RUN/checkpoints/global_step4` (or RUN/hf, or from
    RUN/model) wrote the export into the run's own output, rc 0: a global_stepN folder without a
    verification file that every later read of the run warned about as a broken checkpoint, and a
    folder that cleaning or rerunning the run removes with it. Refused before any work."""
    run = tmp_path / "run"
    write_hf_dir(load_checkpoint(good).model, run / "model", None)
    (run / "run_spec.json").write_text("{}")
    (run / "checkpoints" / "global_step2").mkdir(parents=True)
    write_marker(run, {"stage": "pretrain"})
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    tag = run / "checkpoints" / "global_step2"
    broken = f"(its folder {run / 'checkpoints' / 'global_step4'} reads as a broken checkpoint of the run"
    for ckpt, out in (
        (tag, run / "checkpoints" / "global_step4"),
        (tag, run / "checkpoints" / "global_step4" / "hf"),
        (tag, run / "hf"),
        (tag, run / "checkpoints" / "exp"),  # no checkpoint's name: not read as a broken one
        (run / "model", run / "hf"),
    ):
        err = expect_cli_error(
            ["export-hf", str(ckpt), str(out)],
            capsys,
            f"{out} lies inside the pretraining output {run}, which {ckpt} belongs to",
            "cleaning or rerunning the run removes the export with it",
            "an OUT_DIR outside",
        )
        # the broken-checkpoint harm only where the export makes a checkpoints/global_stepN folder
        assert (broken in err) == ("global_step4" in str(out)), err
        assert ("reads as a broken checkpoint" in err) == ("global_step4" in str(out)), err
        assert "global_stepN" not in err, err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_an_export_or_import_into_another_pretraining_output_is_refused(good, tmp_path, capsys):
    """`export-hf RUN_A RUN_B/checkpoints/global_step60` was told "not a finished bertflow model
    directory ... Fix: choose a new output directory or remove this one", advice to delete another
    run's checkpoint; `RUN_B/exp` or `RUN_B/checkpoints/imp` (import-hf too) were written into that
    run's files, rc 0, while the same folders of the run read were refused. Now refused alike."""
    other = tmp_path / "other"
    write_hf_dir(load_checkpoint(good).model, other / "model", None)
    (other / "run_spec.json").write_text("{}")
    (other / "checkpoints" / "global_step8").mkdir(parents=True)
    (other / "checkpoints" / "global_step8" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    write_marker(other, {"stage": "pretrain"})
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text(SPECIALS + "".join(f"w{i}\n" for i in range(59)))
    source = tmp_path / "hf_source"
    write_hf_dir(load_checkpoint(good).model, source, tok)
    under_way = tmp_path / "under_way"  # a run still training: its run_spec.json, no marker, no model/
    (under_way / "checkpoints" / "global_step4").mkdir(parents=True)
    (under_way / "run_spec.json").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for run, out in (
        (other, other / "checkpoints" / "global_step8"),
        (other, other / "exp"),
        (other, other / "checkpoints" / "imp"),
        (other, other / "checkpoints" / "global_step8" / "hf"),
        (under_way, under_way / "checkpoints" / "imp"),
    ):
        for command in ("export-hf", "import-hf"):
            err = expect_cli_error(
                [command, str(source), str(out)],
                capsys,
                f"{out} lies inside the pretraining output {run}",
                "an OUT_DIR outside",
            )
            assert "remove this one" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_cli_subprocess_prints_one_paragraph_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    (tmp_path / "empty").mkdir()  # no config.json
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "import-hf", str(tmp_path / "empty"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("bertflow import-hf: error:") and "config.json" in proc.stderr


def test_export_hf_names_its_own_tokenizer_flag(tmp_path, minilm_dir):
    """A --tokenizer that does not load was reported as `--vocab / tokenizer.vocab`, flags export-hf
    does not have."""
    from preprocessing.wordpiece import refuse_other_tokenizer

    with pytest.raises(UserError, match=r"check the --tokenizer path"):
        refuse_other_tokenizer(minilm_dir, minilm_dir, tmp_path / "no_such_tokenizer")


def test_complete_units_of_a_nan_checkpoint_are_not_read_again_unless_retrained(minilm_dir, tmp_path):
    """The check reads a checkpoint only when some unit of it is still to train; `--force finetune`
    (retrain) checks before any finished unit is cleared."""
    from common.atomic import write_marker
    from finetuning.config import FinetuneConfig
    from finetuning.fanout import plan, refuse_nonfinite_encoders

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    with torch.no_grad():
        model.bert.pooler.dense.bias[0] = float("nan")
    write_hf_dir(model, tmp_path / "nan", minilm_dir)
    cfg = FinetuneConfig(tasks=["sst2"], seeds=[1, 2])
    jobs = plan(cfg, [str(tmp_path / "nan")], tmp_path / "ft")
    with pytest.raises(UserError, match="bert.pooler.dense.bias"):
        refuse_nonfinite_encoders(cfg, jobs)
    for job in jobs:
        job.out_dir.mkdir(parents=True)
        write_marker(job.out_dir)
    refuse_nonfinite_encoders(cfg, jobs)  # every unit complete: nothing to train, nothing read
    with pytest.raises(UserError, match="bert.pooler.dense.bias"):
        refuse_nonfinite_encoders(cfg, jobs, retrain=True)


def test_a_nan_pooler_is_refused_only_for_tasks_whose_head_reads_it(minilm_dir, tmp_path):
    """Token and span heads (NER, SQuAD) take the encoder without its pooler: a NaN there does not
    reach their units, so a run of those tasks alone goes on; with a GLUE task beside them it is
    refused, and a NaN in the encoder proper is refused for every task."""
    from finetuning.config import FinetuneConfig
    from finetuning.fanout import plan, refuse_nonfinite_encoders

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    with torch.no_grad():
        model.bert.pooler.dense.weight[0, 0] = float("nan")
    write_hf_dir(model, tmp_path / "nan", minilm_dir)
    checkpoint = [str(tmp_path / "nan")]
    token_tasks = FinetuneConfig(tasks=["conll2003", "squad"], seeds=[1])
    refuse_nonfinite_encoders(token_tasks, plan(token_tasks, checkpoint, tmp_path / "ft"))
    with_glue = FinetuneConfig(tasks=["conll2003", "stsb"], seeds=[1])
    with pytest.raises(UserError, match="bert.pooler.dense.weight"):
        refuse_nonfinite_encoders(with_glue, plan(with_glue, checkpoint, tmp_path / "ft"))

    with torch.no_grad():
        model.bert.encoder.layer[1].output.dense.bias[0] = float("inf")
    write_hf_dir(model, tmp_path / "inf", minilm_dir)
    with pytest.raises(UserError, match="bert.encoder.layer.1.output.dense.bias"):
        refuse_nonfinite_encoders(token_tasks, plan(token_tasks, [str(tmp_path / "inf")], tmp_path / "ft"))


def test_a_weights_file_given_as_the_finetune_checkpoint_is_named_a_file(good, tmp_path, capsys):
    """--checkpoint DIR/model.safetensors said "checkpoint directory ... does not exist" of a file that
    exists: it is said to be a file, as import-hf and export-hf say it, naming the folder to pass."""
    weights = good / "model.safetensors"
    argv = ["finetune", "--checkpoint", str(weights), "--tasks", "sst2", "--output", str(tmp_path / "o")]
    err = expect_cli_error(argv, capsys, f"{weights} is a file, not a checkpoint directory", f"pass {good}, ")
    assert "does not exist" not in err and not (tmp_path / "o").exists()


def test_export_of_a_fine_tuned_model_names_the_task_head_it_leaves_out(good, tmp_path, capsys):
    """A transformers BertForSequenceClassification directory: export-hf writes BertForPreTraining,
    which has no place for `classifier.*`; the command says which tensors it left out and where the
    fine-tuned model is, rather than dropping them silently."""
    from safetensors.torch import load_file, save_file

    tuned = copy_dir(good, tmp_path / "tuned")
    state = {k: v for k, v in load_file(tuned / "model.safetensors").items() if not k.startswith("cls.")}
    state |= {"classifier.weight": torch.zeros(3, 128), "classifier.bias": torch.zeros(3)}
    save_file(state, tuned / "model.safetensors")
    config = json.loads((tuned / "config.json").read_text())
    (tuned / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForSequenceClassification"]})
    )
    (tuned / "vocab.txt").write_text(SPECIALS + "".join(f"w{i}\n" for i in range(59)))

    assert cli(["export-hf", str(tuned), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "warning: left out of the export" in out and "classifier.bias, classifier.weight" in out, out
    assert f"(BertForSequenceClassification), load {tuned} itself with transformers" in out, out


def _tree(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("command", ["import-hf", "export-hf"])
def test_an_output_inside_or_holding_its_input_is_refused_before_any_work(good, tmp_path, capsys, command):
    """`import-hf SRC SRC/sub` (and export-hf) wrote a model into the source checkpoint's folder;
    an OUT_DIR holding the source (a finished model directory) is replaced as a whole, the source
    with it. Both are refused naming both paths, and nothing is written."""
    vocab = SPECIALS + "".join(f"w{i}\n" for i in range(59))  # the 64 rows of `good`
    src = copy_dir(good, tmp_path / "src")
    (src / "vocab.txt").write_text(vocab)  # export-hf needs a tokenizer
    before = _tree(src)
    for out in (src / "sub", src):
        if command == "export-hf" and out == src:
            continue  # export-hf's own message for its checkpoint itself (refuse_own_model_dir)
        where = "is" if out == src else "lies inside"
        expect_cli_error(
            [command, str(src), str(out)], capsys, f"output {out} {where} the", str(src), "OUT_DIR"
        )
        assert _tree(src) == before and not (src / "sub").exists()
    holder = tmp_path / "holder"
    assert cli(["import-hf", str(good), str(holder)]) == 0  # a finished model directory
    inner = copy_dir(src, holder / "src")
    what = "source checkpoint" if command == "import-hf" else "checkpoint"
    expect_cli_error(
        [command, str(inner), str(holder)],
        capsys,
        f"output {holder} holds the {what} {inner}; {command} would replace {holder} as a whole, and "
        f"the {what} in it with it.",
        f"Fix: give {command} an OUT_DIR apart from {inner} (neither it, nor inside it, nor holding it).",
    )
    assert inner.is_dir() and _tree(inner) == before
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text(vocab)
    expect_cli_error(
        [command, str(good), str(tok / "model"), "--tokenizer", str(tok)], capsys, "the tokenizer", str(tok)
    )
    assert sorted(p.name for p in tok.iterdir()) == ["vocab.txt"]
