"""The MLM loss fused with the vocabulary projection: `cross_entropy(h @ W.T + b, labels)` without
the [N, V] logits, their log-softmax or its backward ever being materialized.

On a small model the vocabulary projection is most of a CPU pretraining step: for the tiny preset
(L2/H128) with 16,384 WordPieces and batch 32 it took 63% of the step (docs/benchmarks.md §3), and
more than half of that was not the matrix products but passes over the [N, V] logits (log-softmax, its
backward, the zero-filled gradient of the NLL, the bias broadcast). Here the rows go through in
chunks small enough to stay in cache, and the gradients are computed in the same pass as the loss
(softmax minus one-hot, Liger-style), so backward only scales them: three matrix products and a
few in-cache passes. Equal to the unfused loss and gradients to float rounding
(`tests/test_mlm_loss.py`).
"""

from __future__ import annotations

import torch


def chunk_rows_for(hidden_size: int) -> int:
    """Rows per chunk: half the hidden size, at least 64. Measured on 2 CPU cores (1 and 2 threads,
    640 rows, docs/benchmarks.md §3): the best chunk grows with H, as small products lose efficiency:
    H 128 / V 16k best at 64 rows; H 256 / V 30k at 128-256; H 768 / V 30k at 384-640."""
    return max(64, hidden_size // 2)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T + bias` against `labels`, and the top-1 ids."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_rows):  # noqa: ANN001, ANN205 (autograd API)
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = grad_bias = None  # the first chunk's products, then summed into
        needs_grad = any(ctx.needs_input_grad[:3])
        loss = hidden.new_zeros(())
        top1 = torch.empty(n, dtype=torch.long, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            h, y = hidden[rows], labels[rows]
            logits = torch.addmm(bias, h, weight.t())
            at = torch.arange(logits.shape[0], device=logits.device)
            target = logits[at, y]
            peak, top1[rows] = logits.max(1)  # max's index is the first maximum, as argmax
            exp = logits.sub_(peak[:, None]).exp_()
            total = exp.sum(1)
            loss += (peak + total.log() - target).sum()
            if not needs_grad:
                continue
            grad_logits = exp.mul_((1.0 / (total * n))[:, None])  # softmax / n
            grad_logits[at, y] -= 1.0 / n
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if ctx.needs_input_grad[1]:
                part = grad_logits.t()
                grad_weight = part.mm(h) if grad_weight is None else grad_weight.addmm_(part, h)
            if ctx.needs_input_grad[2]:
                part = grad_logits.sum(0)
                grad_bias = part if grad_bias is None else grad_bias.add_(part)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.mark_non_differentiable(top1)
        return loss / n, top1

    @staticmethod
    def backward(ctx, grad_loss, _grad_top1):  # noqa: ANN001, ANN205 (autograd API)
        grads = ctx.saved_tensors
        if not bool(grad_loss == 1):  # 1 is the usual case: no pass over each gradient then
            grads = tuple(None if g is None else g * grad_loss for g in grads)
        return (*grads, None, None)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    labels: torch.Tensor,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, top-1 token id per row) of the logits `hidden @ weight.T + bias` [N, V]
    against `labels` [N] (every label a real token id: drop ignored rows first). N must be > 0."""
    if hidden.shape[0] == 0:
        raise ValueError("linear_cross_entropy needs at least one row")
    if bool((labels < 0).any()):
        raise ValueError("linear_cross_entropy: drop the ignored (-100) rows before calling it")
    return LinearCrossEntropy.apply(
        hidden, weight, bias, labels, chunk_rows or chunk_rows_for(hidden.shape[1])
    )
