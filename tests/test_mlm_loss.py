"""The fused MLM loss (`model.mlm_loss`) equals the unfused `cross_entropy(linear(...))`: loss,
top-1 ids and every gradient, whatever the chunking, and the model's CPU training path uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.config import BertConfig
from model.heads import BertForPreTraining
from model.mlm_loss import linear_cross_entropy
from training.evaluate import PretrainEval


def _leaves(n: int, hidden: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.5).requires_grad_()
    b = torch.randn(vocab, generator=g).requires_grad_()
    return h, w, b, torch.randint(0, vocab, (n,), generator=g)


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 1000])
def test_fused_loss_top1_and_gradients_equal_the_unfused_ones(chunk_rows: int) -> None:
    h, w, b, y = _leaves(150, 16, 300, seed=chunk_rows)
    ref_h, ref_w, ref_b = (t.detach().clone().requires_grad_() for t in (h, w, b))
    logits = F.linear(ref_h, ref_w, ref_b)
    (F.cross_entropy(logits, y) * 0.37).backward()  # a scale other than 1 reaches every gradient

    loss, top1 = linear_cross_entropy(h, w, b, y, chunk_rows=chunk_rows)
    (loss * 0.37).backward()
    torch.testing.assert_close(loss, F.cross_entropy(logits, y))
    assert torch.equal(top1, logits.argmax(-1))
    for got, want in ((h, ref_h), (w, ref_w), (b, ref_b)):
        torch.testing.assert_close(got.grad, want.grad)


def test_fused_loss_without_gradients_still_gives_loss_and_top1() -> None:
    h, w, b, y = _leaves(40, 8, 50, seed=0)
    with torch.no_grad():
        loss, top1 = linear_cross_entropy(h, w, b, y, chunk_rows=16)
        logits = F.linear(h, w, b)
    torch.testing.assert_close(loss, F.cross_entropy(logits, y))
    assert torch.equal(top1, logits.argmax(-1))


def test_fused_loss_refuses_ignored_labels_and_empty_input() -> None:
    h, w, b, y = _leaves(4, 8, 50, seed=0)
    with pytest.raises(ValueError, match="ignored"):
        linear_cross_entropy(h, w, b, torch.tensor([1, -100, 2, 3]))
    with pytest.raises(ValueError, match="at least one row"):
        linear_cross_entropy(h[:0], w, b, y[:0])


def _batch() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(5, 300, (3, 16))
    mask = torch.ones_like(ids)
    mask[2, 10:] = 0
    return {
        "input_ids": ids * mask,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "masked_lm_positions": torch.tensor([[1, 4, 0], [2, 3, 9], [5, 0, 0]]),
        "masked_lm_labels": torch.tensor([[7, 8, -100], [9, 10, 11], [12, -100, -100]]),
        "next_sentence_labels": torch.tensor([0, 1, 0]),
    }


def test_cpu_training_step_takes_the_fused_loss_with_the_unfused_loss_and_gradients() -> None:
    """fp32 with gradients on CPU runs the fused loss (no logits kept); float64 runs the unfused
    one. The two agree to float32 rounding in loss, predictions, metrics and every gradient."""
    config = BertConfig.from_preset(
        "tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    fused = BertForPreTraining(config)  # training mode, without dropout so that both see the same net
    reference = BertForPreTraining(config).double()
    reference.load_state_dict(fused.state_dict())
    batch = _batch()

    out = fused(**batch)
    want = reference(**batch)
    out.loss.backward()
    want.loss.backward()

    assert out.mlm_logits is None and want.mlm_logits is not None
    torch.testing.assert_close(out.mlm_loss.double(), want.mlm_loss.double(), rtol=1e-5, atol=1e-6)
    assert torch.equal(out.mlm_predictions, want.mlm_logits.argmax(-1))
    assert PretrainEval.of_batch(out, batch).mlm_correct == PretrainEval.of_batch(want, batch).mlm_correct
    grads = dict(reference.named_parameters())
    for name, param in fused.named_parameters():
        torch.testing.assert_close(param.grad.double(), grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)
