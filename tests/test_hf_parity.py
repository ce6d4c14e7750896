"""Equality with `transformers` (the reference, test-only): a real checkpoint read by us, and our
export read by transformers. Also the import of every HF layout the issue lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.atomic import sha256_file
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.hf_io import load_checkpoint, load_pretraining_model, write_hf_dir
from pipelines.cli import main as cli

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

ATOL = 1e-5


def real_sentences(data_dir: Path, n: int = 8) -> list[str]:
    """The first lines of n documents of the Wikipedia summaries, cut to different lengths so
    the batch is padded."""
    docs, lines = [], (data_dir / "wiki" / "summaries_en.txt").open(encoding="utf-8")
    for line in lines:
        if line.strip() and len(docs) < n:
            words = line.split()
            docs.append(" ".join(words[: 6 + 9 * len(docs)]))
    return docs


def random_tiny(vocab_size: int = 30522, seed: int = 0, hidden_act: str = "gelu") -> BertForPreTraining:
    """A tiny model whose every tensor (biases, LayerNorms, heads) is random, so a misplaced or
    dropped key changes the outputs."""
    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=vocab_size, hidden_act=hidden_act))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def test_minilm_hidden_states_and_pooler_equal_transformers(minilm_dir, data_dir):
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok(real_sentences(data_dir), padding=True, truncation=True, max_length=128, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert (~mask).sum() > 20 and mask.sum(1).min() >= 8, "the batch must be real text with padding"

    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    ours, fresh = load_pretraining_model(minilm_dir)
    assert all(k.startswith("cls.") for k in fresh), fresh  # the file has the pooler but no heads
    with torch.no_grad():
        expected = ref(**batch)
        seq, pooled = ours.eval().bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    torch.testing.assert_close(seq[mask], expected.last_hidden_state[mask], atol=ATOL, rtol=0)
    torch.testing.assert_close(pooled, expected.pooler_output, atol=ATOL, rtol=0)
    assert seq.abs().max() > 1.0  # real activations, not a degenerate all-zero match


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"])
def test_our_export_reloaded_by_transformers_gives_same_mlm_and_nsp_logits(minilm_dir, tmp_path, hidden_act):
    """Every activation a config may name computes what transformers computes for it."""
    ours = random_tiny(hidden_act=hidden_act)
    out = tmp_path / "export"
    write_hf_dir(ours, out, minilm_dir)
    ref, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    ref.eval()

    torch.manual_seed(1)
    ids = torch.randint(1000, 30522, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 9:] = 0
    ids[mask == 0] = 0
    seg = torch.zeros_like(ids)
    seg[:, 5:] = 1
    positions = torch.tensor([[1, 7, 20], [2, 3, 14], [4, 8, 0]])
    labels = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, -100]])
    with torch.no_grad():
        got = ours(ids, seg, mask, masked_lm_positions=positions, masked_lm_labels=labels)
        want = ref(input_ids=ids, token_type_ids=seg, attention_mask=mask)
    rows = [(b, int(p)) for b in range(3) for p, lab in zip(positions[b], labels[b]) if lab != -100]
    want_mlm = torch.stack([want.prediction_logits[b, p] for b, p in rows])
    torch.testing.assert_close(got.mlm_logits, want_mlm, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.nsp_logits, want.seq_relationship_logits, atol=ATOL, rtol=0)
    assert got.nsp_logits.std() > 1e-3 and got.mlm_logits.std() > 1e-2


def test_export_cli_output_loads_in_automodel_and_autotokenizer(minilm_dir, data_dir, tmp_path, capsys):
    ckpt, full, enc = tmp_path / "ckpt", tmp_path / "hf", tmp_path / "hf-encoder"
    write_hf_dir(random_tiny(), ckpt)  # a checkpoint without tokenizer files
    assert cli(["export-hf", str(ckpt), str(full), "--tokenizer", str(minilm_dir)]) == 0
    assert cli(["export-hf", str(ckpt), str(enc), "--tokenizer", str(minilm_dir), "--encoder-only"]) == 0
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (full / name).is_file() and (enc / name).is_file(), name

    _, info = transformers.BertForPreTraining.from_pretrained(full, output_loading_info=True)
    assert not any(info.values()), info
    # BertModel has no place for the pretraining heads: they are its only unexpected keys.
    _, info = transformers.AutoModel.from_pretrained(full, output_loading_info=True)
    assert not info["missing_keys"] and all(k.startswith("cls.") for k in info["unexpected_keys"]), info
    model, info = transformers.AutoModel.from_pretrained(enc, output_loading_info=True)
    assert type(model).__name__ == "BertModel" and not any(info.values()), info
    # the cards: fill-mask only where the heads are; the encoder-only card says why it has none
    assert "pipeline_tag: fill-mask" in (full / "README.md").read_text()
    encoder_card = (enc / "README.md").read_text()
    assert "pipeline_tag: feature-extraction" in encoder_card and 'pipeline("fill-mask"' not in encoder_card
    assert "the encoder only, without the pretraining heads" in encoder_card

    reference = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    exported = transformers.AutoTokenizer.from_pretrained(full)
    texts = real_sentences(data_dir, 4)
    assert exported(texts)["input_ids"] == reference(texts)["input_ids"]


def _layouts(tmp_path: Path, model: BertForPreTraining) -> dict[str, Path]:
    """The same weights in five HF layouts."""
    from safetensors.torch import save_file

    full = {k: v.clone() for k, v in model.state_dict().items() if k != "cls.predictions.decoder.weight"}
    encoder = {k[len("bert.") :]: v for k, v in full.items() if k.startswith("bert.")}
    dirs = {}
    for name, state, save in (
        ("with-prefix-and-heads", full, "st"),
        ("no-prefix-no-heads", encoder, "st"),
        ("heads-as-bin", full, "bin"),
    ):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
        if save == "st":
            save_file(state, str(d / "model.safetensors"))
        else:
            torch.save(state, d / "pytorch_model.bin")
        dirs[name] = d
    # `bert.` prefix without heads, TF-era LayerNorm names, as old BertModel checkpoints have them
    d = tmp_path / "prefix-gamma-beta-no-heads"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    old = {
        "bert."
        + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in encoder.items()
    }
    torch.save(old, d / "pytorch_model.bin")
    dirs["prefix-gamma-beta-no-heads"] = d
    # the MLM output bias only as the decoder's (`cls.predictions.decoder.bias`), as some
    # transformers versions save it
    d = tmp_path / "decoder-bias-with-heads"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(model.config.to_hf_dict()))
    decoder_bias = {
        k.replace("cls.predictions.bias", "cls.predictions.decoder.bias"): v for k, v in full.items()
    }
    save_file(decoder_bias, str(d / "model.safetensors"))
    dirs["decoder-bias-with-heads"] = d
    return dirs


def test_import_every_layout(tmp_path):
    source = random_tiny(vocab_size=120, seed=3)
    want = source.state_dict()
    layouts = _layouts(tmp_path, source)
    assert len(layouts) == 5
    for name, directory in layouts.items():
        has_heads = "no-heads" not in name
        loaded = load_checkpoint(directory)
        got = loaded.model.state_dict()
        for key, value in want.items():
            if key.startswith("bert.") or has_heads:
                assert torch.equal(got[key], value), (name, key)
        if has_heads:
            assert loaded.fresh == [], (name, loaded.fresh)
        else:
            assert sorted(loaded.fresh) == sorted(
                k for k in want if k.startswith("cls.") and "decoder" not in k
            )
            assert not torch.equal(got["cls.predictions.bias"], want["cls.predictions.bias"])
        assert (
            loaded.model.cls.predictions.decoder.weight is loaded.model.bert.embeddings.word_embeddings.weight
        )


def test_weights_one_tensor_at_a_time_are_the_state_dict_in_every_layout(tmp_path):
    """`iter_weights` (a pass over a checkpoint without holding it in memory) reads what
    `read_state_dict` reads, also a sharded checkpoint through its index."""
    from safetensors.torch import save_file

    from model.hf_io import iter_weights, read_state_dict

    layouts = _layouts(tmp_path, random_tiny(vocab_size=120, seed=3))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    state = read_state_dict(layouts["with-prefix-and-heads"])
    names = sorted(state)
    parts = {"part-1.safetensors": names[: len(names) // 2], "part-2.safetensors": names[len(names) // 2 :]}
    for part, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(sharded / part))
    weight_map = {k: part for part, keys in parts.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    legacy = tmp_path / "legacy-bin"  # torch < 1.6's format, which cannot be memory-mapped
    legacy.mkdir()
    torch.save(state, legacy / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    for directory in [*layouts.values(), sharded, legacy]:
        whole, streamed = read_state_dict(directory), dict(iter_weights(directory))
        assert whole.keys() == streamed.keys() and all(torch.equal(whole[k], streamed[k]) for k in whole)


def test_import_cli_reports_fresh_heads_and_keeps_outputs(minilm_dir, tmp_path, capsys):
    out = tmp_path / "ours"
    assert cli(["import-hf", str(minilm_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "freshly initialized" in printed
        and "cls.predictions" in printed
        and "cls.seq_relationship" in printed
    )
    assert "bert.pooler" not in printed  # the pooler was in the file
    marker = json.loads((out / "_COMPLETE.json").read_text())
    assert all(k.startswith("cls.") for k in marker["fresh"]) and marker["fresh"]

    source, _ = load_pretraining_model(minilm_dir)
    imported, fresh = load_pretraining_model(out)
    assert fresh == []  # our directory now carries the (fresh) heads
    for key, value in source.bert.state_dict().items():
        assert torch.equal(imported.bert.state_dict()[key], value), key


def test_import_rerun_writes_byte_identical_weights(tmp_path):
    """A rerun (e.g. after a kill) replaces the finished directory with the same bytes: even the
    freshly initialized heads come from a fixed seed."""
    source = _layouts(tmp_path, random_tiny(vocab_size=120, seed=4))["no-prefix-no-heads"]
    out = tmp_path / "ours"
    assert cli(["import-hf", str(source), str(out)]) == 0
    digest = json.loads((out / "_COMPLETE.json").read_text())["model.safetensors"]
    assert sha256_file(out / "model.safetensors") == digest
    (out / "model.safetensors").write_bytes(b"stale")
    assert cli(["import-hf", str(source), str(out)]) == 0
    assert sha256_file(out / "model.safetensors") == digest


def test_pretraining_loss_and_gradients_equal_transformers(tmp_path):
    """Our fast path (last layer and MLM head only at the masked positions) trains on exactly the
    objective of transformers' full-sequence BertForPreTraining: same loss, same gradients."""
    ours = random_tiny(vocab_size=200, seed=5)
    write_hf_dir(ours, tmp_path / "m")
    ref = transformers.BertForPreTraining.from_pretrained(tmp_path / "m").eval()
    torch.manual_seed(2)
    ids = torch.randint(5, 200, (2, 16))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    positions = torch.tensor([[2, 5, 9], [1, 4, 0]])
    labels = torch.tensor([[11, 12, 13], [14, 15, -100]])
    nsp = torch.tensor([0, 1])
    hf_labels = torch.full_like(ids, -100)
    for b in range(2):
        for p, lab in zip(positions[b], labels[b]):
            if lab != -100:
                hf_labels[b, p] = lab

    got = ours(ids, None, mask, positions, labels, nsp)
    want = ref(input_ids=ids, attention_mask=mask, labels=hf_labels, next_sentence_label=nsp)
    got.loss.backward()
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=0)
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        g, w = p.grad, ref_params[name].grad
        assert g is not None and w is not None, name
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4, msg=name)
    assert ours.bert.encoder.layer[-1].output.dense.weight.grad.abs().sum() > 0
