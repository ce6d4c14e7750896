"""The pretraining loader on real-text shards: disjoint ranks, padding, resume position, masking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.errors import UserError
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from training.data import BatchPlan, MaskingSpec, PretrainLoader, collate, eval_batches, load_split


@pytest.fixture(scope="module")
def shards(tmp_path_factory, minilm_dir, data_dir):
    root = tmp_path_factory.mktemp("loader")
    tok = make_tokenizer_dir(minilm_dir, root / "tok")
    return make_shards(root / "shards", tok, data_dir, num_docs=300, num_train_shards=3)


@pytest.fixture(scope="module")
def store(shards):
    return load_split(shards, "train")


def _plan(store, world, rank, micro=4, accum=2, seed=7):
    return BatchPlan(len(store), micro, accum, world, rank, seed)


def test_ranks_see_disjoint_examples_covering_the_epoch(store):
    world = 2
    seen = {r: [] for r in range(world)}
    plans = [_plan(store, world, r) for r in range(world)]
    for r, plan in enumerate(plans):
        for step in range(plan.steps_per_epoch):
            for m in range(plan.grad_accum):
                seen[r].extend(plan.micro_batch_indices(step, m).tolist())
    a, b = set(seen[0]), set(seen[1])
    assert not a & b
    assert len(a) == len(seen[0]) and len(b) == len(seen[1])  # no repeats within the epoch
    assert len(a | b) == plans[0].steps_per_epoch * plans[0].global_batch
    assert len(a | b) > len(store) - plans[0].global_batch  # only the ragged tail is dropped
    # next epoch is a different order
    e1 = plans[0].micro_batch_indices(plans[0].steps_per_epoch, 0)
    assert not np.array_equal(e1, plans[0].micro_batch_indices(0, 0))


def test_batches_pad_to_longest_with_ignored_label_slots(store):
    idx = np.arange(8)
    batch = collate(store, idx)
    lengths = [int(store.offsets[i + 1] - store.offsets[i]) for i in idx]
    assert batch["input_ids"].shape == (8, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()
    n_pred = [int(store.mlm_offsets[i + 1] - store.mlm_offsets[i]) for i in idx]
    assert batch["masked_lm_labels"].shape[1] == max(n_pred)
    assert ((batch["masked_lm_labels"] != -100).sum(1)).tolist() == n_pred
    # positions of real slots point inside the sequence
    real = batch["masked_lm_labels"] != -100
    assert (batch["masked_lm_positions"][real] < max(lengths)).all()


def test_loader_resume_continues_with_the_next_unseen_batch(store):
    plan = _plan(store, 2, 1)
    full = PretrainLoader(store, plan, start_step=0)
    first = [next(full) for _ in range(6)]
    full.close()
    resumed = PretrainLoader(store, plan, start_step=4)
    again = [next(resumed) for _ in range(2)]
    resumed.close()
    for x, y in zip(first[4:], again):
        for bx, by in zip(x, y):
            for k in bx:
                assert torch.equal(bx[k], by[k])
    assert full.data_wait_seconds >= 0.0


def test_dynamic_masking_statistics(store, minilm_dir):
    vocab = (minilm_dir / "vocab.txt").read_text().splitlines()
    spec = MaskingSpec(
        vocab_size=len(vocab),
        mask_id=vocab.index("[MASK]"),
        special_ids=(vocab.index("[CLS]"), vocab.index("[SEP]"), 0),
    )
    idx = np.arange(64)
    static = collate(store, idx)
    e0, e0b, e1 = (collate(store, idx, spec, epoch=e) for e in (0, 0, 1))
    assert torch.equal(e0["input_ids"], e0b["input_ids"])  # seeded: same epoch, same masks
    assert not torch.equal(e0["masked_lm_positions"], e1["masked_lm_positions"])  # new epoch, new masks
    real = e0["masked_lm_labels"] != -100
    # labels are the original tokens: restoring them reproduces the static example's original text
    orig_static = static["input_ids"].clone()
    rows = torch.arange(64)[:, None].expand_as(static["masked_lm_positions"])
    keep = static["masked_lm_labels"] != -100
    orig_static[rows[keep], static["masked_lm_positions"][keep]] = static["masked_lm_labels"][keep]
    orig_dyn = e0["input_ids"].clone()
    rows = torch.arange(64)[:, None].expand_as(e0["masked_lm_positions"])
    orig_dyn[rows[real], e0["masked_lm_positions"][real]] = e0["masked_lm_labels"][real]
    assert torch.equal(orig_static, orig_dyn)
    # ~15% of the maskable tokens, ~80% of them replaced by [MASK], specials never chosen
    chosen_tokens = e0["input_ids"][rows[real], e0["masked_lm_positions"][real]]
    frac_mask = (chosen_tokens == spec.mask_id).float().mean().item()
    assert 0.7 < frac_mask < 0.9
    labels = e0["masked_lm_labels"][real]
    assert not torch.isin(labels, torch.tensor(spec.special_ids)).any()
    maskable = (~torch.isin(orig_static, torch.tensor(spec.special_ids))).sum().item()
    assert 0.10 < real.sum().item() / maskable < 0.16


def test_eval_batches_equal_count_per_rank_and_disjoint(shards):
    val = load_split(shards, "validation")
    a = eval_batches(val, 4, 2, 0, max_batches=100)
    b = eval_batches(val, 4, 2, 1, max_batches=100)
    assert len(a) == len(b) > 0
    assert not torch.equal(a[0]["input_ids"][0], b[0]["input_ids"][0])


def test_corrupt_shard_is_named(tmp_path, shards):
    import shutil

    copy = tmp_path / "s"
    shutil.copytree(shards, copy)
    victim = sorted((copy / "train").glob("*.parquet"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError, match=victim.name):
        load_split(copy, "train")


def test_too_few_examples_for_one_batch_is_a_user_error(store):
    with pytest.raises(UserError, match="fewer than one global batch"):
        PretrainLoader(store, BatchPlan(len(store), len(store), 1, 2, 0, 0))
