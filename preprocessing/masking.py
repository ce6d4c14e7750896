"""Masked-LM selection of one sequence, as in Google's create_pretraining_data.py.

`max(1, round(len(tokens) * masked_lm_prob))` positions, capped by max_predictions_per_seq, are
chosen at random among the non-special tokens (whole words when whole_word_mask); each chosen
token becomes [MASK] with probability 0.8, a random vocabulary token with 0.1, stays with 0.1.
Deviation from the original: random replacements are drawn from the non-special tokens only.
Two implementations of the one rule: `mask_sequence`, plain Python on one list (the preprocess
stage; for one 128-token sequence several times faster than numpy calls), and `mask_batch`, numpy
on a padded batch (the loader's dynamic masking, where a batch of 256 in Python held the GIL for
~25 ms a step; tests/test_loader.py checks the rule's properties on it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

MASKED, RANDOM, KEPT = 0, 1, 2  # what happened to a selected position (for stats)


@dataclass(frozen=True)
class MaskingSpec:
    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool
    mask_id: int
    special_ids: frozenset[int]  # never selected ([PAD] [UNK] [CLS] [SEP] [MASK])
    subword_ids: frozenset[int]  # '##' continuation pieces (whole-word grouping)
    replacement_ids: tuple[int, ...]  # ids a RANDOM replacement is drawn from

    @cached_property
    def special_array(self) -> np.ndarray:
        return np.array(sorted(self.special_ids), np.int64)

    @cached_property
    def replacement_array(self) -> np.ndarray:
        return np.array(self.replacement_ids, np.int64)

    @classmethod
    def from_vocab(
        cls,
        vocab: list[str],
        special_tokens: list[str],
        masked_lm_prob: float,
        max_predictions: int,
        whole_word: bool,
    ) -> MaskingSpec:
        special = frozenset(i for i, w in enumerate(vocab) if w in special_tokens)
        return cls(
            masked_lm_prob,
            max_predictions,
            whole_word,
            vocab.index("[MASK]"),
            special,
            frozenset(i for i, w in enumerate(vocab) if w.startswith("##")),
            tuple(i for i in range(len(vocab)) if i not in special),
        )


def num_to_predict(seq_len: int, spec: MaskingSpec) -> int:
    return min(spec.max_predictions_per_seq, max(1, int(round(seq_len * spec.masked_lm_prob))))


def _whole_word_groups(ids: list[int], spec: MaskingSpec) -> list[list[int]]:
    groups: list[list[int]] = []
    prev_special = True
    for i, tok in enumerate(ids):
        if tok in spec.special_ids:
            prev_special = True
            continue
        if tok in spec.subword_ids and groups and not prev_special:
            groups[-1].append(i)
        else:
            groups.append([i])
        prev_special = False
    return groups


def select_positions(
    ids: list[int], spec: MaskingSpec, rng: random.Random, candidates: list[int] | None = None
) -> list[int]:
    """Sorted positions to predict. `candidates`: the positions of the non-special ids, when the
    caller knows them (else they are found here)."""
    n = num_to_predict(len(ids), spec)
    special = spec.special_ids
    if not spec.whole_word_mask:
        if candidates is None:
            candidates = [i for i, t in enumerate(ids) if t not in special]
        return sorted(rng.sample(candidates, min(n, len(candidates))))
    groups = _whole_word_groups(ids, spec)
    rng.shuffle(groups)
    chosen: list[int] = []
    for group in groups:
        if len(chosen) >= n:
            break
        if len(chosen) + len(group) > n:
            continue
        chosen.extend(group)
    return sorted(chosen)


def mask_sequence(
    ids: list[int], spec: MaskingSpec, rng: random.Random, candidates: list[int] | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Returns (masked input ids, positions, original ids at positions, MASKED/RANDOM/KEPT per position)."""
    positions = select_positions(ids, spec, rng, candidates)
    out = list(ids)
    labels = [ids[p] for p in positions]
    kinds = []
    for p in positions:
        if rng.random() < 0.8:
            out[p] = spec.mask_id
            kinds.append(MASKED)
        elif rng.random() < 0.5:
            kinds.append(KEPT)
        else:
            out[p] = spec.replacement_ids[rng.randrange(len(spec.replacement_ids))]
            kinds.append(RANDOM)
    return out, positions, labels, kinds


def mask_batch(
    original: np.ndarray,
    lengths: np.ndarray,
    spec: MaskingSpec,
    draw: Callable[[int, np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`mask_sequence`'s rule (not whole words) on a padded batch of original ids [B, S] with
    `lengths` [B]. `draw(stream, positions [B, K])`: uniforms in [0, 1) at those positions of each
    row, one stream per decision (0: which positions, 1: [MASK] or not, 2: kept or random, 3: which
    random id). Returns (masked ids [B, S], positions [B, P] sorted per row and padded with 0,
    original ids there [B, P] padded with -100), P the most predictions of a row."""
    b, s = original.shape
    rows = np.arange(b)[:, None]
    candidate = (np.arange(s)[None, :] < lengths[:, None]) & ~np.isin(original, spec.special_array)
    wanted = np.maximum(1, np.rint(lengths * spec.masked_lm_prob).astype(np.int64))
    n = np.minimum(np.minimum(spec.max_predictions_per_seq, wanted), candidate.sum(1))
    width = max(1, int(n.max()) if b else 1)
    keys = np.where(candidate, draw(0, np.broadcast_to(np.arange(s), (b, s))), 2.0)
    order = np.argsort(keys, axis=1, kind="stable")[:, :width]
    slot = np.arange(width)[None, :] < n[:, None]
    positions = np.sort(np.where(slot, order, s), axis=1)  # the unused slots sort last...
    positions = np.where(slot, positions, 0)  # ...and are padded with 0
    at = (rows, positions)
    labels = np.where(slot, original[at], -100)
    pick = (draw(3, positions) * len(spec.replacement_array)).astype(np.int64)
    value = np.where(draw(2, positions) < 0.5, original[at], spec.replacement_array[pick])
    value = np.where(draw(1, positions) < 0.8, spec.mask_id, value)
    masked = original.copy()
    masked[np.broadcast_to(rows, positions.shape)[slot], positions[slot]] = value[slot]
    return masked, positions, labels
