"""What one pretraining step (or one evaluation pass) measured, summed over micro batches and ranks.

The training loop and the held-out evaluation fill the same `StepStats`; `all_reduce` sums it
over the ranks, and the `*_metrics` methods turn the sums into the logged figures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model.config import BertConfig
from model.heads import PreTrainingOutput
from training.flops import step_flops


@dataclass
class StepStats:
    loss: float = 0.0  # sum of the micro batches' mean total loss
    mlm_loss: float = 0.0  # sum of the micro batches' mean MLM loss
    nsp_loss: float = 0.0
    mlm_loss_tokens: float = 0.0  # MLM loss x predicted tokens (a token-weighted mean for evaluation)
    mlm_correct: float = 0.0
    mlm_count: float = 0.0  # predicted tokens
    nsp_correct: float = 0.0
    nsp_count: float = 0.0  # sequences
    tokens: float = 0.0  # real (non-pad) tokens
    flops: float = 0.0  # model FLOPs (forward + backward), training only
    micro_batches: float = 0.0

    def add(
        self,
        out: PreTrainingOutput,
        batch: dict[str, torch.Tensor],
        loss: torch.Tensor,
        model_cfg: BertConfig | None = None,
    ) -> None:
        """One micro batch; `model_cfg` given: also count its training FLOPs."""
        n = out.mlm_labels.numel()
        mlm_loss = out.mlm_loss.item()
        self.loss += loss.item()
        self.mlm_loss += mlm_loss
        self.nsp_loss += out.nsp_loss.item()
        self.mlm_loss_tokens += mlm_loss * n
        self.mlm_correct += (out.mlm_logits.argmax(-1) == out.mlm_labels).sum().item()
        self.mlm_count += n
        self.nsp_correct += (out.nsp_logits.argmax(-1) == batch["next_sentence_labels"]).sum().item()
        self.nsp_count += batch["next_sentence_labels"].numel()
        real_tokens = batch["attention_mask"].sum().item()
        self.tokens += real_tokens
        if model_cfg is not None:
            self.flops += step_flops(model_cfg, *batch["input_ids"].shape, n, int(real_tokens))
        self.micro_batches += 1

    def all_reduce(self, device: torch.device) -> StepStats:
        """The sums over every rank (a collective: every rank must call it)."""
        fields = dataclasses.fields(self)
        t = torch.tensor([getattr(self, f.name) for f in fields], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return StepStats(*t.tolist())

    @property
    def mean_loss(self) -> float:
        return self.loss / self.micro_batches

    def train_metrics(self) -> dict[str, float]:
        return {
            "loss": self.mean_loss,
            "mlm_loss": self.mlm_loss / self.micro_batches,
            "nsp_loss": self.nsp_loss / self.micro_batches,
            "mlm_acc": self.mlm_correct / max(1.0, self.mlm_count),
            "nsp_acc": self.nsp_correct / max(1.0, self.nsp_count),
        }

    def eval_metrics(self) -> dict[str, float]:
        if self.mlm_count == 0:
            return {}
        return {
            "val_mlm_acc": self.mlm_correct / self.mlm_count,
            "val_nsp_acc": self.nsp_correct / max(1, self.nsp_count),
            "val_mlm_loss": self.mlm_loss_tokens / self.mlm_count,
        }
