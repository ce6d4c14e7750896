"""`bertflow evaluate`: held-out MLM/NSP figures equal transformers', baselines, refusals."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.model_dir import publish_model_dir
from pipelines.cli import main as cli_main
from pipelines.evaluate_command import evaluate_checkpoint
from tests.pretrain_runs import cli_env
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from training.data import ExampleStore, collate, load_split
from training.evaluate import mlm_baselines, train_target_counts


@pytest.fixture(scope="module")
def shards_and_tokenizer(tmp_path_factory, minilm_dir, data_dir):
    root = tmp_path_factory.mktemp("evaluate")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    return make_shards(root / "shards", tok, data_dir, num_docs=200), tok


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, shards_and_tokenizer):
    _, tok = shards_and_tokenizer
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    return publish_model_dir(model, tmp_path_factory.mktemp("m") / "model", tok)


def test_figures_equal_transformers_on_the_same_examples(shards_and_tokenizer, model_dir):
    from transformers import BertForPreTraining as HFBert

    shards, _ = shards_and_tokenizer
    ours = evaluate_checkpoint(model_dir, shards, "validation", batch_size=7)
    store = load_split(shards, "validation")
    hf = HFBert.from_pretrained(model_dir, attn_implementation="eager").eval()
    batch = collate(store, np.arange(len(store)))
    with torch.no_grad():
        out = hf(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
        )
    pos, lab = batch["masked_lm_positions"], batch["masked_lm_labels"]
    logits = torch.take_along_dim(out.prediction_logits, pos.unsqueeze(-1), dim=1)  # [B,P,V]
    keep = lab != -100
    logits, lab = logits[keep], lab[keep]
    nsp = batch["next_sentence_labels"]
    expected = {
        "val_mlm_acc": (logits.argmax(-1) == lab).float().mean().item(),
        "val_mlm_loss": torch.nn.functional.cross_entropy(logits, lab).item(),
        "val_nsp_acc": (out.seq_relationship_logits.argmax(-1) == nsp).float().mean().item(),
        "val_nsp_loss": torch.nn.functional.cross_entropy(out.seq_relationship_logits, nsp).item(),
    }
    assert ours["examples"] == len(store) and ours["masked_tokens"] == int(keep.sum())
    for key, value in expected.items():
        assert ours["metrics"][key] == pytest.approx(value, abs=1e-4), key
    # a random model cannot beat a context-free predictor, and the command says so
    assert ours["beats_unigram"] is False


def _store(mlm_ids: list[int], per_example: int, nsp_labels: list[int] | None = None) -> ExampleStore:
    n = len(mlm_ids) // per_example
    nsp = [0, 1] * (n // 2) + [0] * (n % 2) if nsp_labels is None else nsp_labels
    return ExampleStore(
        input_ids=np.zeros(4 * n, np.int32),
        segment_ids=np.zeros(4 * n, np.int8),
        offsets=np.arange(0, 4 * n + 1, 4),
        mlm_positions=np.tile(np.arange(1, per_example + 1, dtype=np.int32), n),
        mlm_ids=np.array(mlm_ids, np.int32),
        mlm_offsets=np.arange(0, len(mlm_ids) + 1, per_example),
        nsp_labels=np.array(nsp, np.int8),
    )


def test_mlm_baselines_score_the_training_frequencies_on_the_held_out_targets():
    train_counts = np.array([0, 0, 0, 0, 0, 6, 0, 2])  # token 5 six times, 7 twice, vocabulary 8
    store = _store([5, 5, 5, 7], per_example=2)
    b = mlm_baselines(store, train_counts)
    p5, p7 = 7 / 16, 3 / 16  # add-one smoothed over the vocabulary, as the MLM bias starts
    assert b.most_frequent_token_acc == pytest.approx(0.75)
    assert b.unigram_entropy == pytest.approx(-(3 * math.log(p5) + math.log(p7)) / 4)
    assert b.nsp_majority_acc == pytest.approx(0.5)
    first = mlm_baselines(store, train_counts, num_examples=1)  # only the first example's masked tokens
    assert first.most_frequent_token_acc == 1.0 and first.unigram_entropy == pytest.approx(-math.log(p5))


def test_the_most_frequent_token_is_the_training_sets_not_the_held_out_ones():
    """Held-out targets 5, 5, 5, 7 but 7 the most frequent training target: a context-free model
    predicts 7 and scores 1/4, not the 3/4 of the held-out sample's own majority."""
    b = mlm_baselines(_store([5, 5, 5, 7], per_example=2), np.array([0, 0, 0, 0, 0, 2, 0, 6]))
    assert b.most_frequent_token_acc == pytest.approx(0.25)


def test_nsp_majority_is_the_more_frequent_label_of_the_evaluated_examples():
    store = _store([5] * 8, per_example=2, nsp_labels=[0, 0, 0, 1])
    train_counts = np.array([0, 0, 0, 0, 0, 1])
    assert mlm_baselines(store, train_counts).nsp_majority_acc == pytest.approx(0.75)  # "is next" (0) wins
    assert mlm_baselines(_store([5] * 8, 2, [1, 1, 1, 0]), train_counts).nsp_majority_acc == pytest.approx(
        0.75
    )
    # only the first num_examples count: the first two are both "is next"
    assert mlm_baselines(store, train_counts, num_examples=2).nsp_majority_acc == 1.0


def test_evaluation_leaves_the_model_in_the_mode_it_was_in(shards_and_tokenizer):
    """Pretraining evaluates held-out figures between steps: dropout must be on again afterwards
    (and a model in eval mode stays there)."""
    from training.evaluate import evaluate_pretraining

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=30522))
    batches = [collate(load_split(shards_and_tokenizer[0], "validation"), np.arange(2))]
    for training in (True, False):
        model.train(training)
        evaluate_pretraining(model, batches, torch.device("cpu"))
        assert all(m.training is training for m in model.modules())


def test_a_small_held_out_sample_does_not_make_the_unigram_baseline_look_low():
    """Four held-out targets, each a different token of a uniform vocabulary of 8: their own
    frequencies have an entropy of log 4, but no context-free predictor does better than log 8 on
    them (the defect: the baseline was the sample's own entropy, far below what a model that has
    learned only frequencies scores on a small validation split)."""
    b = mlm_baselines(_store([1, 2, 3, 4], per_example=2), np.full(8, 10))
    assert b.unigram_entropy == pytest.approx(math.log(8))


def test_train_target_counts_read_the_train_splits_masked_ids(shards_and_tokenizer):
    shards, _ = shards_and_tokenizer
    expected = np.bincount(load_split(shards, "train").mlm_ids, minlength=30522)
    assert np.array_equal(train_target_counts(shards, 30522), expected)


def test_max_examples_limits_the_figures_and_the_baselines(shards_and_tokenizer, model_dir):
    shards, _ = shards_and_tokenizer
    store = load_split(shards, "validation")
    result = evaluate_checkpoint(model_dir, shards, max_examples=5)
    assert result["examples"] == 5 and result["masked_tokens"] == int(store.mlm_offsets[5])
    counts = train_target_counts(shards, 30522)
    assert result["baselines"] == mlm_baselines(store, counts, 5).as_dict()
    assert result["baselines"] != mlm_baselines(store, counts).as_dict()  # those of all examples differ


def test_the_output_says_which_of_the_splits_examples_it_measured(shards_and_tokenizer, model_dir):
    """A pretraining's card measures the split's first examples (pretrain.eval_batches), evaluate the
    whole split: each says how many of how many, so two held-out losses of one model compare."""
    from pipelines.evaluate_command import format_result

    shards, _ = shards_and_tokenizer
    total = len(load_split(shards, "validation"))
    part = evaluate_checkpoint(model_dir, shards, max_examples=5)
    assert part["split_examples"] == total > 5
    assert f"(validation, the first 5 of {total:,} examples, " in format_result(part)
    whole = evaluate_checkpoint(model_dir, shards)
    assert f"(validation, all {total:,} examples, " in format_result(whole)
    # --split train: its figures were named val_* (held-out) in --json and the printed line
    train = evaluate_checkpoint(model_dir, shards, split="train", max_examples=5)
    assert sorted(train["metrics"]) == ["train_mlm_acc", "train_mlm_loss", "train_nsp_acc", "train_nsp_loss"]
    assert "(train, the first 5 of " in format_result(train)


def test_a_checkpoint_without_an_nsp_head_reports_no_nsp_figures(shards_and_tokenizer, tmp_path):
    """A Hugging Face BertForMaskedLM has no next-sentence layer: the one loaded in its place is
    random, so its accuracy is not a figure of the checkpoint and is left out."""
    from transformers import BertConfig as HFConfig
    from transformers import BertForMaskedLM

    from pipelines.evaluate_command import format_result

    shards, tok = shards_and_tokenizer
    cfg = HFConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2)
    mlm_only = tmp_path / "mlm"
    BertForMaskedLM(cfg).save_pretrained(mlm_only)
    shutil.copytree(tok, mlm_only, dirs_exist_ok=True)
    result = evaluate_checkpoint(mlm_only, shards, max_examples=8)
    assert "val_mlm_acc" in result["metrics"] and not [k for k in result["metrics"] if "nsp" in k]
    assert result["nsp_at_chance"] is None
    assert "not evaluated: the checkpoint has no NSP head" in format_result(result)


def test_refuses_a_checkpoint_without_pretraining_heads(shards_and_tokenizer, minilm_dir):
    shards, _ = shards_and_tokenizer
    with pytest.raises(UserError, match="no pretraining heads"):
        evaluate_checkpoint(minilm_dir, shards)


def test_refuses_shards_of_another_vocabulary(shards_and_tokenizer, model_dir, tmp_path):
    shards, _ = shards_and_tokenizer
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    vocab = (other / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab[1000], vocab[1001] = vocab[1001], vocab[1000]  # same size, different ids
    (other / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (other / "tokenizer.json").unlink()  # (beside it, a folder whose two files disagree is refused first)
    with pytest.raises(UserError, match="different tokenizer") as refused:
        evaluate_checkpoint(other, shards)
    message = str(refused.value)
    assert "vocabulary (tokens and their ids) differs" in message
    assert (
        "--tokenizer" not in message and f"bertflow preprocess --vocab {other}" in message
    )  # evaluate has no --tokenizer


def test_a_model_resaved_by_transformers_is_evaluated_on_the_shards_of_its_vocabulary(
    shards_and_tokenizer, model_dir, tmp_path
):
    """save_pretrained rewrites the tokenizer files (transformers 5 writes only tokenizer.json):
    the same tokens and ids in other bytes were refused as "made with a different tokenizer"."""
    from transformers import AutoTokenizer
    from transformers import BertForPreTraining as HFBert

    shards, _ = shards_and_tokenizer
    resaved = tmp_path / "resaved"
    HFBert.from_pretrained(model_dir).save_pretrained(resaved)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(resaved)
    assert (resaved / "tokenizer.json").read_bytes() != (model_dir / "tokenizer.json").read_bytes()
    result = evaluate_checkpoint(resaved, shards, max_examples=4)
    assert result["vocabulary_checked"] is True and result["examples"] == 4


def test_cli_prints_figures_and_exits_2_on_missing_shards(model_dir, shards_and_tokenizer, tmp_path, capsys):
    shards, _ = shards_and_tokenizer
    assert (
        cli_main(["evaluate", str(model_dir), "--shards", str(shards), "--json", str(tmp_path / "e.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "masked LM   accuracy" in out and "chance level" in out
    assert out.startswith(f"{model_dir} (model directory) on {shards} (validation, ")  # what was read
    # an untrained NSP head is marked at chance too, not printed as an ordinary figure
    nsp = next(line for line in out.splitlines() if "next sent." in line)
    assert "(chance: within noise of the majority label)" in nsp
    assert (tmp_path / "e.json").is_file()
    assert cli_main(["evaluate", str(model_dir), "--shards", str(tmp_path / "none")]) == 2
    assert "no shards" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("shape", "refusal"),
    [
        ({"max_position_embeddings": 16}, r"-token examples, but .* has 16 positions"),
        ({"type_vocab_size": 1}, r"\(and 1 segment types\)"),  # the shards hold sentence pairs
    ],
)
def test_refuses_examples_the_checkpoint_has_no_position_or_segment_type_for(
    shards_and_tokenizer, tmp_path, shape, refusal
):
    """A model with fewer positions, or fewer segment types, than the shards' examples use: one
    message naming both, not an IndexError from the embedding lookup (a device-side assert on a GPU)."""
    shards, tok = shards_and_tokenizer
    small = BertConfig.from_preset("tiny", vocab_size=30522, **shape)
    model_dir = publish_model_dir(BertForPreTraining(small), tmp_path / "small", tok)
    with pytest.raises(UserError, match=refusal):
        evaluate_checkpoint(model_dir, shards)


def test_refuses_a_token_id_equal_to_the_vocabulary_size(shards_and_tokenizer, tmp_path):
    """Ids run from 0 to vocab_size - 1: a shard id equal to the size is past the vocabulary (no
    tokenizer files here, so only the ids' range is checked), while one below it is evaluated."""
    shards, _ = shards_and_tokenizer
    largest = load_split(shards, "validation").max_token_id
    for vocab_size in (largest, largest + 1):
        model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=vocab_size))
        model_dir = publish_model_dir(model, tmp_path / str(vocab_size), None)
        if vocab_size == largest:
            with pytest.raises(UserError, match=f"hold token id {largest}, but .* vocabulary of {largest}"):
                evaluate_checkpoint(model_dir, shards)
        else:
            assert evaluate_checkpoint(model_dir, shards, max_examples=2)["examples"] == 2


def test_a_checkpoint_without_tokenizer_files_is_evaluated_with_a_note(
    shards_and_tokenizer, model_dir, tmp_path
):
    """Without vocab.txt / tokenizer.json the vocabulary cannot be compared with the shards': the
    figures come with a note saying so, and the JSON records it."""
    from pipelines.evaluate_command import format_result

    shards, _ = shards_and_tokenizer
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, ignore=shutil.ignore_patterns("vocab.txt", "tokenizer*"))
    result = evaluate_checkpoint(bare, shards, max_examples=16)
    assert result["vocabulary_checked"] is False
    assert "could not be compared with the shards' tokenizer" in format_result(result)
    assert evaluate_checkpoint(model_dir, shards, max_examples=16)["vocabulary_checked"] is True


def test_a_json_target_that_cannot_be_a_file_is_refused_before_evaluating(
    model_dir, shards_and_tokenizer, tmp_path, capsys
):
    """A folder as --json evaluated first, then ended in an IsADirectoryError traceback."""
    shards, _ = shards_and_tokenizer
    (tmp_path / "a_file").write_text("x")
    for target, words in (
        (tmp_path, "is a folder, not a file"),
        (tmp_path / "a_file" / "e.json", "lies below"),
    ):
        argv = ["evaluate", str(model_dir), "--shards", str(shards), "--json", str(target)]
        assert cli_main(argv) == 2
        out, err = capsys.readouterr()
        assert f"--json {target} {words}" in err and "Traceback" not in err
        assert "masked LM" not in out  # nothing was evaluated


def test_an_empty_split_is_refused_before_the_checkpoint_is_loaded(
    model_dir, shards_and_tokenizer, tmp_path, capsys, monkeypatch
):
    """A tiny corpus cut into many shards leaves the validation split empty (one shard of 0 rows,
    as preprocess writes it): evaluating it ended in KeyError 'val_mlm_acc' after loading."""
    import json

    from preprocessing import shard_format

    shards = tmp_path / "shards"
    shutil.copytree(shards_and_tokenizer[0], shards)
    shutil.rmtree(shards / "validation")
    name = shard_format.shard_name(0, 1)
    empty = shard_format.write_shard(shards / "validation" / name, shard_format.rows_to_table([]))
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["validation"] = [empty]
    (shards / "manifest.json").write_text(json.dumps(manifest))

    def no_loading(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded")

    monkeypatch.setattr("pipelines.evaluate_command.resolve_model", no_loading)
    assert cli_main(["evaluate", str(model_dir), "--shards", str(shards)]) == 2
    err = capsys.readouterr().err
    assert f"the validation split of {shards} is empty" in err and "--split train" in err
    assert "preprocess.validation_fraction" in err and "Traceback" not in err


def test_the_verdicts_follow_the_figures_both_ways():
    """Beats the unigram baseline only clearly below its entropy; NSP at chance only within noise of
    the majority label; the printed figures carry the warning and the chance mark accordingly."""
    from finetuning.chance import nsp_at_chance
    from pipelines.evaluate_command import format_result
    from training.evaluate import MlmBaselines, beats_unigram

    baselines = MlmBaselines(most_frequent_token_acc=0.05, unigram_entropy=7.0, nsp_majority_acc=0.5)
    assert beats_unigram({"val_mlm_loss": 6.5}, baselines) is True
    assert beats_unigram({"val_mlm_loss": 6.95}, baselines) is False  # within the 0.1-nat margin
    assert beats_unigram({"val_mlm_loss": math.nan}, baselines) is False
    # clearly below the entropy, but its accuracy no better than always the most frequent token
    assert beats_unigram({"val_mlm_loss": 6.85, "val_mlm_acc": 0.04}, baselines) is False
    assert beats_unigram({"val_mlm_loss": 6.85, "val_mlm_acc": 0.06}, baselines) is True
    reference = baselines.as_dict()
    assert nsp_at_chance({"val_nsp_acc": 0.80}, reference, 1000) is False
    assert nsp_at_chance({"val_nsp_acc": 0.51}, reference, 1000) is True
    assert nsp_at_chance({"val_nsp_acc": 0.80}, reference, None) is None

    def printed(loss: float, nsp_acc: float, mlm_acc: float = 0.3) -> str:
        metrics = {"val_mlm_acc": mlm_acc, "val_mlm_loss": loss, "val_nsp_acc": nsp_acc, "val_nsp_loss": 0.5}
        result = {"checkpoint": "m", "shards": "s", "split": "validation", "examples": 1000}
        result |= {"masked_tokens": 15000, "metrics": metrics, "baselines": reference}
        result |= {"beats_unigram": beats_unigram(metrics, baselines)}
        return format_result(result | {"nsp_at_chance": nsp_at_chance(metrics, reference, 1000)})

    learned, plateau = printed(5.0, 0.80), printed(6.99, 0.51)
    assert "WARNING" not in learned and "(chance" not in learned
    assert "chance level" in plateau and "(chance: within noise of the majority label)" in plateau
    # below the entropy, but within the margin: the warning says by how much it must be below
    within = printed(6.95, 0.80)
    assert "not below the unigram entropy by more than 0.1 nats (6.9500 against 7.0000)" in within, within
    frequent = printed(6.85, 0.80, mlm_acc=0.04)  # below by more than the margin, its accuracy not
    assert (
        "WARNING: the masked-LM accuracy is not above always guessing the most frequent token (0.0400 "
        "against 0.0500), though the loss is 0.1500 nats below the unigram entropy: this model does no "
        "better than predicting token frequencies without context (chance level)." in frequent
    ), frequent


def test_a_checkpoint_with_nan_weights_is_refused_naming_the_weight_before_evaluating(
    model_dir, shards_and_tokenizer, tmp_path, capsys
):
    """A diverged model was evaluated in full and exited 0 with a warning naming no weight, its
    --json holding bare NaN; export-hf, import-hf and finetune refuse it naming the weight."""
    from safetensors.torch import load_file, save_file

    shards, _ = shards_and_tokenizer
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = load_file(broken / "model.safetensors")
    name = "bert.encoder.layer.0.attention.self.query.weight"
    weights[name][0, 0] = math.nan
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    argv = ["evaluate", str(broken), "--shards", str(shards), "--json", str(tmp_path / "e.json")]
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert f"weight '{name}' contains NaN or Inf" in err and "an earlier checkpoint" in err
    assert "masked LM" not in out and not (tmp_path / "e.json").exists()


def test_figures_that_are_not_finite_are_written_as_null_not_bare_nan(tmp_path, capsys, monkeypatch):
    """JSON has no NaN: a non-finite figure (e.g. the baselines of a split without masked
    tokens) is written as null in --json and in the printed line, which strict readers accept."""
    import json

    metrics = {"val_mlm_acc": 0.1, "val_mlm_loss": math.inf, "val_nsp_acc": 0.5, "val_nsp_loss": 0.7}
    result = {"checkpoint": "m", "shards": "s", "split": "validation", "examples": 1, "masked_tokens": 1}
    result |= {
        "metrics": metrics,
        "baselines": dict.fromkeys(
            ("most_frequent_token_acc", "unigram_entropy", "nsp_majority_acc"), math.nan
        ),
    }
    result |= {"beats_unigram": False, "nsp_at_chance": None}
    monkeypatch.setattr("pipelines.evaluate_command.evaluate_checkpoint", lambda *a, **k: result)

    def strict(text: str) -> dict:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))

    assert cli_main(["evaluate", "m", "--shards", "s", "--json", str(tmp_path / "e.json")]) == 0
    written = strict((tmp_path / "e.json").read_text())
    assert written["metrics"]["val_mlm_loss"] is None and written["baselines"]["unigram_entropy"] is None
    assert written["metrics"]["val_mlm_acc"] == 0.1
    capsys.readouterr()
    assert cli_main(["evaluate", "m", "--shards", "s"]) == 0
    assert strict(capsys.readouterr().out.splitlines()[-1])["metrics"]["val_mlm_loss"] is None


def test_an_import_whose_heads_were_freshly_initialized_is_refused_as_its_source_is(
    shards_and_tokenizer, minilm_dir, tmp_path, capsys
):
    """import-hf of MiniLM (no pretraining heads) fills them in freshly and lists them in its
    _COMPLETE.json: evaluate scored those random heads and blamed the model (accuracy 0, chance
    level). It is refused as MiniLM itself is, and so is an export-hf of the import."""
    shards, _ = shards_and_tokenizer
    imported, exported = tmp_path / "imported", tmp_path / "exported"
    assert cli_main(["import-hf", str(minilm_dir), str(imported)]) == 0
    assert cli_main(["export-hf", str(imported), str(exported)]) == 0
    capsys.readouterr()
    for checkpoint in (imported, exported):
        assert cli_main(["evaluate", str(checkpoint), "--shards", str(shards)]) == 2
        out, err = capsys.readouterr()
        assert f"{checkpoint} has no pretraining heads (cls.predictions." in err
        assert "were freshly initialized, not trained" in err and "pretrain.init_from" in err
        assert "masked LM" not in out


@pytest.mark.parametrize("inside", ["manifest.json", "train"])
def test_a_path_inside_the_shard_directory_is_refused_naming_the_directory(
    model_dir, shards_and_tokenizer, capsys, inside
):
    """--shards S/manifest.json said ".../manifest.json/manifest.json is missing" (S/train the same
    kind): the folder to pass is named instead."""
    shards, _ = shards_and_tokenizer
    assert cli_main(["evaluate", str(model_dir), "--shards", str(shards / inside)]) == 2
    err = capsys.readouterr().err
    assert (
        f"lies inside one, {shards}" in err
        and f"Fix: pass {shards}, the folder that holds manifest.json" in err
    )
    assert f"{inside}/manifest.json" not in err


def test_a_split_the_shards_do_not_have_is_refused_listing_those_they_have(
    model_dir, shards_and_tokenizer, capsys
):
    """--split test said only "has no 'test' split", leaving the user to guess the valid names."""
    shards, _ = shards_and_tokenizer
    assert cli_main(["evaluate", str(model_dir), "--shards", str(shards), "--split", "test"]) == 2
    err = capsys.readouterr().err
    assert "has no 'test' split; its splits are 'train', 'validation'" in err and "Traceback" not in err


# a one-rank ZeRO-2 checkpoint of an untrained tiny BERT (vocabulary 30522), as pretraining writes one
WRITE_ZERO_CHECKPOINT = """
import os, socket, sys
from pathlib import Path
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed, torch
from model.config import BertConfig
from model.heads import BertForPreTraining
from training import checkpoint
cfg = BertConfig.from_preset("tiny", vocab_size=30522)
model = BertForPreTraining(cfg)
from training.build_ops import leave_out_cpu_inference_op
leave_out_cpu_inference_op()  # as every CPU rank of ours: no JIT build of an op training never calls
deepspeed.init_distributed(dist_backend="gloo")
ds = {"train_batch_size": 1, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=ds)
tags = Path(sys.argv[1]) / "checkpoints"
engine.save_checkpoint(str(tags), tag="global_step1")
checkpoint.write_verification(tags / "global_step1", {"step": 1, "model_config": cfg.to_hf_dict()})
"""


def test_evaluating_a_deepspeed_checkpoint_keeps_deepspeeds_lines_off_the_console(
    shards_and_tokenizer, tmp_path
):
    """On a CPU machine `bertflow evaluate RUN` printed DeepSpeed's "Setting accelerator to CPU" warning
    and its "Loading checkpoint shards" bar, library noise pretraining keeps in launcher.log; the
    console now shows the command's own lines only (its figures, and its note on the vocabulary)."""
    from common.paths import PROJECT_ROOT

    shards, _ = shards_and_tokenizer
    run = tmp_path / "run"
    made = subprocess.run(
        [sys.executable, "-c", WRITE_ZERO_CHECKPOINT, str(run)],
        cwd=PROJECT_ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "evaluate",
        str(run),
        "--shards",
        str(shards),
        "--max-examples",
        "8",
    ]
    res = subprocess.run(cmd, cwd=PROJECT_ROOT, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    console = res.stdout + res.stderr
    for noise in ("accelerator", "[WARNING]", "[INFO]", "Loading checkpoint shards"):
        assert noise not in console, console
    assert res.stdout.startswith(
        f"{run} (DeepSpeed checkpoint global_step1) on {shards} (validation, the first 8 of "
    )
    assert "NOTE: the checkpoint has no vocab.txt or tokenizer.json" in res.stdout  # the command's own


def test_a_folder_above_shard_directories_is_refused_naming_them(
    model_dir, shards_and_tokenizer, tmp_path, capsys
):
    """--shards runs (or runs/latest, runs/preprocess: the folders a user finds first) said
    "runs/manifest.json is missing. Fix: run `bertflow preprocess`", as if there were no shards: the
    shard directories below the folder are named instead (one link to a directory: once)."""
    shards, _ = shards_and_tokenizer
    run = tmp_path / "runs"
    (run / "preprocess").mkdir(parents=True)
    (run / "preprocess" / "k1").symlink_to(shards)
    (run / "latest").mkdir()
    (run / "latest" / "preprocess").symlink_to(shards)
    for passed, below in (
        (run, run / "latest" / "preprocess"),
        (run / "preprocess", run / "preprocess" / "k1"),
    ):
        assert cli_main(["evaluate", str(model_dir), "--shards", str(passed)]) == 2
        err = capsys.readouterr().err
        assert f"holds one: {below}. Fix: pass {below}." in err, err
    shutil.copytree(shards, run / "preprocess" / "k2")
    assert cli_main(["evaluate", str(model_dir), "--shards", str(run / "preprocess")]) == 2
    err = capsys.readouterr().err
    assert f"holds some: {run}/preprocess/k1, {run}/preprocess/k2. Fix: pass one of them" in err, err


def test_shards_still_being_written_or_left_by_a_killed_preprocess_are_said_to_be(
    model_dir, tmp_path, capsys
):
    """--shards of a preprocess output that has no manifest yet said "manifest.json is missing. Fix:
    run `bertflow preprocess` (or the flow) to write them", whether a preprocess was writing it at
    that moment or had been killed in it: which one is said, with what to do."""
    import json
    import os

    from common.atomic import IN_PROGRESS_NAME, mark_in_progress

    half = tmp_path / "preprocess" / "k"
    mark_in_progress(half)  # this process: a live writer
    assert cli_main(["evaluate", str(model_dir), "--shards", str(half)]) == 2
    err = capsys.readouterr().err
    assert "a preprocess is writing them now" in err and "Fix: wait for it to finish." in err, err
    writer = json.loads((half / IN_PROGRESS_NAME).read_text())
    (half / IN_PROGRESS_NAME).write_text(json.dumps({**writer, "pid": 2**22 + os.getpid()}))  # gone
    assert cli_main(["evaluate", str(model_dir), "--shards", str(half)]) == 2
    err = capsys.readouterr().err
    assert "was stopped before it finished" in err and "rerun the same `bertflow preprocess`" in err, err
