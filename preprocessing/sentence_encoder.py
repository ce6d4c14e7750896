"""Sentences → WordPiece ids, the ids `Tokenizer.encode_batch_fast` gives, through a per-word cache.

Why: WordPiece encoding was half of the preprocess job's CPU (docs/benchmarks.md §2), and most of
that is the tokenizer's per-token bookkeeping (aligned normalized strings, offsets, token strings),
not the WordPiece search itself: Wikipedia's ~50 M words are ~1 M distinct ones.

Why it is exact: for a tokenizer that is BERT's pipeline (`BertNormalizer` with `clean_text` and
`handle_chinese_chars`, `BertPreTokenizer`, a `WordPiece` model, no truncation or padding), a
sentence of printable ASCII characters normalizes to itself, lowercased if the normalizer
lowercases (stripping accents and spacing out Chinese characters touch only non-ASCII characters;
`clean_text` touches only control characters, which are not printable). BERT's pre-tokenizer then
splits it into the runs of ASCII letters and digits and the single characters between them, since
every printable ASCII character that is neither alphanumeric nor a space is punctuation to BERT.
WordPiece encodes each such word on its own, so a word's ids can be cached. Every other sentence
(with non-ASCII or control characters, or holding the text of an added token such as "[MASK]") is
encoded by `encode_batch_fast` itself, and so is everything for any other tokenizer pipeline.
`tests/test_sentence_encoder.py` compares both on real Wikipedia text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

MAX_CACHED_WORDS = 1 << 20  # ~150 MB of Python strings and ids; the cache starts over beyond it
_SEPARATOR = "\x00"  # between the sentences of a batch: never in a printable sentence


def bert_pipeline_lowercase(tok: Tokenizer) -> bool | None:
    """True/False: `tok` is BERT's pipeline (lowercasing or not); None: any other pipeline."""
    spec = json.loads(tok.to_str())
    norm = spec.get("normalizer") or {}
    bert_norm = (
        norm.get("type") == "BertNormalizer" and norm.get("clean_text") and norm.get("handle_chinese_chars")
    )
    bert_pre = (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
    plain = spec.get("truncation") is None and spec.get("padding") is None
    if bert_norm and bert_pre and plain and spec["model"].get("type") == "WordPiece":
        return bool(norm.get("lowercase"))
    return None


class SentenceEncoder:
    """`encode(sentences)` → (ids, lengths): the sentences' WordPiece ids without special tokens,
    concatenated, and each sentence's count of them; equal to `encode_batch_fast`'s ids."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.lowercase = bert_pipeline_lowercase(tok)
        alnum = "0-9a-z" if self.lowercase else "0-9A-Za-z"
        self._words = re.compile(f"[{alnum}]+|[^{alnum} ]").findall  # the separator is a word too
        added = [t.content for t in tok.get_added_tokens_decoder().values() if t.content]
        # case-insensitive: an added token may be matched after lowercasing
        self._added = re.compile("|".join(map(re.escape, added)), re.IGNORECASE).search if added else None
        self._reset_cache()

    def _reset_cache(self) -> None:
        self._index: dict[str, int] = {_SEPARATOR: 0}  # word → its row in _starts / _lengths
        self._ids = _Growing()  # every cached word's ids, one after the other
        self._starts, self._lengths = _Growing(), _Growing()
        self._starts.extend([0])
        self._lengths.extend([0])

    def encode(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        fast = self._cacheable(sentences)
        slow = [i for i, ok in enumerate(fast) if not ok]
        if len(slow) == len(sentences):
            return self._reference(sentences)
        fast_ids, fast_lengths = self._encode_cached([s for s, ok in zip(sentences, fast) if ok])
        if not slow:
            return fast_ids, fast_lengths
        slow_ids, slow_lengths = self._reference([sentences[i] for i in slow])
        return _interleave(fast, fast_ids, fast_lengths, slow_ids, slow_lengths)

    def _cacheable(self, sentences: Sequence[str]) -> list[bool]:
        if self.lowercase is None:
            return [False] * len(sentences)
        ok = [s.isascii() and s.isprintable() for s in sentences]
        if self._added is not None and self._added(_SEPARATOR.join(sentences)):
            ok = [o and not self._added(s) for o, s in zip(ok, sentences)]
        return ok

    def _reference(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tok.encode_batch_fast(list(sentences), add_special_tokens=False)
        ids = [e.ids for e in encodings]
        flat = np.fromiter((t for s in ids for t in s), np.int64)
        return flat, np.fromiter((len(s) for s in ids), np.int64, len(ids))

    def _encode_cached(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        text = _SEPARATOR.join(sentences)
        words = self._words(text.lower() if self.lowercase else text)
        self._add_missing(words)
        ids, starts, lengths = self._ids.view(), self._starts.view(), self._lengths.view()
        rows = np.fromiter(map(self._index.__getitem__, words), np.int64, len(words))
        word_lengths = lengths[rows]
        ends = np.cumsum(word_lengths)
        # the position of every id in `ids`: each word's start, then start + 1, ... (length times)
        firsts = np.repeat(starts[rows] - ends + word_lengths, word_lengths)
        flat = ids[firsts + np.arange(len(firsts))]
        separators = np.flatnonzero(rows == 0)
        bounds = np.concatenate(([0], ends[separators], [ends[-1] if len(ends) else 0]))
        return flat, np.diff(bounds)

    def _add_missing(self, words: list[str]) -> None:
        missing = list(set(words).difference(self._index))
        if len(self._index) + len(missing) > MAX_CACHED_WORDS:
            self._reset_cache()
            missing = list(set(words).difference(self._index))
        if not missing:
            return
        model = self.tok.model
        pieces = [[t.id for t in model.tokenize(word)] for word in missing]
        first_row = len(self._index)
        self._index.update(zip(missing, range(first_row, first_row + len(pieces))))
        lengths = [len(p) for p in pieces]
        self._starts.extend(np.cumsum([len(self._ids), *lengths[:-1]]))
        self._lengths.extend(lengths)
        self._ids.extend([t for p in pieces for t in p])


class _Growing:
    """An int64 array that grows by doubling (appending is amortized O(appended))."""

    def __init__(self) -> None:
        self._data = np.zeros(1024, np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def extend(self, values) -> None:
        values = np.asarray(values, np.int64)
        end = self._size + len(values)
        if end > len(self._data):
            grown = np.zeros(max(end, 2 * len(self._data)), np.int64)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : end] = values
        self._size = end

    def view(self) -> np.ndarray:
        return self._data[: self._size]


def _interleave(
    fast: list[bool],
    fast_ids: np.ndarray,
    fast_lengths: np.ndarray,
    slow_ids: np.ndarray,
    slow_lengths: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The two groups' sentences back in their original order (`fast[i]`: sentence i is in the first)."""
    order = np.asarray(fast, bool)
    lengths = np.empty(len(fast), np.int64)
    lengths[order], lengths[~order] = fast_lengths, slow_lengths
    ids = np.concatenate((fast_ids, slow_ids))
    # where each sentence starts in `ids`: the fast ones first, then the slow ones
    group_starts = np.empty(len(fast), np.int64)
    group_starts[order] = np.cumsum(fast_lengths) - fast_lengths
    group_starts[~order] = len(fast_ids) + np.cumsum(slow_lengths) - slow_lengths
    out_starts = np.cumsum(lengths) - lengths
    positions = np.repeat(group_starts - out_starts, lengths) + np.arange(int(lengths.sum()))
    return ids[positions], lengths
