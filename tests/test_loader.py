"""The pretraining loader on real-text shards: disjoint ranks, padding, resume position, masking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.errors import UserError
from preprocessing.masking import MaskingSpec, num_to_predict
from preprocessing.wordpiece import SPECIAL_TOKENS
from tests.shard_fixtures import make_shards, make_tokenizer_dir
from training.data import BatchPlan, ExampleStore, PretrainLoader, collate, eval_batches, load_split


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


def test_loader_across_epochs_gives_each_epochs_order_and_masks_and_resumes_there(store, minilm_dir):
    """Past the first epoch the loader takes that epoch's permutation and masks (drawn with the
    plan's seed), and a loader resumed in the second epoch gives the same batches."""
    vocab = (minilm_dir / "vocab.txt").read_text().splitlines()
    spec = MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, 20, whole_word=False)
    plan = _plan(store, 2, 1, seed=7)
    steps = plan.steps_per_epoch + 3
    loader = PretrainLoader(store, plan, 0, spec, prefetch=2)
    got = [next(loader) for _ in range(steps)]
    loader.close()
    for step, batches in enumerate(got):
        epoch = step // plan.steps_per_epoch
        for m, batch in enumerate(batches):
            want = collate(store, plan.micro_batch_indices(step, m), spec, epoch=epoch, seed=7)
            assert all(torch.equal(batch[k], want[k]) for k in want), (step, m)
    one, two = got[1][0], got[plan.steps_per_epoch + 1][0]
    assert not torch.equal(one["input_ids"], two["input_ids"])  # another order in the next epoch
    resumed = PretrainLoader(store, plan, plan.steps_per_epoch + 1, spec, prefetch=2)
    again = next(resumed)
    resumed.close()
    assert all(torch.equal(again[0][k], two[k]) for k in two)


def test_dynamic_masking_follows_the_preprocessing_rules(store, minilm_dir):
    vocab = (minilm_dir / "vocab.txt").read_text().splitlines()
    spec = MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, 20, whole_word=False)
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
    # as many predictions as preprocessing makes for a sequence of that length, ~80% of them [MASK]
    lengths = e0["attention_mask"].sum(1).tolist()
    assert real.sum(1).tolist() == [num_to_predict(n, spec) for n in lengths]
    chosen_tokens = e0["input_ids"][rows[real], e0["masked_lm_positions"][real]]
    assert 0.7 < (chosen_tokens == spec.mask_id).float().mean().item() < 0.9
    kept = (chosen_tokens == e0["masked_lm_labels"][real]).float().mean().item()
    replaced = 1 - kept - (chosen_tokens == spec.mask_id).float().mean().item()
    assert 0.05 < kept < 0.15 and 0.05 < replaced < 0.15  # ~10% unchanged, ~10% a random token


@pytest.mark.parametrize("whole_word", [False, True])
def test_an_examples_dynamic_mask_does_not_depend_on_its_batch(store, minilm_dir, whole_word):
    """Masks are drawn per (seed, epoch, example index): the same example masked in another batch,
    at another row, gets the same mask, so a change of world size or batch size keeps the masks."""
    vocab = (minilm_dir / "vocab.txt").read_text().splitlines()
    spec = MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, 20, whole_word=whole_word)
    wide = collate(store, np.arange(16), spec, epoch=2, seed=5)
    narrow = collate(store, np.array([11, 3]), spec, epoch=2, seed=5)
    for row, i in enumerate([11, 3]):
        n, k = int(narrow["attention_mask"][row].sum()), int((narrow["masked_lm_labels"][row] != -100).sum())
        assert torch.equal(narrow["input_ids"][row, :n], wide["input_ids"][i, :n])
        assert torch.equal(narrow["masked_lm_positions"][row, :k], wide["masked_lm_positions"][i, :k])
        assert int((wide["masked_lm_labels"][i] != -100).sum()) == k
    other_seed = collate(store, np.arange(16), spec, epoch=2, seed=6)
    assert not torch.equal(other_seed["masked_lm_positions"], wide["masked_lm_positions"])


def _store_of(sequences: list[list[int]]) -> ExampleStore:
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    return ExampleStore(
        input_ids=np.concatenate(sequences).astype(np.int32),
        segment_ids=np.zeros(offsets[-1], np.int8),
        offsets=offsets,
        mlm_positions=np.zeros(0, np.int32),
        mlm_ids=np.zeros(0, np.int32),
        mlm_offsets=np.zeros(len(sequences) + 1, np.int64),
        nsp_labels=np.zeros(len(sequences), np.int8),
    )


def test_dynamic_masking_never_emits_a_special_token():
    """Specials are 5 of 25 ids here and the text holds [UNK] and [MASK] tokens, so a rule that
    chose them or drew replacements from the whole vocabulary fails at once."""
    vocab = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(20))]
    spec = MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, 20, whole_word=False)
    special = torch.tensor(sorted(spec.special_ids))
    cls_id, sep_id, unk_id = (vocab.index(t) for t in ("[CLS]", "[SEP]", "[UNK]"))
    rng = np.random.default_rng(0)
    sequences = []
    for _ in range(200):
        words = rng.integers(5, 25, size=60)
        words[rng.random(60) < 0.1] = unk_id
        words[rng.random(60) < 0.05] = spec.mask_id  # a literal [MASK] in the text
        sequences.append([cls_id, *words[:30], sep_id, *words[30:], sep_id])
    store = _store_of(sequences)
    original = collate(store, np.arange(200))["input_ids"]
    replaced_by_random = 0
    for epoch in range(3):
        batch = collate(store, np.arange(200), spec, epoch=epoch, seed=1)
        real = batch["masked_lm_labels"] != -100
        rows = torch.arange(200)[:, None].expand_as(real)
        chosen = torch.zeros_like(original, dtype=torch.bool)
        chosen[rows[real], batch["masked_lm_positions"][real]] = True
        assert not torch.isin(batch["masked_lm_labels"][real], special).any()  # never a special chosen
        assert torch.equal(batch["masked_lm_labels"][real], original[chosen])
        changed = batch["input_ids"] != original
        assert not (changed & ~chosen).any()  # only chosen positions change
        emitted = batch["input_ids"][changed]
        assert not torch.isin(emitted[emitted != spec.mask_id], special).any()  # no special replacement
        replaced_by_random += int((emitted != spec.mask_id).sum())
    assert replaced_by_random > 50  # the random-replacement branch was exercised


def test_dynamic_masking_predicts_as_preprocessing_does_at_any_length():
    """As many predictions as num_to_predict for every length (10 and 31 tokens round 1.5 and 4.65
    to nearest), and never more than a row has non-special tokens: a row of [UNK]s with one word predicts
    that word only, no special or padding position."""
    vocab = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(20))]
    spec = MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, 20, whole_word=False)
    cls_id, sep_id, unk_id = (vocab.index(t) for t in ("[CLS]", "[SEP]", "[UNK]"))
    word = vocab.index("w3")
    plain = [[cls_id, *(5 + np.arange(n - 3) % 20), sep_id, word, sep_id] for n in range(4, 60)]
    sparse = [[cls_id, *[unk_id] * k, word, sep_id] for k in (8, 29, 40)]  # wanted 2, 5 and 6; one word
    store = _store_of(plain + sparse)
    for epoch in range(3):
        batch = collate(store, np.arange(len(plain) + len(sparse)), spec, epoch=epoch, seed=1)
        real = batch["masked_lm_labels"] != -100
        lengths = batch["attention_mask"].sum(1).tolist()
        assert real.sum(1).tolist() == [num_to_predict(n, spec) for n in lengths[: len(plain)]] + [1, 1, 1]
        for row in range(len(plain), len(plain) + len(sparse)):
            assert batch["masked_lm_positions"][row][real[row]].tolist() == [lengths[row] - 2]
            assert batch["masked_lm_labels"][row][real[row]].tolist() == [word]


def test_eval_batches_equal_count_per_rank_and_disjoint(shards):
    val = load_split(shards, "validation")
    a = eval_batches(val, 4, 2, 0, max_steps=100)
    b = eval_batches(val, 4, 2, 1, max_steps=100)
    assert len(a) == len(b) > 0

    def texts(batches):
        return [
            tuple(row[mask.bool()].tolist())
            for x in batches
            for row, mask in zip(x["input_ids"], x["attention_mask"])
        ]

    read_a, read_b = texts(a), texts(b)
    assert len(set(read_a)) == len(read_a) and len(set(read_b)) == len(read_b)
    assert not set(read_a) & set(read_b)  # no example on both ranks
    first = texts([collate(val, np.arange(len(read_a) + len(read_b)))])
    assert sorted(read_a + read_b) == sorted(first)  # together: the split's first examples


def _evaluated(n_examples: int, world: int, micro: int, accumulation: int) -> list[int]:
    """The held-out examples that `world` ranks read together, checked to be read once each, the
    same number of batches on every rank (ZeRO-3), none larger than the micro batch."""
    from training.data import eval_example_count, eval_example_indices

    per_rank = [eval_example_indices(n_examples, micro, world, r, 4, accumulation) for r in range(world)]
    assert len({len(batches) for batches in per_rank}) == 1
    assert all(len(idx) <= micro for batches in per_rank for idx in batches)
    read = [int(i) for batches in per_rank for idx in batches for i in idx]
    assert len(read) == len(set(read)) == eval_example_count(n_examples, micro, world, 4, accumulation)
    return sorted(read)


@pytest.mark.parametrize("n_examples", [1000, 60, 16])
def test_every_split_of_a_step_evaluates_the_same_held_out_examples(n_examples: int) -> None:
    """2 ranks x micro 8, 1 rank x micro 8 x 2 accumulation steps and 4 ranks x micro 4: the same
    first examples of the split, also where the split is too small for `max_steps` steps (60, 16)."""
    expected = _evaluated(n_examples, 2, 8, 1)
    assert _evaluated(n_examples, 1, 8, 2) == _evaluated(n_examples, 4, 4, 1) == expected
    assert expected == list(range(min(64, n_examples // 16 * 16)))


@pytest.mark.parametrize("n_examples", [15, 5, 1])
def test_a_split_smaller_than_one_step_is_still_evaluated(n_examples: int) -> None:
    """A split too small for one step (a small corpus, a small validation_fraction) is evaluated
    whole but for the last n % world examples, which no layout could share evenly: an evaluation
    of no examples would leave the run without any held-out figure and say nothing."""
    for world, micro, accumulation in [(2, 8, 1), (1, 8, 2), (4, 4, 1), (1, 16, 1)]:  # steps of 16
        assert _evaluated(n_examples, world, micro, accumulation) == list(range(n_examples // world * world))


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
