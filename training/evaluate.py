"""Held-out masked-LM and NSP quality of a BERT, and the baselines that give those numbers meaning.

`evaluate_pretraining` runs a model over batches of shard examples and sums what the metrics need
(`PretrainEval`); ranks add their sums together before the ratios are taken, so the figures are
exact over all ranks. `mlm_baselines` says what a model that ignores the context scores on the
same examples: always predicting the training targets' most frequent token (accuracy), and the
held-out loss of the training targets' token frequencies (the unigram entropy, the loss of the
context-free predictor a model can learn: it is the MLM bias every run starts from). A model whose
MLM loss sits there has learned token frequencies and nothing else.

The frequencies come from the train split, not from the evaluated examples: the entropy of a
small sample's own frequencies is far too low (make run's 2,478 held-out targets: 6.05 nats in
sample, 6.96 nats under the training frequencies), which made models that use the context look as
if they did not.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from model.heads import PreTrainingOutput, log_unigram_prior
from model.model_card import context_shortfall
from preprocessing import shard_format
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
    unigram_entropy: float  # nats: the held-out loss of the training targets' frequencies (no context)
    nsp_majority_acc: float  # always predict the split's more frequent NSP label

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def target_counts(mlm_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each token id occurs among masked-LM targets `mlm_ids` (at least `vocab_size`
    entries; ids past the vocabulary are counted too). The pretraining's MLM bias prior and the
    unigram baseline both count with this."""
    return np.bincount(mlm_ids.astype(np.int64, copy=False), minlength=vocab_size)


def train_target_counts(shards_dir: str | Path, vocab_size: int) -> np.ndarray:
    """How often each token id is a masked-LM target in the train split of a shard directory (its
    `masked_lm_ids` column only, so a large corpus is not loaded)."""
    counts = np.zeros(vocab_size, np.int64)
    for path in shard_format.shard_paths(shards_dir, "train", verify=False):
        ids = pq.read_table(path, columns=["masked_lm_ids"]).column(0).combine_chunks().flatten()
        found = target_counts(ids.to_numpy(), len(counts))
        counts = np.pad(counts, (0, len(found) - len(counts))) + found  # ids past the vocabulary: kept
    return counts


def mlm_baselines(
    store: ExampleStore, train_counts: np.ndarray, num_examples: int | None = None
) -> MlmBaselines:
    """Context-free reference points on a split's first `num_examples` examples (default: all),
    predicting from `train_counts` (`train_target_counts`)."""
    n = len(store) if num_examples is None else num_examples
    targets = store.mlm_ids[: store.mlm_offsets[n]].astype(np.int64)
    if targets.size == 0 or train_counts.sum() == 0:
        return MlmBaselines(math.nan, math.nan, math.nan)
    counts = np.pad(train_counts, (0, max(0, int(targets.max()) + 1 - len(train_counts))))
    log_prior = log_unigram_prior(torch.from_numpy(counts)).numpy()
    nsp = np.bincount(store.nsp_labels[:n].astype(np.int64), minlength=2)
    return MlmBaselines(
        most_frequent_token_acc=float((targets == counts.argmax()).mean()),
        unigram_entropy=float(-log_prior[targets].mean()),
        nsp_majority_acc=float(nsp.max() / max(1, nsp.sum())),
    )


def beats_unigram(metrics: dict[str, float], baselines: MlmBaselines) -> bool:
    """True when the held-out figures show that the model uses the context: its MLM loss clearly
    below the unigram entropy and its accuracy above the most frequent token's (`context_shortfall`)."""
    return context_shortfall(metrics, baselines.as_dict()) is None
