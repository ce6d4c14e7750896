"""Kernel-level probes of the GPU check: which SDPA kernels run, unpadded vs padded vs varlen
attention, torch.compile on/off, the matmul ceiling. Each returns a plain dict of what it saw.

Every step timed here is forward + backward of our `BertForPreTraining` (no optimizer step), the
model in the training precision (bf16 weights on GPU, as DeepSpeed's bf16 mode holds them; fp32 on
CPU), on real batches from the carried shards. Times are medians over steps after warm-up, with
the device synchronized around each step.
"""

from __future__ import annotations

import copy
import re
import statistics
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from gpu_context import guarded

from model.bert import BertSelfAttention, Packing
from model.config import BertConfig
from model.heads import BertForPreTraining
from training.flops import step_flops

ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn|cudnn|sdpa", re.IGNORECASE)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[int], Any], calls: int, device: torch.device) -> list[float]:
    """Seconds of each `fn(i)` call, the device synchronized before and after each."""
    seconds = []
    for i in range(calls):
        synchronize(device)
        t0 = time.perf_counter()
        fn(i)
        synchronize(device)
        seconds.append(time.perf_counter() - t0)
    return seconds


def matmul_ceiling(device: torch.device, dtype: torch.dtype, n: int, reps: int = 10) -> dict[str, Any]:
    """TFLOP/s of an n×n×n matrix product on random data (the practical ceiling for MFU)."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    time_calls(lambda _i: a @ b, 3, device)  # warm-up: handles, clocks
    median = statistics.median(time_calls(lambda _i: a @ b, reps, device))
    return {
        "matmul_tflops": 2 * n**3 / median / 1e12,
        "matmul_what": f"{n}³ {str(dtype)[6:]} matmul, random data",
    }


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], **kwargs: Any) -> float:
    out = model(**batch, **kwargs)
    out.loss.backward()
    model.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def batch_flops(config: BertConfig, batch: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(FLOPs of one training step by training/flops.py, real tokens) of a collated batch."""
    b, s = batch["input_ids"].shape
    masked = int((batch["masked_lm_labels"] != -100).sum())
    tokens = int(batch["attention_mask"].sum())
    return step_flops(config, b, s, masked, tokens), tokens


@dataclass
class Steps:
    """What the timed probes share: the model shape, real batches on the device, the training dtype,
    and how many steps to warm up and to time (cycling through `batches`)."""

    config: BertConfig
    batches: list[dict[str, torch.Tensor]]
    dtype: torch.dtype
    device: torch.device
    warmup: int
    steps: int

    def model(self) -> BertForPreTraining:
        torch.manual_seed(0)
        return BertForPreTraining(self.config).to(self.device, self.dtype)


def timed_steps(
    model: torch.nn.Module, run: Steps, warmup: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Median step time over `run.steps` batches after `warmup` steps (default `run.warmup`)."""
    warmup = run.warmup if warmup is None else warmup
    batches = run.batches
    for i in range(warmup):
        train_step(model, batches[i % len(batches)], **kwargs)
    picked = [batches[(warmup + i) % len(batches)] for i in range(run.steps)]
    seconds = time_calls(lambda i: train_step(model, picked[i], **kwargs), run.steps, run.device)
    flops, tokens = zip(*(batch_flops(run.config, b) for b in picked))
    total = sum(seconds)
    return {
        "median_step_ms": 1000 * statistics.median(seconds),
        "tokens_per_s": sum(tokens) / total,
        "tflops": sum(flops) / total / 1e12,
    }


def profile_attention(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device, **kwargs: Any
) -> dict[str, Any]:
    """The attention ops (aten) and device kernels that torch.profiler saw in one training step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    train_step(model, batch, **kwargs)  # warm-up outside the profile
    synchronize(device)
    with profile(activities=activities) as prof:
        train_step(model, batch, **kwargs)
        synchronize(device)
    events = prof.key_averages()
    ops = sorted({e.key for e in events if e.key.startswith("aten::") and "attention" in e.key.lower()})
    kernels = {}
    for e in events:
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            kernels[e.key] = kernels.get(e.key, 0.0) + float(us)
    attention_kernels = sorted(k for k in kernels if ATTENTION_KERNEL.search(k))
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    names = " ".join(ops + attention_kernels).lower()
    return {
        "aten_attention_ops": ops,
        "attention_kernels": [k[:160] for k in attention_kernels],
        "flash": "flash" in names,
        "memory_efficient": "efficient" in names or "fmha" in names,
        "cudnn": "cudnn" in names,
        "top_kernels_ms": [{"kernel": k[:120], "ms": us / 1000} for k, us in top],
    }


def sdpa_kernels(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device
) -> dict[str, Any]:
    """Kernels on a real (padded) training batch, and on the same batch with every token real (no
    key mask: the only case in which PyTorch may pick the flash kernel)."""
    no_pad = {**batch, "attention_mask": torch.ones_like(batch["attention_mask"])}
    return {
        "padded_batch": profile_attention(model, batch, device),
        "no_padding": profile_attention(model, no_pad, device),
        "backends_enabled": {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "memory_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn": getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        },
    }


# --- varlen attention: the packed tokens go to the flash kernel with cumulative sequence lengths ----


def _cu_seqlens(packing: Packing) -> tuple[torch.Tensor, int]:
    """Cumulative sequence lengths [B+1] (int32) and the longest sequence, cached on the packing
    (every layer shares it). Real tokens are a prefix of each row, so the packed rows of sequence
    b are contiguous: exactly varlen's layout."""
    cached = getattr(packing, "_varlen_cu", None)
    if cached is None:
        lengths = packing.key_mask.reshape(packing.batch, packing.seq).sum(1)
        cu = torch.zeros(packing.batch + 1, dtype=torch.int32, device=lengths.device)
        cu[1:] = torch.cumsum(lengths, 0)
        cached = (cu, int(lengths.max()))
        packing._varlen_cu = cached
    return cached


def _varlen_forward(self, x, attn_mask, x_query=None, packing=None):  # BertSelfAttention.forward
    if packing is None:
        return BertSelfAttention.forward(self, x, attn_mask, x_query, packing)
    cu_k, max_k = _cu_seqlens(packing)
    t = x.shape[0]
    k = self.key(x).view(t, self.num_heads, self.head_dim)
    v = self.value(x).view(t, self.num_heads, self.head_dim)
    if x_query is None:  # every packed token queries
        q = self.query(x).view(t, self.num_heads, self.head_dim)
        out = self._varlen_attn(q, k, v, cu_k, cu_k, max_k, max_k)
        return out.reshape(t, -1)
    b, r, _ = x_query.shape  # the last layer: R query rows per sequence
    q = self.query(x_query).reshape(b * r, self.num_heads, self.head_dim)
    cu_q = torch.arange(0, (b + 1) * r, r, dtype=torch.int32, device=x.device)
    out = self._varlen_attn(q, k, v, cu_q, cu_k, r, max_k)
    return out.reshape(b, r, -1)


def use_varlen_attention(model: torch.nn.Module, attn: Callable | None = None) -> torch.nn.Module:
    """Route every attention layer's packed path through `attn` (default
    `torch.nn.attention.varlen.varlen_attn`, which has no dropout): no unpack/pack around the core."""
    if attn is None:
        from torch.nn.attention.varlen import varlen_attn as attn
    for module in model.modules():
        if isinstance(module, BertSelfAttention):
            module._varlen_attn = attn
            module.forward = types.MethodType(_varlen_forward, module)
    return model


def reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k):
    """varlen_attn's contract in plain SDPA, one sequence at a time (for checks on CPU)."""
    outs = []
    for i in range(len(cu_q) - 1):
        qi, ki, vi = (t[a:b].transpose(0, 1) for t, a, b in ((q, cu_q[i], cu_q[i + 1]), (k, cu_k[i], cu_k[i + 1]),
                                                              (v, cu_k[i], cu_k[i + 1])))  # fmt: skip
        outs.append(torch.nn.functional.scaled_dot_product_attention(qi, ki, vi).transpose(0, 1))
    return torch.cat(outs)


def attention_paths(run: Steps) -> dict[str, Any]:
    """Unpadded (ours) vs padded layout with the recipe's dropout; then, with dropout 0 (varlen has
    none), unpadded vs `torch.nn.attention.varlen` on the same weights, their losses compared."""
    model = run.model()
    rows: list[dict[str, Any]] = []
    for name, kwargs in (("unpadded (ours)", {}), ("padded layout", {"unpad": False})):
        row = {"path": name, "dropout": run.config.attention_probs_dropout_prob}
        rows.append({**row, **guarded(lambda kw=kwargs: timed_steps(model, run, **kw))})
    plain = without_dropout(copy.deepcopy(model))
    rows.append({"path": "unpadded (ours)", "dropout": 0.0, **guarded(lambda: timed_steps(plain, run))})
    varlen = {"path": "varlen_attn", "dropout": 0.0, **guarded(lambda: _varlen_row(plain, run))}
    rows.append(varlen)
    masks = [b["attention_mask"] for b in run.batches]
    padding = 1 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)
    if padding == 0:
        varlen["note"] = "no padded batch: the packed (and varlen) route was never taken"
    timed = [r for r in rows if "median_step_ms" in r and r["dropout"] == 0.0]
    fastest = min(timed, key=lambda r: r["median_step_ms"], default=None)
    return {"rows": rows, "fastest_at_dropout_0": fastest and fastest["path"], "padding_fraction": padding}


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(m, BertSelfAttention):
            m.dropout_p = 0.0
    return model


def _varlen_row(plain: torch.nn.Module, run: Steps) -> dict[str, Any]:
    fast = use_varlen_attention(copy.deepcopy(plain))
    with torch.no_grad():
        ref = float(plain(**run.batches[0]).loss)
        got = float(fast(**run.batches[0]).loss)
    return {"loss_rel_diff_vs_unpadded": abs(got - ref) / max(abs(ref), 1e-12), **timed_steps(fast, run)}


def compile_on_off(run: Steps, backend: str, compile_warmup: int) -> dict[str, Any]:
    """Eager vs `torch.compile(model)` (the unpadding's nonzero() makes shapes data-dependent:
    graph breaks and recompiles are counted). Warm-up of the compiled model is timed separately."""
    model = run.model()
    eager = timed_steps(model, run)
    result: dict[str, Any] = {"backend": backend, "eager": eager}
    try:
        from torch import _dynamo

        _dynamo.reset()
        compiled = torch.compile(copy.deepcopy(model), backend=backend)
        t0 = time.perf_counter()
        for i in range(compile_warmup):
            train_step(compiled, run.batches[i % len(run.batches)])
        synchronize(run.device)
        result["compile_warmup_s"] = time.perf_counter() - t0
        result["compiled"] = timed_steps(compiled, run, warmup=0)
        result["speedup"] = eager["median_step_ms"] / result["compiled"]["median_step_ms"]
        from torch._dynamo.utils import counters

        result["graph_breaks"] = {k[:120]: v for k, v in counters["graph_break"].items()}
        result["dynamo_stats"] = dict(counters["stats"])
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result
