"""Batches for fine-tuning: dynamic padding (each batch padded to its own longest example, on a
GPU rounded up to a multiple of 8) and length-grouped, seeded batch order, so little compute goes
into padding.

A feature is a dict with `input_ids` and `token_type_ids` (lists of ints) plus task fields:
`label` (int or float), `labels` (list of ints, padded with -100) or `start`/`end` (ints).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

IGNORE_INDEX = -100


def collate(
    features: Sequence[dict[str, Any]], pad_token_id: int = 0, multiple: int = 1, max_width: int | None = None
) -> dict[str, torch.Tensor]:
    """One padded batch, as wide as its longest feature rounded up to `multiple` (at most
    `max_width`, unless a feature is longer)."""
    n = len(features)
    longest = max(len(f["input_ids"]) for f in features)
    width = -(-longest // multiple) * multiple
    width = max(longest, min(width, max_width)) if max_width is not None else width
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    token_type_ids = torch.zeros((n, width), dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        input_ids[i, :k] = torch.as_tensor(f["input_ids"])
        token_type_ids[i, :k] = torch.as_tensor(f["token_type_ids"])
        attention_mask[i, :k] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    first = features[0]
    if "label" in first:
        dtype = torch.float32 if isinstance(first["label"], float) else torch.long
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
    if "labels" in first:
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        for i, f in enumerate(features):
            labels[i, : len(f["labels"])] = torch.as_tensor(f["labels"])
        batch["labels"] = labels
    if "start" in first:
        batch["start_positions"] = torch.tensor([f["start"] for f in features], dtype=torch.long)
        batch["end_positions"] = torch.tensor([f["end"] for f in features], dtype=torch.long)
    return batch


def train_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, group_by_length: bool = True
) -> list[list[int]]:
    """One epoch of batch index lists. With `group_by_length`, a random permutation is cut into
    mega-batches of 50 batches, each sorted by length before it is split (as transformers'
    `group_by_length`), then the batches are shuffled: batches stay random but hold similar lengths."""
    n = len(lengths)
    perm = torch.randperm(n, generator=generator).tolist()
    if group_by_length:
        mega = batch_size * 50
        perm = [i for s in range(0, n, mega) for i in sorted(perm[s : s + mega], key=lambda j: -lengths[j])]
    batches = [perm[s : s + batch_size] for s in range(0, n, batch_size)]
    if group_by_length and len(batches) > 1:
        order = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in order]
    return batches


def eval_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Evaluation batches sorted by length (least padding); callers scatter outputs back by index."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for s in range(0, len(order), batch_size):
        yield order[s : s + batch_size]
