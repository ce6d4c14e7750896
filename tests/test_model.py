"""Model shape properties: presets, parameter counts, padding invariance, head outputs."""

from __future__ import annotations

import pytest
import torch

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining, BertForSequenceClassification, count_parameters


def _count(preset: str) -> int:
    with torch.device("meta"):
        return count_parameters(BertForPreTraining(BertConfig.from_preset(preset)))


def test_base_and_large_parameter_counts_match_the_paper():
    base, large = _count("base"), _count("large")
    assert 108e6 <= base <= 112e6, base
    assert 334e6 <= large <= 341e6, large


def test_model_info_counts_equal_transformers(capsys):
    """`bertflow model-info` prints BertForPreTraining's and BertModel's parameter counts, the
    numbers transformers gives for the same shape."""
    import transformers

    from pipelines.cli import main as cli

    assert cli(["model-info", "--preset", "base"]) == 0
    printed = capsys.readouterr().out
    cfg = transformers.BertConfig()  # BERT-base, vocabulary 30522
    with torch.device("meta"):
        total = transformers.BertForPreTraining(cfg).num_parameters()
        encoder = transformers.BertModel(cfg).num_parameters()
    assert f"parameters: {total:,} total" in printed and f"{encoder:,} in BertModel" in printed


def test_model_info_describes_a_model_folder_and_refuses_what_is_not_one(minilm_dir, tmp_path, capsys):
    """`bertflow model-info PATH`: the shape from config.json, the parameters saved (transformers'
    count for the same model), the vocabulary and whether the folder holds pretraining heads; a
    file, or a folder with neither config.json nor a DeepSpeed checkpoint, is refused naming what
    to pass."""
    import transformers

    from model.hf_io import write_hf_dir
    from pipelines.cli import main as cli

    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    write_hf_dir(model, tmp_path / "tiny")
    assert cli(["model-info", str(tmp_path / "tiny")]) == 0
    out = capsys.readouterr().out
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "tiny")
    assert out.startswith(f"{tmp_path / 'tiny'}: BERT L=2 H=128 A=2 I=512 vocab=64 positions=512"), out
    assert f"parameters: {hf.num_parameters():,} saved" in out, out
    assert f"{hf.bert.num_parameters():,} in BertModel" in out, out
    assert "vocabulary: 64 tokens" in out and "pretraining heads: yes: masked-LM and next-sentence" in out, (
        out
    )

    assert cli(["model-info", str(minilm_dir)]) == 0  # a Hugging Face encoder without heads
    out = capsys.readouterr().out
    assert "L=6 H=384 A=12" in out and "vocabulary: 30,522 tokens" in out, out
    assert "pretraining heads: no: an encoder only" in out, out

    assert cli(["model-info", str(tmp_path / "tiny" / "config.json")]) == 2
    assert "config.json is a file, not a checkpoint directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli(["model-info", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'} is not a BERT checkpoint: it has no config.json" in capsys.readouterr().err
    # a folder holding a model/ and no checkpoints (runs/latest): the model to pass is named
    write_hf_dir(model, tmp_path / "latest" / "model")
    assert cli(["model-info", str(tmp_path / "latest")]) == 2
    err = capsys.readouterr().err
    assert f"its model is {tmp_path / 'latest' / 'model'}). Fix: pass {tmp_path / 'latest' / 'model'}." in err
    assert f"({tmp_path / 'latest'} holds a model directory: " in err  # not "a pretraining output"


def test_model_info_of_a_checkpoint_and_of_fresh_heads(tmp_path, capsys, monkeypatch):
    """A pretraining output, its checkpoints/ or one global_stepN is described as the model it
    consolidates, named with its tag, with the counts of the same model's folder (tied weights once);
    a folder whose marker lists fresh head tensors (an import-hf of an encoder) says so, counting the
    heads' alone. (The DeepSpeed tag's loading is stubbed: tests/test_pretrain.py reads a real one.)"""
    import training.consolidate
    from common.atomic import write_marker
    from model.hf_io import write_hf_dir
    from pipelines.cli import main as cli

    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    write_hf_dir(model, tmp_path / "tiny")
    assert cli(["model-info", str(tmp_path / "tiny")]) == 0
    counts = capsys.readouterr().out.split("\n", 1)[1]
    run = tmp_path / "run"
    tag = run / "checkpoints" / "global_step3"
    tag.mkdir(parents=True)
    monkeypatch.setattr(training.consolidate, "resolve_tag_dir", lambda path: tag)
    monkeypatch.setattr(training.consolidate, "load_model_from_tag", lambda path: model)
    for path in (run, run / "checkpoints", tag):
        assert cli(["model-info", str(path)]) == 0, capsys.readouterr().err
        printed = capsys.readouterr().out
        assert printed.startswith(f"{path} (DeepSpeed checkpoint global_step3): BERT L=2 H=128"), printed
        assert printed.split("\n", 1)[1] == counts
    fresh = ["bert.pooler.dense.weight", "cls.predictions.bias", "cls.seq_relationship.weight"]
    write_marker(tmp_path / "tiny", {"fresh": fresh})
    assert cli(["model-info", str(tmp_path / "tiny")]) == 0
    said = "freshly initialized, not trained (_COMPLETE.json lists 2 head tensors as fresh)"
    assert said in capsys.readouterr().out


def test_unknown_preset_is_a_user_error():
    with pytest.raises(UserError, match="unknown model preset 'huge'"):
        BertConfig.from_preset("huge")


def test_padding_does_not_change_non_pad_outputs():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=500)).eval()
    ids = torch.randint(5, 500, (1, 11))
    seg = torch.zeros_like(ids)
    seg[:, 6:] = 1
    seq_a, pooled_a = model.bert(ids, seg, torch.ones_like(ids))
    pad = 7
    ids_p = torch.cat([ids, torch.zeros(1, pad, dtype=ids.dtype)], 1)
    seg_p = torch.cat([seg, torch.zeros(1, pad, dtype=seg.dtype)], 1)
    mask_p = torch.cat([torch.ones_like(ids), torch.zeros(1, pad, dtype=ids.dtype)], 1)
    seq_b, pooled_b = model.bert(ids_p, seg_p, mask_p)
    torch.testing.assert_close(seq_b[:, :11], seq_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled_b, pooled_a, atol=1e-5, rtol=1e-5)
    # and padding does change something if the mask is ignored (the test can fail)
    seq_c, _ = model.bert(ids_p, seg_p, None)
    assert not torch.allclose(seq_c[:, :11], seq_a, atol=1e-4)


def test_mlm_head_at_positions_equals_full_logits_gathered():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=300)).eval()
    ids = torch.randint(5, 300, (3, 16))
    positions = torch.tensor([[1, 4, 0], [2, 3, 9], [5, 0, 0]])
    labels = torch.tensor([[7, 8, -100], [9, 10, 11], [12, -100, -100]])
    with torch.no_grad():  # with gradients on, CPU training takes the fused loss and keeps no logits
        out = model(
            ids,
            masked_lm_positions=positions,
            masked_lm_labels=labels,
            next_sentence_labels=torch.tensor([0, 1, 0]),
        )
        full = model(ids)
    full_logits = full.mlm_logits.view(3, 16, -1)
    expect = torch.stack([full_logits[b, p] for b, p in [(0, 1), (0, 4), (1, 2), (1, 3), (1, 9), (2, 5)]])
    torch.testing.assert_close(out.mlm_logits, expect)
    assert out.mlm_labels.tolist() == [7, 8, 9, 10, 11, 12]
    assert out.loss is not None and torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss)


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=100))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_initialization_is_berts():
    """normal(0, 0.02) Linear weights, zero biases, unit LayerNorm (init_bert_weights' docstring)."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=1000))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert linears and all(m.bias is None or not m.bias.any() for m in linears)
    assert norms and all(bool((m.weight == 1).all()) and not m.bias.any() for m in norms)
    weights = torch.cat([m.weight.flatten() for m in linears])
    assert abs(weights.mean().item()) < 1e-3 and weights.std().item() == pytest.approx(0.02, rel=0.02)


def test_the_classifier_reads_the_pooled_vector_through_dropout():
    """In training mode the sequence classifier drops units of [CLS]'s pooled vector: with that
    dropout at 1 the logits are the classifier's bias alone."""
    torch.manual_seed(0)
    cfg = BertConfig.from_preset(
        "tiny", vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    model = BertForSequenceClassification(cfg, num_labels=3)
    torch.nn.init.normal_(model.classifier.bias)
    model.dropout.p = 1.0
    ids = torch.randint(0, 100, (2, 8))
    _, logits = model.train()(ids)
    torch.testing.assert_close(logits, model.classifier.bias.expand(2, 3))
    _, logits = model.eval()(ids)
    assert not torch.allclose(logits, model.classifier.bias.expand(2, 3))


def test_sequence_regression_uses_mse():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.from_preset("tiny", vocab_size=100), num_labels=1)
    loss, logits = model(torch.randint(0, 100, (4, 8)), labels=torch.tensor([0.5, 1.0, 2.0, 3.0]))
    assert logits.shape == (4, 1)
    expected = torch.nn.functional.mse_loss(logits.squeeze(-1), torch.tensor([0.5, 1.0, 2.0, 3.0]))
    torch.testing.assert_close(loss, expected)


def test_output_rows_equal_the_full_output_gathered_with_padding():
    """The pretraining shortcut (last layer only at the needed rows) is exact, padding included."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=300)).eval()
    ids = torch.randint(5, 300, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    rows = torch.tensor([[3, 3, 11, 0], [6, 1, 0, 2]])
    full, pooled_full = model.bert(ids, None, mask)
    part, pooled_part = model.bert(ids, None, mask, output_rows=rows)
    assert part.shape == (2, 4, 128)
    torch.testing.assert_close(part, torch.stack([full[b, rows[b]] for b in range(2)]))
    torch.testing.assert_close(pooled_part, pooled_full)
    # the rows really are selected: another choice of rows gives other values
    assert not torch.allclose(model.bert(ids, None, mask, output_rows=rows + 1)[0], part)


def test_shard_format_dtypes_give_the_same_loss_as_int64():
    """The shard format stores int32 ids/positions/labels and int8 segments/NSP labels."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=100)).eval()
    ids = torch.randint(5, 100, (2, 8))
    seg = torch.tensor([[0] * 4 + [1] * 4] * 2)
    positions = torch.tensor([[1, 2], [3, 4]])
    labels = torch.tensor([[5, 6], [7, -100]])
    nsp = torch.tensor([0, 1])
    narrow = model(ids.int(), seg.to(torch.int8), None, positions.int(), labels.int(), nsp.to(torch.int8))
    wide = model(ids, seg, None, positions, labels, nsp)
    torch.testing.assert_close(narrow.loss, wide.loss)
    assert narrow.mlm_labels.tolist() == [5, 6, 7]


def test_unpadded_pretraining_equals_the_padded_layout_in_loss_and_gradients():
    """The unpadded path (embeddings, projections, FFN on real tokens only) is exact: same loss and
    same gradients as the padded layout, for sequences with no, some and mostly padding."""
    torch.manual_seed(3)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=300)).eval()
    ids = torch.randint(5, 300, (3, 20))
    seg = torch.tensor([[0] * 10 + [1] * 10] * 3)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    mask[2, 4:] = 0
    ids = ids * mask  # pad id 0 at the pads, as the loader writes them
    positions = torch.tensor([[19, 3, 7], [12, 1, 0], [3, 2, 0]])
    labels = torch.tensor([[11, 12, 13], [14, 15, -100], [16, -100, -100]])
    nsp = torch.tensor([0, 1, 1])
    grads = []
    for unpad in (True, False):
        model.zero_grad(set_to_none=True)
        out = model(ids, seg, mask, positions, labels, nsp, unpad=unpad)
        out.loss.backward()
        grads.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_u, g_u), (loss_p, g_p) = grads
    torch.testing.assert_close(loss_u, loss_p, atol=1e-6, rtol=0)
    for name, g in g_p.items():
        torch.testing.assert_close(g_u[name], g, atol=1e-6, rtol=1e-5, msg=name)
    # and the work really is unpadded: the first feed-forward sees only the 20 + 13 + 4 real tokens
    seen = []
    hook = model.bert.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda _m, inputs, _o: seen.append(tuple(inputs[0].shape))
    )
    model.train()
    out = model(ids, seg, mask, positions, labels, nsp)
    hook.remove()
    assert seen == [(37, 128)]
    assert torch.isfinite(out.loss)
