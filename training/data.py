"""The pretraining data loader: shards → per-rank padded batches, resumable from a sample count.

Order is a pure function of (seed, epoch, step): epoch e visits a seeded permutation of all
training examples, cut into global batches of `micro_batch * grad_accum * world` examples (the
remainder of an epoch is dropped so every step is full). Within a global batch, micro batch m of
rank r is the slice `[(m * world + r) * micro, ... + micro)`, so ranks see disjoint examples and
a resume at `consumed_samples = step * global_batch` continues with the next unseen batch.

The examples are flat arrays plus offsets (~5 bytes per token): read from Parquet by `load_split`,
or, in the pretraining stage, memory-mapped from a per-node cache (`training/example_cache.py`,
`mapped_split`) so the ranks of a node share one copy. A background thread collates batches ahead
of the training loop and the time the loop spends blocked on it is measured (`data_wait_seconds`).
With dynamic masking every example is masked afresh each epoch by the preprocessing rules
(`preprocessing/masking.py`), seeded by (seed, epoch, example index).
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from common.errors import UserError
from preprocessing import shard_format
from preprocessing.masking import MaskingSpec, mask_batch, mask_sequence

IGNORE_INDEX = -100


@dataclass
class ExampleStore:
    """All examples of one split as flat arrays (Arrow list layout)."""

    input_ids: np.ndarray  # int32, concatenated sequences
    segment_ids: np.ndarray  # int8
    offsets: np.ndarray  # int64 [N+1] into input_ids / segment_ids
    mlm_positions: np.ndarray  # int32, concatenated
    mlm_ids: np.ndarray  # int32
    mlm_offsets: np.ndarray  # int64 [N+1]
    nsp_labels: np.ndarray  # int8 [N]

    def __len__(self) -> int:
        return len(self.nsp_labels)

    @property
    def max_token_id(self) -> int:
        ids = [a.max() for a in (self.input_ids, self.mlm_ids) if a.size]
        return int(max(ids)) if ids else -1


def _flat(column: pa.ChunkedArray, dtype) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def flatten_table(table: pa.Table, where: str) -> dict[str, np.ndarray]:
    """Shard rows -> the ExampleStore arrays (offsets from 0); `where` names the source in errors."""
    input_ids, offsets = _flat(table.column("input_ids"), np.int32)
    segment_ids, seg_offsets = _flat(table.column("segment_ids"), np.int8)
    mlm_positions, mlm_offsets = _flat(table.column("masked_lm_positions"), np.int32)
    mlm_ids, ids_offsets = _flat(table.column("masked_lm_ids"), np.int32)
    if not (np.array_equal(offsets, seg_offsets) and np.array_equal(mlm_offsets, ids_offsets)):
        raise UserError(
            f"{where}: segment_ids / masked_lm_ids lengths differ from input_ids / masked_lm_positions "
            "in some rows.",
            fix="rerun preprocess; the shards were written by a broken writer.",
        )
    return {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "offsets": offsets,
        "mlm_positions": mlm_positions,
        "mlm_ids": mlm_ids,
        "mlm_offsets": mlm_offsets,
        "nsp_labels": table.column("next_sentence_label").to_numpy().astype(np.int8),
    }


def load_split(shards_dir: str | Path, split: str = "train", verify: bool = True) -> ExampleStore:
    """Read every shard of a split (checksums verified once) into one ExampleStore."""
    paths = shard_format.shard_paths(shards_dir, split, verify=verify)
    if not paths:
        raise UserError(
            f"{Path(shards_dir) / shard_format.MANIFEST_NAME} lists no {split!r} shards.",
            fix="rerun preprocess on a corpus with enough documents.",
        )
    table = pa.concat_tables([shard_format.read_shard(p) for p in paths])
    return ExampleStore(**flatten_table(table, f"shards in {shards_dir}/{split}"))


def mapped_split(cache_dir: str | Path) -> ExampleStore:
    """An ExampleStore over the memory-mapped arrays of a complete cache (`example_cache.ensure`)."""
    from training import example_cache

    return ExampleStore(**example_cache.open_arrays(Path(cache_dir)))


@dataclass(frozen=True)
class BatchPlan:
    """Which examples make up each step, for one rank."""

    num_examples: int
    micro_batch_size: int
    grad_accum: int
    world_size: int
    rank: int
    seed: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.grad_accum * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        return self.num_examples // self.global_batch

    def permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def micro_batch_indices(self, step: int, micro: int, perm: np.ndarray | None = None) -> np.ndarray:
        """Example indices of micro batch `micro` of global step `step` (0-based) on this rank."""
        epoch, j = divmod(step, self.steps_per_epoch)
        perm = self.permutation(epoch) if perm is None else perm
        start = j * self.global_batch + (micro * self.world_size + self.rank) * self.micro_batch_size
        return perm[start : start + self.micro_batch_size]


def require_one_global_batch(num_examples: int, micro: int, accum: int, world: int, where: str = "") -> None:
    """A step needs one full global batch; fewer training examples than that is a UserError."""
    if num_examples < micro * accum * world:
        raise UserError(
            f"the training split{where} has {num_examples} examples, fewer than one global batch "
            f"({micro} micro x {accum} accumulation x {world} processes = {micro * accum * world}).",
            fix="lower pretrain.micro_batch_size / gradient_accumulation_steps / num_processes, or "
            "preprocess more text.",
        )


def collate(
    store: ExampleStore,
    indices: np.ndarray,
    masking: MaskingSpec | None = None,
    epoch: int = 0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of this batch; masked_lm slots padded with label -100. With
    `masking`, each example is masked afresh (`remask`). Whole-array numpy: the loader thread runs
    this beside the training loop, and while it holds the GIL the loop's Python cannot run."""
    idx = np.asarray(indices, dtype=np.int64)
    input_ids, lengths = _padded(store.input_ids, store.offsets, idx, 0)
    segment_ids, _ = _padded(store.segment_ids, store.offsets, idx, 0)
    mlm_pos, _ = _padded(store.mlm_positions, store.mlm_offsets, idx, 0)
    mlm_lab, _ = _padded(store.mlm_ids, store.mlm_offsets, idx, IGNORE_INDEX)
    if masking is not None:
        input_ids, mlm_pos, mlm_lab = remask(input_ids, lengths, mlm_pos, mlm_lab, masking, idx, epoch, seed)
    attention = np.arange(input_ids.shape[1])[None, :] < lengths[:, None]
    return {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(segment_ids),
        "attention_mask": torch.from_numpy(attention.astype(np.int64)),
        "masked_lm_positions": torch.from_numpy(mlm_pos),
        "masked_lm_labels": torch.from_numpy(mlm_lab),
        "next_sentence_labels": torch.from_numpy(store.nsp_labels[idx].astype(np.int64)),
    }


def _padded(
    flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray, fill: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows `idx` of a flat array with offsets as an int64 matrix padded with `fill` to the longest
    row (width at least 1), and the rows' lengths."""
    starts, lengths = offsets[idx], offsets[idx + 1] - offsets[idx]
    cols = np.arange(max(1, int(lengths.max()) if len(idx) else 1))
    inside = cols[None, :] < lengths[:, None]
    where = np.where(inside, starts[:, None] + cols[None, :], 0)
    values = flat[where] if flat.size else np.zeros(where.shape, flat.dtype)
    return np.where(inside, values, fill).astype(np.int64), lengths


def remask(
    ids: np.ndarray,
    lengths: np.ndarray,
    pos: np.ndarray,
    lab: np.ndarray,
    spec: MaskingSpec,
    idx: np.ndarray,
    epoch: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Restore the batch's original tokens, then draw a fresh mask by the preprocessing rules
    (`preprocessing.masking`: specials never chosen, never a random replacement). Every draw is a
    function of (seed, epoch, example index, position), so an example's mask does not depend on
    the batch, rank or world size it is read in."""
    original = ids.copy()
    real = lab != IGNORE_INDEX
    original[np.nonzero(real)[0], pos[real]] = lab[real]
    if spec.whole_word_mask:  # word grouping is sequential: one example at a time, in Python
        return _remask_rows(original, lengths, spec, idx, epoch, seed)
    return mask_batch(original, lengths, spec, position_draws(seed, epoch, idx))


def _remask_rows(
    original: np.ndarray, lengths: np.ndarray, spec: MaskingSpec, idx: np.ndarray, epoch: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    picked = [
        mask_sequence(original[r, :n].tolist(), spec, random.Random(f"{seed}:{epoch}:{i}"))
        for r, (n, i) in enumerate(zip(lengths.tolist(), idx.tolist()))
    ]
    width = max(1, max((len(p[1]) for p in picked), default=1))
    masked = original.copy()
    positions = np.zeros((len(picked), width), np.int64)
    labels = np.full((len(picked), width), IGNORE_INDEX, np.int64)
    for r, (ids, pos, lab, _) in enumerate(picked):
        masked[r, : len(ids)], positions[r, : len(pos)], labels[r, : len(lab)] = ids, pos, lab
    return masked, positions, labels


_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(_MIX[0])
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX[1])
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX[2])
    return x ^ (x >> np.uint64(31))


def position_draws(seed: int, epoch: int, idx: np.ndarray) -> Callable[[int, np.ndarray], np.ndarray]:
    """`mask_batch`'s `draw`: the uniform in [0, 1) of (stream, position) in row r is a hash of
    (seed, epoch, idx[r], stream, position)."""
    key = np.array([(seed & 0xFFFFFFFF) << 32 | (epoch & 0xFFFFFFFF)], np.uint64)  # an array: wraps silently
    per_example = _splitmix64(np.asarray(idx, np.uint64) ^ _splitmix64(key))[:, None]

    def draw(stream: int, positions: np.ndarray) -> np.ndarray:
        cell = _splitmix64(np.uint64(stream) << np.uint64(32) | positions.astype(np.uint64))
        return (_splitmix64(per_example ^ cell) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    return draw


class PretrainLoader:
    """Yields, for each step from `start_step`, the list of this rank's `grad_accum` micro batches.

    A background thread collates up to `prefetch` steps ahead; `data_wait_seconds` accumulates
    the time the consumer spent blocked waiting for it, `collate_seconds` the time the thread spent
    collating (holding the GIL for most of it: time the training loop's Python cannot run).
    """

    def __init__(
        self,
        store: ExampleStore,
        plan: BatchPlan,
        start_step: int = 0,
        masking: MaskingSpec | None = None,
        prefetch: int = 4,
        pin_memory: bool = False,
    ) -> None:
        require_one_global_batch(plan.num_examples, plan.micro_batch_size, plan.grad_accum, plan.world_size)
        self.store, self.plan, self.masking = store, plan, masking
        self.pin_memory = pin_memory  # GPU: page-locked batches make the host→device copy async
        self.step = start_step
        self.data_wait_seconds = 0.0
        self.collate_seconds = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(start_step,), daemon=True)
        self._thread.start()

    def batches_for_step(self, step: int, perm: np.ndarray | None = None) -> list[dict[str, torch.Tensor]]:
        epoch = step // self.plan.steps_per_epoch
        batches = [
            collate(
                self.store,
                self.plan.micro_batch_indices(step, m, perm),
                self.masking,
                epoch=epoch,
                seed=self.plan.seed,
            )
            for m in range(self.plan.grad_accum)
        ]
        if self.pin_memory:
            batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]
        return batches

    def _produce(self, step: int) -> None:
        perm_epoch, perm = -1, None
        try:
            while not self._stop.is_set():
                epoch = step // self.plan.steps_per_epoch
                if epoch != perm_epoch:
                    perm_epoch, perm = epoch, self.plan.permutation(epoch)
                t0 = time.perf_counter()
                item = (step, self.batches_for_step(step, perm))
                self.collate_seconds += time.perf_counter() - t0
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1
        except BaseException as exc:  # surfaced in the consumer
            self._queue.put((None, exc))

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        return self

    def __next__(self) -> list[dict[str, torch.Tensor]]:
        t0 = time.perf_counter()
        step, batches = self._queue.get()
        self.data_wait_seconds += time.perf_counter() - t0
        if step is None:
            raise batches
        assert step == self.step, (step, self.step)
        self.step += 1
        return batches

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def eval_batches(
    store: ExampleStore, batch_size: int, world_size: int, rank: int, max_steps: int, accumulation: int = 1
) -> list[dict[str, torch.Tensor]]:
    """Validation batches for this rank (`eval_example_indices`): the same count on every rank
    (ZeRO-3 needs all ranks in every forward), examples in file order, disjoint across ranks."""
    indices = eval_example_indices(len(store), batch_size, world_size, rank, max_steps, accumulation)
    return [collate(store, idx) for idx in indices]


def eval_example_indices(
    n_examples: int, batch_size: int, world_size: int, rank: int, max_steps: int, accumulation: int = 1
) -> list[np.ndarray]:
    """The split's example indices in each of this rank's validation batches (`eval_batches`):
    `max_steps` steps' worth (`eval_step_batches`), batch b of rank r holding examples
    (b * batch_size + i) * world_size + r. A split smaller than one step is evaluated whole, but
    for the last `n_examples % world_size` examples (every rank gets as many), in batches of at
    most `batch_size`; together the ranks read the split's first `eval_example_count` examples."""
    count = eval_step_batches(n_examples, batch_size, world_size, max_steps, accumulation)
    if count:
        return [np.arange(b * batch_size, (b + 1) * batch_size) * world_size + rank for b in range(count)]
    rows = np.arange(n_examples // world_size) * world_size + rank
    return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]


def eval_example_count(
    n_examples: int, batch_size: int, world_size: int, max_steps: int, accumulation: int = 1
) -> int:
    """How many of the split's examples (its first ones) a held-out evaluation reads over every
    rank: each rank reads as many (`eval_example_indices`)."""
    rank0 = eval_example_indices(n_examples, batch_size, world_size, 0, max_steps, accumulation)
    return world_size * sum(len(batch) for batch in rank0)


def eval_step_batches(
    n_examples: int, batch_size: int, world_size: int, max_steps: int, accumulation: int = 1
) -> int:
    """Validation micro batches per rank: `max_steps` training steps' worth (`accumulation` micro
    batches of every rank each), fewer where the `n_examples` of the split cannot fill that many
    whole steps. Together the ranks read the split's first steps x batch x accumulation x world
    examples, so every split of a step into ranks and accumulation evaluates the same ones."""
    steps = min(max_steps, n_examples // (batch_size * accumulation * world_size))
    return steps * accumulation
