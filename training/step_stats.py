"""What one pretraining step measured, summed over its micro batches and then over the ranks.

The MLM/NSP hits and token-weighted losses are a `PretrainEval`, the sums held-out evaluation
makes (`training/evaluate.py`), so training and evaluation count them one way; a step adds the
micro batches' mean losses (the logged training loss is their mean), real tokens and FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from model.config import BertConfig
from model.heads import PreTrainingOutput
from training.evaluate import PretrainEval
from training.flops import step_flops


def all_reduce_sums(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sums over every rank (a collective: every rank must call it)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@dataclass
class StepStats:
    quality: PretrainEval = field(default_factory=PretrainEval)
    loss: float = 0.0  # sum of the micro batches' mean total loss
    mlm_loss: float = 0.0  # sum of the micro batches' mean MLM loss
    nsp_loss: float = 0.0
    tokens: float = 0.0  # real (non-pad) tokens
    flops: float = 0.0  # model FLOPs (forward + backward)
    micro_batches: float = 0.0
    stop_requests: float = 0.0  # ranks that got SIGTERM (training/stop_request.py): every rank learns it here
    launcher_deaths: float = 0.0  # ranks whose launcher died (they stop as on SIGTERM, and say why)

    def add(
        self,
        out: PreTrainingOutput,
        batch: dict[str, torch.Tensor],
        loss: torch.Tensor,
        model_cfg: BertConfig,
    ) -> None:
        """One micro batch; `loss` is the one backpropagated (the fault tests can poison it)."""
        self.quality = self.quality + PretrainEval.of_batch(out, batch)
        self.loss += loss.item()
        self.mlm_loss += out.mlm_loss.item()
        self.nsp_loss += out.nsp_loss.item()
        real_tokens = batch["attention_mask"].sum().item()
        self.tokens += real_tokens
        n = out.mlm_labels.numel()
        self.flops += step_flops(model_cfg, *batch["input_ids"].shape, n, int(real_tokens))
        self.micro_batches += 1

    def _own(self) -> list[float]:
        return [
            self.loss,
            self.mlm_loss,
            self.nsp_loss,
            self.tokens,
            self.flops,
            self.micro_batches,
            self.stop_requests,
            self.launcher_deaths,
        ]

    def all_reduce(self, device: torch.device) -> StepStats:
        """The sums over every rank (a collective: every rank must call it)."""
        quality = self.quality.as_list()
        sums = all_reduce_sums(quality + self._own(), device)
        return StepStats(PretrainEval.from_list(sums[: len(quality)]), *sums[len(quality) :])

    @property
    def mean_loss(self) -> float:
        return self.loss / self.micro_batches

    @property
    def samples(self) -> float:
        return self.quality.nsp_count

    def train_metrics(self) -> dict[str, float]:
        q = self.quality
        return {
            "loss": self.mean_loss,
            "mlm_loss": self.mlm_loss / self.micro_batches,
            "nsp_loss": self.nsp_loss / self.micro_batches,
            "mlm_acc": q.mlm_correct / max(1.0, q.mlm_count),
            "nsp_acc": q.nsp_correct / max(1.0, q.nsp_count),
        }
