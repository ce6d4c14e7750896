"""Optimizers and the learning-rate schedule of the BERT recipe, for pretraining and fine-tuning.

AdamW (betas 0.9/0.999, eps 1e-6, weight decay on every weight except biases and LayerNorm
parameters) with linear warmup then linear decay to zero at `max_steps`; LAMB for large
batches. Fine-tuning uses `adamw` and `build_scheduler` as they are (torch's AdamW, no DeepSpeed). On GPU DeepSpeed's fused kernels are used (FusedAdam / FusedLamb; DeepSpeedCPUAdam when
the optimizer state is offloaded to CPU); on CPU torch's fused AdamW kernel (5.7x faster than its
default per-tensor loop on the 110M base parameters here: 0.095 vs 0.54 s a step) and the small
`Lamb` below.

Muon (Jordan et al. 2024; `optimizer: muon`) orthogonalizes the momentum of each of the encoder's
weight matrices by Newton-Schulz before it is applied, and leaves the embeddings (with the MLM
decoder tied to them), the heads, biases and LayerNorms to AdamW. DeepSpeed's `MuonWithAuxAdam` is
the optimizer, so a DeepSpeed engine steps it as any other; it needs ZeRO stage 0 (training/ds_config.py).
"""

from __future__ import annotations

import math
import os
import re

import torch
from torch import nn

from common.schedule import warmup_linear_decay

NO_DECAY_MARKERS = ("bias", "LayerNorm.weight", "LayerNorm.bias")
# One entry of TORCH_CUDA_ARCH_LIST as torch reads it: "9.0", "9.0a", "10.0f", "8.6+PTX".
_ARCH_ENTRY = re.compile(r"^(\d+)\.(\d+)[a-z]?(\+PTX)?$")


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST in the form DeepSpeed's JIT builder parses. DeepSpeed 0.19 reads each
    entry as numbers and fails on the arch-specific suffixes that torch accepts and CUDA images set
    ("9.0a" on Hopper images: `invalid literal for int() with base 10: '0a'`, seen on the GPU
    check's H200); its fused optimizers use no arch-specific instruction, so "9.0a" builds as "9.0".
    Entries it cannot read at all are left for DeepSpeed to report."""
    entries = [e for e in re.split(r"[;\s]+", value.strip()) if e]
    return ";".join(f"{m[1]}.{m[2]}{m[3] or ''}" if (m := _ARCH_ENTRY.match(e)) else e for e in entries)


def prepare_fused_build() -> None:
    """Before a DeepSpeed fused op is built (JIT, on first use): its arch list, in this process."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if value:
        os.environ["TORCH_CUDA_ARCH_LIST"] = deepspeed_arch_list(value)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and biases + LayerNorm parameters without decay."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if any(m in name for m in NO_DECAY_MARKERS) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020) exactly as DeepSpeed's FusedLamb computes it on GPU, so that one
    config trains the same on CPU (and with the optimizer offloaded) as on GPU.

    Per parameter, with m, v the uncorrected Adam moments at step t:
      u = m / (sqrt(v) + eps) + wd * p,   ratio = clamp(||p|| / ||u||, min_coeff, max_coeff)
      (1 when either norm is zero),       p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * ratio * u.
    This differs from the paper's Algorithm 2, which bias-corrects m and v before the trust ratio:
    there the ratio cancels the correction, here it stays as a factor on the step (0.32 at step 1,
    0.15 at step 10, 0.31 at step 100, 0.80 at step 1,000), and the ratio is clamped. The GPU
    check's `ops` part compares the two (docs/benchmarks.md §7).
    """

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, min_coeff=0.01, max_coeff=10.0
    ) -> None:
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, min_coeff=min_coeff, max_coeff=max_coeff
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                ratio = (w_norm / u_norm).clamp(group["min_coeff"], group["max_coeff"])
                ratio = torch.where((w_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
                step_size = group["lr"] * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                p.add_(update * ratio, alpha=-step_size)
        return loss


BETAS, EPS = (0.9, 0.999), 1e-6


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """torch.optim.AdamW with the recipe's groups, betas and eps; its fused kernel where this torch
    build has one for these tensors, else its default implementation (same update, same state)."""
    groups = param_groups(model, weight_decay)
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=EPS, fused=True)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=EPS)


MUON_MOMENTUM = 0.95


def is_muon_matrix(name: str, param: nn.Parameter) -> bool:
    """Muon's share: the 2-D weights inside the encoder's layers (attention query, key, value and
    output, the feed-forward pair). Embeddings, pooler and heads are not hidden matrices."""
    return param.ndim == 2 and ".encoder.layer." in f".{name}"


def muon(
    model: nn.Module, muon_lr: float, lr: float, weight_decay: float, on_gpu: bool
) -> torch.optim.Optimizer:
    """DeepSpeed's MuonWithAuxAdam: Muon (momentum 0.95, Nesterov, no weight decay) at `muon_lr` on
    the encoder's matrices, AdamW with the recipe's groups at `lr` on every other parameter. Each
    parameter is tagged `use_muon`, which DeepSpeed's engine reads."""
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

    names = {id(p): n for n, p in model.named_parameters()}
    for p in model.parameters():
        p.use_muon = is_muon_matrix(names[id(p)], p)
    groups = param_groups(model, weight_decay)
    matrices = [p for g in groups for p in g["params"] if p.use_muon]
    muon_group = dict(params=matrices, use_muon=True, lr=muon_lr, momentum=MUON_MOMENTUM, weight_decay=0.0)
    adam_groups = [
        dict(params=rest, use_muon=False, lr=lr, betas=BETAS, eps=EPS, weight_decay=g["weight_decay"])
        for g in groups
        if (rest := [p for p in g["params"] if not p.use_muon])
    ]
    if on_gpu:
        from deepspeed.ops.adam import FusedAdam

        aux, aux_kwargs = FusedAdam, {"adam_w_mode": True}
    else:
        aux, aux_kwargs = torch.optim.AdamW, {"fused": True}
    # AdamW's groups first: the lr a run logs (the first group's) is `lr`, as with adamw
    return MuonWithAuxAdam([*adam_groups, muon_group], adam_optimizer=aux, adam_optimizer_kwargs=aux_kwargs)


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    on_gpu: bool,
    offload: bool = False,
    muon_lr: float | None = None,
) -> torch.optim.Optimizer:
    """The pretraining optimizer: DeepSpeed's fused kernels on GPU, `adamw` / `Lamb` on CPU, and
    `muon` (Muon at `muon_lr` on the encoder's matrices, AdamW at `lr` on the rest)."""
    if on_gpu or offload:  # DeepSpeed builds its fused and CPU-Adam ops (JIT) on first use
        prepare_fused_build()
    if name == "muon":
        if muon_lr is None:
            raise ValueError("optimizer muon needs muon_lr")
        return muon(model, muon_lr, lr, weight_decay, on_gpu)
    if name == "adamw" and not (on_gpu or offload):
        return adamw(model, lr, weight_decay)
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        if offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(groups, lr=lr, betas=BETAS, eps=EPS, adamw_mode=True)
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(groups, lr=lr, betas=BETAS, eps=EPS, adam_w_mode=True)
    if name == "lamb":
        if on_gpu and not offload:
            from deepspeed.ops.lamb import FusedLamb

            return FusedLamb(groups, lr=lr, betas=BETAS, eps=EPS)
        return Lamb(groups, lr=lr, betas=BETAS, eps=EPS)
    raise ValueError(f"unknown optimizer {name!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(warmup_steps, max_steps))
