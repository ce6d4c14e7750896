"""Example creation and masking on real text (pure functions, with provenance): the statistics and
invariants of Google's create_pretraining_data.py."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from preprocessing.corpus import read_documents
from preprocessing.doc_tokens import pack, tokenize_documents, unpack
from preprocessing.examples import (
    ExampleParams,
    build_example,
    create_examples,
    create_instances_from_document,
    truncate_seq_pair,
)
from preprocessing.masking import KEPT, MASKED, RANDOM, MaskingSpec, num_to_predict
from preprocessing.sentence_encoder import SentenceEncoder
from preprocessing.shard_format import IS_NEXT, NOT_NEXT
from preprocessing.wordpiece import SPECIAL_TOKENS, load_tokenizer, vocab_list


@pytest.fixture(scope="module")
def corpus(minilm_dir, data_dir):
    """Real documents: every 3rd summary plus two Wikipedia files, tokenized with bert-base-uncased."""
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    counts: Counter = Counter()
    docs = list(read_documents(data_dir / "wiki/summaries_en.txt", counts))[::3]
    for name in ("AA/wiki_00.gz", "AB/wiki_00.gz"):
        docs += list(read_documents(data_dir / "wiki/enwiki-2015" / name, counts, name))
    tokenized = [unpack(pack(d, 30522)) for d in tokenize_documents(SentenceEncoder(tok), docs, counts)]
    tokenized = [d for d in tokenized if d]
    vocab = vocab_list(tok)
    return tokenized, vocab


def spec_for(vocab, whole_word=False, max_pred=20):
    return MaskingSpec.from_vocab(vocab, SPECIAL_TOKENS, 0.15, max_pred, whole_word)


def params_for(vocab, max_len=128, dupe=1, seed=7, balance=True):
    return ExampleParams(max_len, 0.1, dupe, seed, vocab.index("[CLS]"), vocab.index("[SEP]"), balance)


@pytest.mark.parametrize("seed", range(8))
def test_a_bucket_with_one_document_keeps_its_pairs_as_isnext(seed):
    """With no other document for a NotNext B, a chunk of several sentences whose coin said NotNext
    becomes IsNext with its own B (it was dropped, with its sentences: 2.6 examples a pass where
    Google's script makes 7.4). Only a one-sentence chunk, which has no B, makes no example."""
    from preprocessing.examples import NspBalance

    document = [[100 + 10 * s + k for k in range(10)] for s in range(30)]  # 30 sentences of 10 tokens
    instances = create_instances_from_document([document], 0, 128, 0.0, random.Random(seed), NspBalance(True))
    # 125 tokens a chunk: 13 + 13 + 4 sentences, every chunk long enough for A and B
    assert len(instances) == 3 and not any(inst.is_random_next for inst in instances)
    assert [inst.a_sentences[0] for inst in instances] == [0, 13, 26]


@pytest.fixture(scope="module")
def instances(corpus):
    """The pairs of the whole corpus as one bucket (max_seq_length 128, short_seq_prob 0.1)."""
    from preprocessing.examples import NspBalance

    docs, _ = corpus
    rng, balance = random.Random(3), NspBalance(True)
    return [
        i for d in range(len(docs)) for i in create_instances_from_document(docs, d, 128, 0.1, rng, balance)
    ]


def test_instances_provenance_lengths_and_nsp(corpus, instances):
    docs, vocab = corpus
    assert len(instances) > 5000

    def concat(doc, lo, hi):
        return [t for s in docs[doc][lo:hi] for t in s]

    def contiguous_in(part, whole):
        n = len(part)
        return any(whole[i : i + n] == part for i in range(len(whole) - n + 1))

    for inst in instances:
        assert len(inst.tokens_a) >= 1 and len(inst.tokens_b) >= 1
        assert len(inst.tokens_a) + len(inst.tokens_b) <= 128 - 3
        assert contiguous_in(inst.tokens_a, concat(inst.a_doc, *inst.a_sentences))
        assert contiguous_in(inst.tokens_b, concat(inst.b_doc, *inst.b_sentences))
        if inst.is_random_next:
            assert inst.b_doc != inst.a_doc  # NotNext: B from another document
        else:
            assert inst.b_doc == inst.a_doc  # IsNext: B is the sentences right after A
            assert inst.b_sentences[0] == inst.a_sentences[1]
    ratio = sum(not i.is_random_next for i in instances) / len(instances)
    assert abs(ratio - 0.5) <= 0.02, ratio


def test_a_split_and_a_notnext_b_start_at_any_sentence(instances):
    """A ends at a random sentence of its chunk (not always after one), and a NotNext B starts at a
    random sentence of its document: were it always the first, NSP could be told from B's start."""
    not_next = [i for i in instances if i.is_random_next]
    assert sum(i.a_sentences[1] - i.a_sentences[0] >= 2 for i in instances) > 0.3 * len(instances)
    assert sum(i.b_sentences[0] > 0 for i in not_next) > 0.5 * len(not_next)


def test_every_sentence_goes_into_a_pair(corpus, instances):
    """Each sentence is in an A or an IsNext B: the sentences after A in a NotNext chunk are put
    back to start the next chunk (as in Google's script), not thrown away."""
    docs, _ = corpus
    used = [set() for _ in docs]
    for inst in instances:
        used[inst.a_doc].update(range(*inst.a_sentences))
        if not inst.is_random_next:
            used[inst.b_doc].update(range(*inst.b_sentences))
    assert used == [set(range(len(doc))) for doc in docs]


def test_notnext_b_comes_from_another_document_of_a_small_bucket():
    """In a bucket of 3 documents, B of a NotNext pair is drawn among the 2 others, never A's own."""
    docs = [[[1000 * d + 10 * s + k for k in range(10)] for s in range(30)] for d in range(3)]
    pairs = Counter()
    for seed in range(30):
        rng = random.Random(seed)
        for d in range(3):
            pairs.update(
                (i.a_doc, i.b_doc)
                for i in create_instances_from_document(docs, d, 128, 0.0, rng)
                if i.is_random_next
            )
    assert all(a != b for a, b in pairs)
    assert len(pairs) == 6  # every other document is drawn


def test_a_short_target_also_bounds_notnext_pairs():
    """With short_seq_prob 1 every document gets a short target length, for its NotNext pairs too
    (A plus a B of the target's remaining length). One-token sentences make the target visible: a
    full chunk, hence an IsNext pair not at the document's end, is exactly target tokens long."""
    docs = [[[1000 * d + s] for s in range(2000)] for d in range(4)]
    checked = 0
    for seed in range(10):
        rng = random.Random(seed)
        for d in range(4):
            instances = create_instances_from_document(docs, d, 128, 1.0, rng)
            target = max(len(i.tokens_a) + len(i.tokens_b) for i in instances if not i.is_random_next)
            for inst in instances:
                if inst.is_random_next:
                    assert len(inst.tokens_a) + len(inst.tokens_b) <= target
                    checked += 1
    assert checked > 100


def test_google_exact_rule_skews_nsp_on_short_documents(corpus):
    """Without balancing, single-sentence chunks are always NotNext (the original's behaviour)."""
    docs, vocab = corpus
    stats: Counter = Counter()
    list(create_examples(docs, params_for(vocab, balance=False), spec_for(vocab), "g", stats))
    assert stats["examples_is_next"] / stats["examples"] < 0.45


def test_masking_statistics_on_50k_selections(corpus):
    docs, vocab = corpus
    spec = spec_for(vocab)
    stats: Counter = Counter()
    examples = list(create_examples(docs, params_for(vocab, dupe=2), spec, "g", stats))
    selections = sum(len(e.masked_lm_positions) for e in examples)
    assert selections >= 50_000
    special = {vocab.index(t) for t in SPECIAL_TOKENS}
    mask_id = vocab.index("[MASK]")
    kinds = Counter()
    candidates = 0
    for e in examples:
        ids, pos, labels = e.input_ids, e.masked_lm_positions, e.masked_lm_ids
        assert len(ids) <= 128 and len(ids) == len(e.segment_ids)
        assert ids[0] == vocab.index("[CLS]") and ids[-1] == vocab.index("[SEP]")
        assert pos == sorted(set(pos)) and len(pos) == len(labels)
        assert len(pos) <= 20
        n_cand = sum(t not in special for t in labels) + sum(
            1 for i, t in enumerate(ids) if i not in set(pos) and t not in special
        )
        candidates += n_cand
        assert len(pos) == min(num_to_predict(len(ids), spec), n_cand)  # exactly 15% (rounded), capped
        assert all(t not in special for t in labels)  # [CLS]/[SEP]/[PAD] never selected
        for p, label, kind in zip(pos, labels, e.mask_kinds):
            if kind == MASKED:
                assert ids[p] == mask_id
            elif kind == KEPT:
                assert ids[p] == label
            else:
                assert ids[p] not in special
            kinds[kind] += 1
        assert sum(ids[p] == mask_id for p in pos) == e.mask_kinds.count(MASKED)
        assert sum(e.segment_ids) == len(ids) - (ids.index(vocab.index("[SEP]")) + 1)
    n = sum(kinds.values())
    # binomial standard error at n=50k is ~0.002 for 80%, ~0.0013 for 10%: 4 sigma bounds
    assert abs(kinds[MASKED] / n - 0.8) < 0.008
    assert abs(kinds[RANDOM] / n - 0.1) < 0.006
    assert abs(kinds[KEPT] / n - 0.1) < 0.006
    assert abs(selections / candidates - 0.15) < 0.01  # rounding per sequence moves it a little
    assert abs(stats["examples_is_next"] / stats["examples"] - 0.5) <= 0.02


def test_max_predictions_cap_and_512(corpus):
    docs, vocab = corpus
    spec = spec_for(vocab, max_pred=5)
    examples = list(create_examples(docs[:300], params_for(vocab, max_len=512), spec, "g", Counter()))
    assert max(len(e.input_ids) for e in examples) > 128
    assert all(len(e.input_ids) <= 512 for e in examples)
    assert all(len(e.masked_lm_positions) == min(5, num_to_predict(len(e.input_ids), spec)) for e in examples)
    assert sum(len(e.masked_lm_positions) == 5 for e in examples) > 0.9 * len(examples)


def test_whole_word_masking_masks_whole_words(corpus):
    docs, vocab = corpus
    spec = spec_for(vocab, whole_word=True)
    examples = list(create_examples(docs[:500], params_for(vocab), spec, "g", Counter()))
    partial = 0
    for e in examples:
        assert e.masked_lm_positions == sorted(e.masked_lm_positions)  # the shard schema's order
        # a word that does not fit the remaining budget is skipped, not taken beyond it
        assert len(e.masked_lm_positions) <= num_to_predict(len(e.input_ids), spec)
        pos = set(e.masked_lm_positions)
        original = list(e.input_ids)
        for p, label in zip(e.masked_lm_positions, e.masked_lm_ids):
            original[p] = label
        for p in pos:  # a selected '##' piece has its word start selected, and vice versa
            if vocab[original[p]].startswith("##") and vocab[original[p - 1]] not in SPECIAL_TOKENS:
                assert p - 1 in pos  # (a '##' piece right after [CLS]/[SEP]: its word was truncated)
            if p + 1 < len(original) and vocab[original[p + 1]].startswith("##") and p + 1 not in pos:
                partial += 1
    assert partial == 0
    assert any(
        vocab[e.masked_lm_ids[i]].startswith("##") for e in examples for i in range(len(e.masked_lm_ids))
    )


def test_deterministic_and_seed_dependent(corpus):
    docs, vocab = corpus
    spec = spec_for(vocab)

    def run(seed, group="g"):
        return [
            (e.key, e.input_ids, e.masked_lm_positions)
            for e in create_examples(docs[:200], params_for(vocab, seed=seed), spec, group, Counter())
        ]

    def texts(seed, group):  # the pairs before masking (the keys name the group by themselves)
        return [
            restored(e)
            for e in create_examples(docs[:200], params_for(vocab, seed=seed), spec, group, Counter())
        ]

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert run(1, "a") != run(1, "b")
    assert texts(1, "a") != texts(1, "b")  # buckets that hold the same documents draw other pairs


def restored(example) -> tuple[int, ...]:
    ids = list(example.input_ids)
    for pos, original in zip(example.masked_lm_positions, example.masked_lm_ids, strict=True):
        ids[pos] = original
    return tuple(ids)


def test_dupe_factor_gives_different_masks_of_same_text(corpus):
    """dupe_factor 2 = the dupe_factor-1 pass, then a second pass over the same documents whose
    pairs that come out as the same text carry other masks."""
    docs, vocab = corpus

    def run(dupe, passes=None):
        params = params_for(vocab, dupe=dupe)
        return list(create_examples(docs[:50], params, spec_for(vocab), "g", Counter(), passes))

    examples, first = run(2), run(1)
    second = run(2, passes=[1])
    assert len({e.key for e in examples}) == len(examples)
    assert examples == first + second and len(second) > 0.9 * len(first)
    first_masks = {restored(e): e.masked_lm_positions for e in first}
    same_text = [e for e in second if restored(e) in first_masks]
    assert len(same_text) >= 10  # 15 of 78 here: the other pairs were cut at other sentences
    differ = [e for e in same_text if e.masked_lm_positions != first_masks[restored(e)]]
    assert len(differ) > 0.9 * len(same_text)


@pytest.mark.parametrize("a_longer", [True, False])
def test_truncate_seq_pair_trims_longer_side_from_both_ends(a_longer):
    rng = random.Random(0)
    long, short = list(range(100)), list(range(1000, 1010))
    ta, tb = truncate_seq_pair(long, short, 50, rng) if a_longer else truncate_seq_pair(short, long, 50, rng)
    trimmed, kept = (ta, tb) if a_longer else (tb, ta)
    assert len(ta) + len(tb) == 50 and kept == short
    assert trimmed[0] > 0 and trimmed[-1] < 99  # cut at the front and at the back
    assert trimmed == list(range(trimmed[0], trimmed[-1] + 1))


def test_pack_round_trip(corpus):
    docs, _ = corpus
    for d in docs[:100]:
        ids, lengths = np.asarray([t for s in d for t in s]), np.asarray([len(s) for s in d])
        assert unpack(pack((ids, lengths), 30522)) == d
    assert unpack(pack((np.asarray([70000, 1]), np.asarray([2])), 80000)) == [[70000, 1]]


def test_build_example_layout(corpus):
    _, vocab = corpus
    from preprocessing.examples import Instance

    inst = Instance([5000, 5001], [6000, 6001, 6002], False, 0, (0, 1), 0, (1, 2))
    ex = build_example(
        inst, vocab.index("[CLS]"), vocab.index("[SEP]"), spec_for(vocab), random.Random(0), 42
    )
    assert ex.segment_ids == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ex.next_sentence_label == IS_NEXT and NOT_NEXT == 1
    assert len(ex.masked_lm_positions) == 1  # max(1, round(8 * 0.15))


def test_num_to_predict_rounds_to_nearest():
    """Google's min(max_predictions, max(1, int(round(len * masked_lm_prob)))): 31 * 0.15 = 4.65
    gives 5 predictions, not 4."""
    spec = MaskingSpec(0.15, 20, False, 103, frozenset(), frozenset(), (1,))
    assert [num_to_predict(n, spec) for n in (3, 8, 10, 31, 128, 512)] == [1, 1, 2, 5, 19, 20]


def test_whole_word_masking_keeps_a_piece_after_sep_out_of_the_previous_word(corpus):
    """B cut at the front can start with a '##' piece: it is a word of its own, not part of A's
    last word across the [SEP] (so it is sometimes masked alone, and A's last word too)."""
    _, vocab = corpus
    from preprocessing.examples import Instance

    spec = spec_for(vocab, whole_word=True)
    a = [vocab.index(w) for w in ("the", "cat", "sat", "on", "a")]
    b = [vocab.index(w) for w in ("##s", "mat", "and", "slept", "well")]
    inst = Instance(a, b, False, 0, (0, 1), 0, (1, 2))
    last_a, first_b = len(a), len(a) + 2  # positions of "a" and of "##s" in [CLS] A [SEP] B [SEP]
    alone = Counter()
    for seed in range(200):
        ex = build_example(inst, vocab.index("[CLS]"), vocab.index("[SEP]"), spec, random.Random(seed), 0)
        pos = set(ex.masked_lm_positions)
        alone["##s"] += first_b in pos and last_a not in pos
        alone["a"] += last_a in pos and first_b not in pos
    assert alone["##s"] > 0 and alone["a"] > 0


def test_build_example_masks_as_the_generic_rule_does(corpus):
    """build_example passes the candidate positions it knows from the layout ([CLS] A [SEP] B [SEP]);
    the masks must equal those the rule finds itself, also where a segment holds [UNK]."""
    from preprocessing.examples import NspBalance
    from preprocessing.masking import mask_sequence

    docs, vocab = corpus
    spec = spec_for(vocab)
    cls_id, sep_id, unk_id = vocab.index("[CLS]"), vocab.index("[SEP]"), vocab.index("[UNK]")
    rng, balance = random.Random(5), NspBalance(True)
    instances = [
        i for d in range(len(docs)) for i in create_instances_from_document(docs, d, 128, 0.1, rng, balance)
    ]
    with_unk = [i for i in instances if unk_id in i.tokens_a or unk_id in i.tokens_b]
    assert len(instances) > 1000 and with_unk
    for k, inst in enumerate(instances):
        ex = build_example(inst, cls_id, sep_id, spec, random.Random(k), key=k)
        ids = [cls_id, *inst.tokens_a, sep_id, *inst.tokens_b, sep_id]
        masked, positions, labels, _ = mask_sequence(ids, spec, random.Random(k))
        assert (ex.input_ids, ex.masked_lm_positions, ex.masked_lm_ids) == (masked, positions, labels)
