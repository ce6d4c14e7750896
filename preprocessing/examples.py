"""Pure, deterministic creation of `[CLS] A [SEP] B [SEP]` pretraining examples.

Same algorithm and knobs as Google's create_pretraining_data.py: per document a target length
(max_seq_length - 3, or with short_seq_prob a random shorter one), chunks of whole sentences up to
it, a random A/B split at a sentence boundary, B the real continuation (IsNext) or with probability
0.5 (always, when the chunk is one sentence) a run of sentences from a random *other* document
(NotNext, the unused sentences are put back), random truncation from the front or back, then
masking. `all_docs` is one bucket of documents (see beam_job.py), not the whole corpus, so memory
is bounded; the other document is drawn from the same bucket.

A document is a list of sentences, each a list of token ids (no special tokens).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from preprocessing.masking import KEPT, MASKED, RANDOM, MaskingSpec, mask_sequence
from preprocessing.shard_format import IS_NEXT, NOT_NEXT

Doc = list[list[int]]


@dataclass
class Instance:
    """One A/B pair before masking, with provenance (document index, sentence range) for tests."""

    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool
    a_doc: int
    a_sentences: tuple[int, int]  # [start, end) sentence indices in a_doc
    b_doc: int
    b_sentences: tuple[int, int]


@dataclass
class Example:
    key: int  # stable 64-bit key: decides the shard and the order inside it
    input_ids: list[int]  # [CLS] A [SEP] B [SEP], masked
    segment_ids: list[int]
    masked_lm_positions: list[int]  # sorted
    masked_lm_ids: list[int]  # the original ids
    next_sentence_label: int  # IS_NEXT / NOT_NEXT
    mask_kinds: list[int]  # MASKED / RANDOM / KEPT per position (stats only, not stored)


def truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random):
    """Trim the longer of A/B one token at a time, randomly from its front or back."""
    a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
    while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
        if (a_hi - a_lo) > (b_hi - b_lo):
            if rng.random() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
        else:
            if rng.random() < 0.5:
                b_lo += 1
            else:
                b_hi -= 1
    return a[a_lo:a_hi], b[b_lo:b_hi]


def _concat(sentences: Doc) -> list[int]:
    out: list[int] = []
    for s in sentences:
        out.extend(s)
    return out


class NspBalance:
    """Keeps the NotNext share at 50% (deviation from Google's script, on by default).

    The original makes every single-sentence chunk NotNext, which on short documents pushes the
    NotNext share far above half (64.5% on wiki/summaries_en.txt). Each such forced NotNext is
    paid back at the next free choice, which is then IsNext; otherwise a fair coin decides.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.debt = 0

    def forced_not_next(self) -> None:
        self.debt += self.enabled

    def choose_random_next(self, rng: random.Random) -> bool:
        if self.debt > 0:
            self.debt -= 1
            return False
        return rng.random() < 0.5


def create_instances_from_document(
    all_docs: list[Doc],
    doc_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    balance: NspBalance | None = None,
) -> list[Instance]:
    document = all_docs[doc_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances: list[Instance] = []
    chunk_start, current_length, i = 0, 0, 0
    while i < len(document):
        current_length += len(document[i])
        if i == len(document) - 1 or current_length >= target_seq_length:
            chunk = document[chunk_start : i + 1]
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = _concat(chunk[:a_end])
            a_range = (chunk_start, chunk_start + a_end)
            if len(chunk) == 1 and len(all_docs) >= 2 and balance is not None:
                balance.forced_not_next()
            not_next = len(chunk) == 1 or (balance.choose_random_next(rng) if balance else rng.random() < 0.5)
            if not_next and len(all_docs) < 2 and len(chunk) == 1:
                # no other document in the bucket and no B in this chunk: the sentence makes no example
                chunk_start, current_length, i = i + 1, 0, i + 1
                continue
            if not_next and len(all_docs) >= 2:  # with no other document, the chunk's own B: IsNext
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                b_doc = rng.randint(0, len(all_docs) - 2)
                b_doc += b_doc >= doc_index  # uniformly among the *other* documents
                random_document = all_docs[b_doc]
                b_start = rng.randint(0, len(random_document) - 1)
                b_end, b_len = b_start, 0
                while b_end < len(random_document):
                    b_len += len(random_document[b_end])
                    b_end += 1
                    if b_len >= target_b_length:
                        break
                tokens_b = _concat(random_document[b_start:b_end])
                b_range = (b_start, b_end)
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                is_random_next = False
                b_doc = doc_index
                tokens_b = _concat(chunk[a_end:])
                b_range = (chunk_start + a_end, chunk_start + len(chunk))
            tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            if len(tokens_a) >= 1 and len(tokens_b) >= 1:
                instances.append(
                    Instance(tokens_a, tokens_b, is_random_next, doc_index, a_range, b_doc, b_range)
                )
            chunk_start, current_length = i + 1, 0
        i += 1
    return instances


def stable_key(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # fits int64


def build_example(
    inst: Instance, cls_id: int, sep_id: int, spec: MaskingSpec, rng: random.Random, key: int
) -> Example:
    ids = [cls_id, *inst.tokens_a, sep_id, *inst.tokens_b, sep_id]
    len_a, len_b = len(inst.tokens_a), len(inst.tokens_b)
    segment_ids = [0] * (len_a + 2) + [1] * (len_b + 1)
    special = spec.special_ids
    candidates = None  # found by the masking rule itself, unless the layout gives them:
    if (
        {cls_id, sep_id} <= special
        and special.isdisjoint(inst.tokens_a)
        and special.isdisjoint(inst.tokens_b)
    ):
        candidates = [*range(1, len_a + 1), *range(len_a + 2, len_a + 2 + len_b)]  # all but [CLS], [SEP]s
    masked, positions, labels, kinds = mask_sequence(ids, spec, rng, candidates)
    return Example(
        key, masked, segment_ids, positions, labels, NOT_NEXT if inst.is_random_next else IS_NEXT, kinds
    )


@dataclass(frozen=True)
class ExampleParams:
    max_seq_length: int
    short_seq_prob: float
    dupe_factor: int
    seed: int
    cls_id: int
    sep_id: int
    balance_nsp: bool = True


def create_examples(
    docs: list[Doc],
    params: ExampleParams,
    spec: MaskingSpec,
    group: str,
    stats: Counter,
    passes: Iterable[int] | None = None,
) -> Iterator[Example]:
    """All examples of one group of documents (a bucket), `dupe_factor` passes with fresh masks.

    `group` names the bucket in the random seeds, so the result depends only on the documents,
    the config and the seed, not on worker count or processing order. `passes` picks some of the
    dupe passes (each pass is independent: callers may run them one at a time to bound memory).
    """
    for dupe in range(params.dupe_factor) if passes is None else passes:
        rng = random.Random(f"{params.seed}:{group}:{dupe}")
        mask_rng = random.Random(f"{params.seed}:{group}:{dupe}:mask")
        balance = NspBalance(params.balance_nsp)
        for d in range(len(docs)):
            instances = create_instances_from_document(
                docs, d, params.max_seq_length, params.short_seq_prob, rng, balance
            )
            for k, inst in enumerate(instances):
                ex = build_example(
                    inst,
                    params.cls_id,
                    params.sep_id,
                    spec,
                    mask_rng,
                    stable_key(params.seed, group, dupe, d, k),
                )
                stats["examples"] += 1
                stats["examples_is_next"] += ex.next_sentence_label == IS_NEXT
                stats["tokens_in_examples"] += len(ex.input_ids)
                stats["masked_positions"] += len(ex.masked_lm_positions)
                stats["masked_as_mask_token"] += ex.mask_kinds.count(MASKED)
                stats["masked_as_random_token"] += ex.mask_kinds.count(RANDOM)
                stats["masked_kept_original"] += ex.mask_kinds.count(KEPT)
                yield ex
