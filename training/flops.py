"""Training FLOPs of a BERT step and model FLOPs utilization (MFU).

Per step, counting a multiply-add as 2 FLOPs and backward as twice the forward (so ×6 for
weights seen once per token, Kaplan et al. 2020):

    FLOPs = 6 · N_enc · B·S                    encoder weight matmuls on every (padded) token
          + 12 · L · H · B·S²                   attention scores QKᵀ and the weighted sum AV
          + 6 · (H² + H·V) · M                 MLM transform + vocabulary projection, M masked tokens
          + 6 · (H² + 2H) · B                  pooler + NSP classifier, once per sequence

with N_enc = L · (4H² + 2·H·I) (Q, K, V, output projection and the two FFN matrices; biases,
LayerNorm and embedding lookups are negligible / not matmuls). The MLM head runs only on the
masked positions (our model gathers them first), which is why it is counted per masked token.
MFU = achieved FLOP/s ÷ the device's dense peak for the training precision (GPU only).
"""

from __future__ import annotations

from model.config import BertConfig

# Dense peak TFLOP/s (no sparsity) per precision; fp32 means TF32 tensor cores on Ampere+.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},  # SXM
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.5},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 60.0},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 62.5},
    "V100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
}


def step_flops(cfg: BertConfig, batch: int, seq_len: int, masked_tokens: int) -> float:
    L, H, I, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size  # noqa: E741
    n_enc = L * (4 * H * H + 2 * H * I)
    tokens = batch * seq_len
    return float(
        6 * n_enc * tokens
        + 12 * L * H * batch * seq_len * seq_len
        + 6 * (H * H + H * V) * masked_tokens
        + 6 * (H * H + 2 * H) * batch
    )


def device_peak_tflops(device_name: str, precision: str, override: float | None = None) -> float | None:
    """Peak dense TFLOP/s of a GPU by name (e.g. 'NVIDIA H100 80GB HBM3'), or the override."""
    if override:
        return override
    for key, table in PEAK_TFLOPS.items():
        if key in device_name.upper():
            return table.get(precision) or None
    return None
