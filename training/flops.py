"""Training FLOPs of a BERT step and model FLOPs utilization (MFU).

Per step, counting a multiply-add as 2 FLOPs and backward as twice the forward (so ×6 for
weights seen once per token, Kaplan et al. 2020):

    FLOPs = 6 · (L-1) · N_layer · T            weight matmuls of every layer but the last, T real tokens
          + 12 · (L-1) · H · B·S²               their attention scores QKᵀ and weighted sums AV
          + 6 · 2H² · T                         last layer: K and V projections on all real tokens
          + 6 · (2H² + 2·H·I) · R               last layer: Q, output projection, FFN on R rows
          + 12 · H · R · S                      last layer: attention for the R query rows
          + 6 · (H² + H·V) · M                 MLM transform + vocabulary projection, M masked tokens
          + 6 · (H² + 2H) · B                  pooler + NSP classifier, once per sequence

with N_layer = 4H² + 2·H·I (Q, K, V, output projection and the two FFN matrices; biases,
LayerNorm and embedding lookups are negligible / not matmuls) and R = M + B: our model runs the
MLM head, and the last encoder layer's queries and feed-forward, only at the masked positions
(plus [CLS] for NSP), and a padded batch runs unpadded (T = non-pad tokens ≤ B·S; only the
attention core sees the padded [B,S] layout), so these are the FLOPs actually executed (padded
masked slots, if any, are not counted).
MFU = achieved FLOP/s ÷ the device's dense peak for the training precision (GPU only).
"""

from __future__ import annotations

import re

from model.config import BertConfig

# Dense peak TFLOP/s (no sparsity) per precision; fp32 means TF32 tensor cores on Ampere+.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},  # SXM
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},
    "GH200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},  # its GPU is an H100/H200
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "V100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
    "V100S": {"bf16": 0.0, "fp16": 130.0, "fp32": 16.4},
}


def step_flops(
    cfg: BertConfig, batch: int, seq_len: int, masked_tokens: int, tokens: int | None = None
) -> float:
    """`tokens`: the non-pad tokens of the [batch, seq_len] micro batch (default: no padding)."""
    L, H, I, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size  # noqa: E741
    n_layer = 4 * H * H + 2 * H * I
    tokens, rows = batch * seq_len if tokens is None else tokens, masked_tokens + batch
    return float(
        6 * (L - 1) * n_layer * tokens
        + 12 * (L - 1) * H * batch * seq_len * seq_len
        + 6 * 2 * H * H * tokens
        + 6 * (2 * H * H + 2 * H * I) * rows
        + 12 * H * rows * seq_len
        + 6 * (H * H + H * V) * masked_tokens
        + 6 * (H * H + 2 * H) * batch
    )


def device_peak_tflops(device_name: str, precision: str, override: float | None = None) -> float | None:
    """Peak dense TFLOP/s of a GPU by name (e.g. 'NVIDIA H100 80GB HBM3'), or the override; None
    for a GPU not in the table or a precision it lacks. A table name matches as a whole model name:
    'L4' is not the peak of an L40S, nor 'A10' of an A10G."""
    if override:
        return override
    for key, table in PEAK_TFLOPS.items():
        if re.search(rf"(?<![0-9A-Z]){key}(?![0-9A-Z])", device_name.upper()):
            return table.get(precision) or None
    return None
