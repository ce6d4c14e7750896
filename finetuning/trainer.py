"""The fine-tuning loop: every parameter trained with the pretraining recipe's AdamW and schedule
(`training/optim.py`: no decay on bias/LayerNorm, linear warmup then linear decay), gradient
clipping at 1.0, seeded, dynamic padding.

Evaluation runs under `torch.inference_mode` in length-sorted batches. On a GPU with bf16 the
forward runs under bf16 autocast; on CPU everything is fp32.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.errors import UserError
from finetuning.batching import collate, eval_batches, train_batches
from training.optim import adamw, build_scheduler

EVAL_BATCH_SIZE = 128
LOG_EVERY = 10
# On a GPU a batch's width is rounded up to a multiple of this: tensor-core shapes, and at most
# max_seq_length / 8 distinct widths, each of which costs attention a new plan on first use (a
# unit's first pass ran at a fifth of its later speed on an H100: docs/benchmarks.md §7). Pads are
# masked out, so the outputs at real tokens do not change; the CPU path pads to the longest only.
GPU_PAD_MULTIPLE = 8


@dataclass
class TrainStats:
    steps: int
    examples: int
    seconds: float
    final_loss: float

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.seconds if self.seconds > 0 else 0.0


def _autocast(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def padding(model: nn.Module, device: torch.device) -> dict[str, int]:
    """`collate`'s width settings for `model` on `device` (see GPU_PAD_MULTIPLE)."""
    if device.type != "cuda":
        return {}
    return {"multiple": GPU_PAD_MULTIPLE, "max_width": model.config.max_position_embeddings}


def train(
    model: nn.Module,
    features: list[dict[str, Any]],
    *,
    lr: float,
    epochs: float,
    batch_size: int,
    weight_decay: float,
    warmup_proportion: float,
    seed: int,
    device: torch.device,
    pad_token_id: int = 0,
    group_by_length: bool = True,
    log: Callable[[dict[str, float], int], None] | None = None,
) -> TrainStats:
    """Train in place for `epochs` (a fraction allowed) over `features`; returns throughput."""
    if not features:  # the step loop would wait forever for a first batch
        raise UserError("no training examples to fine-tune on.", fix="check the task's training data.")
    generator = torch.Generator().manual_seed(seed)
    lengths = [len(f["input_ids"]) for f in features]
    steps_per_epoch = math.ceil(len(features) / batch_size)
    total = max(1, math.ceil(epochs * steps_per_epoch))
    optimizer = adamw(model, lr, weight_decay)
    scheduler = build_scheduler(optimizer, math.ceil(warmup_proportion * total), total)
    model.train()
    widths = padding(model, device)
    step = examples = 0
    loss_value = math.nan
    start = time.perf_counter()
    while step < total:
        for idx in train_batches(lengths, batch_size, generator, group_by_length):
            if step >= total:
                break
            batch = _to(collate([features[i] for i in idx], pad_token_id, **widths), device)
            with _autocast(device):
                loss = model(**batch)[0]
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            examples += len(idx)
            if log is not None and (step % LOG_EVERY == 0 or step == total or step == 1):
                loss_value = float(loss.detach())
                log(
                    {
                        "train/loss": loss_value,
                        "train/lr": scheduler.get_last_lr()[0],
                        "train/grad_norm": float(grad_norm),
                    },
                    step,
                )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if math.isnan(loss_value) and step:
        loss_value = float(loss.detach())
    return TrainStats(step, examples, seconds, loss_value)


@torch.inference_mode()
def predict(
    model: nn.Module,
    features: list[dict[str, Any]],
    eval_outputs: Callable[[tuple, dict[str, torch.Tensor]], list[Any]],
    device: torch.device,
    pad_token_id: int = 0,
    batch_size: int = EVAL_BATCH_SIZE,
) -> list[Any]:
    """Per-feature outputs in feature order (`eval_outputs` turns a batch's model outputs into
    one item per feature). No labels are passed: the loss is not computed."""
    model.eval()
    out: list[Any] = [None] * len(features)
    lengths = [len(f["input_ids"]) for f in features]
    widths = padding(model, device)
    for idx in eval_batches(lengths, batch_size):
        batch = collate([features[i] for i in idx], pad_token_id, **widths)
        inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        inputs = _to(inputs, device)
        with _autocast(device):
            outputs = model(**inputs)
        cpu_outputs = tuple(o.detach().float().cpu() if isinstance(o, torch.Tensor) else o for o in outputs)
        for i, item in zip(
            idx, eval_outputs(cpu_outputs, {k: v.cpu() for k, v in inputs.items()}), strict=True
        ):
            out[i] = item
    return out
