"""Held-out masked-LM and NSP quality of a BERT, and the baselines that give those numbers meaning.

`evaluate_pretraining` runs a model over batches of shard examples and sums what the metrics need
(`PretrainEval`); ranks add their sums together before the ratios are taken, so the figures are
exact over all ranks. `mlm_baselines` says what a model that ignores the context scores on the
same split: always predicting the split's most frequent token (accuracy), and the entropy of the
split's token distribution (the loss of the best context-free predictor). A model whose MLM loss
sits at that entropy has learned token frequencies and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from model.heads import PreTrainingOutput
from training.data import ExampleStore


@dataclass
class PretrainEval:
    """Sums over evaluated examples; add two to combine ranks or batches."""

    mlm_correct: float = 0.0
    mlm_count: float = 0.0
    mlm_loss_sum: float = 0.0
    nsp_correct: float = 0.0
    nsp_count: float = 0.0
    nsp_loss_sum: float = 0.0

    def __add__(self, other: PretrainEval) -> PretrainEval:
        return PretrainEval(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_list(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> PretrainEval:
        return cls(*values)

    @classmethod
    def of_batch(cls, out: PreTrainingOutput, batch: dict[str, torch.Tensor]) -> PretrainEval:
        """The sums of one batch (`out`: the model's output on `batch`)."""
        n = out.mlm_labels.numel()
        nsp = batch["next_sentence_labels"].reshape(-1)
        return cls(
            mlm_correct=(out.mlm_predictions == out.mlm_labels).sum().item(),
            mlm_count=n,
            mlm_loss_sum=out.mlm_loss.item() * n if n else 0.0,
            nsp_correct=(out.nsp_logits.argmax(-1) == nsp).sum().item(),
            nsp_count=nsp.numel(),
            nsp_loss_sum=out.nsp_loss.item() * nsp.numel(),
        )

    def metrics(self, prefix: str = "val_") -> dict[str, float]:
        """Ratios; empty when nothing was evaluated."""
        if self.mlm_count == 0:
            return {}
        return {
            f"{prefix}mlm_acc": self.mlm_correct / self.mlm_count,
            f"{prefix}mlm_loss": self.mlm_loss_sum / self.mlm_count,
            f"{prefix}nsp_acc": self.nsp_correct / max(1.0, self.nsp_count),
            f"{prefix}nsp_loss": self.nsp_loss_sum / max(1.0, self.nsp_count),
        }


@torch.no_grad()
def evaluate_pretraining(model: torch.nn.Module, batches, device: torch.device) -> PretrainEval:
    """Sums of MLM/NSP hits and losses of `model` (ours, or a DeepSpeed engine around it) over
    `batches` (dicts from `training.data.collate`). The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    total = PretrainEval()
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        total = total + PretrainEval.of_batch(model(**batch), batch)
    model.train(was_training)
    return total


@dataclass
class MlmBaselines:
    most_frequent_token_acc: float  # always predict the split's most frequent masked token
    unigram_entropy: float  # nats: the loss of the best context-free predictor on this split
    nsp_majority_acc: float  # always predict the split's more frequent NSP label

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def mlm_baselines(store: ExampleStore, num_examples: int | None = None) -> MlmBaselines:
    """Context-free reference points of a split's first `num_examples` examples (default: all)."""
    n = len(store) if num_examples is None else num_examples
    counts = np.bincount(store.mlm_ids[: store.mlm_offsets[n]].astype(np.int64)).astype(np.float64)
    total = counts.sum()
    if total == 0:
        return MlmBaselines(math.nan, math.nan, math.nan)
    p = counts[counts > 0] / total
    nsp = np.bincount(store.nsp_labels[:n].astype(np.int64), minlength=2)
    return MlmBaselines(
        most_frequent_token_acc=float(counts.max() / total),
        unigram_entropy=float(-(p * np.log(p)).sum()),
        nsp_majority_acc=float(nsp.max() / max(1, nsp.sum())),
    )


def beats_unigram(metrics: dict[str, float], baselines: MlmBaselines, margin_nats: float = 0.1) -> bool:
    """True when the held-out MLM loss is clearly below the unigram entropy (context is used)."""
    loss = metrics.get("val_mlm_loss")
    return loss is not None and math.isfinite(loss) and loss < baselines.unigram_entropy - margin_nats
