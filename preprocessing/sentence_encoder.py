"""Sentences → WordPiece ids, the ids `Tokenizer.encode_batch_fast` gives, through a per-word cache.

Why: WordPiece encoding was half of the preprocess job's CPU (docs/benchmarks.md §2), and most of
that is the tokenizer's per-token bookkeeping (aligned normalized strings, offsets, token strings),
not the WordPiece search itself: Wikipedia's ~50 M words are ~1 M distinct ones.

For a tokenizer that is BERT's pipeline (`BertNormalizer` with `clean_text` and
`handle_chinese_chars`, `BertPreTokenizer`, a `WordPiece` model, no truncation or padding),
WordPiece encodes each pre-tokenized word on its own, so a word's ids can be cached once the
sentence is split into the words the tokenizer would see. Three routes, each exact:
- Printable ASCII (~90% of Wikipedia's sentences): it normalizes to itself, lowercased if the
  normalizer lowercases (accents, Chinese characters and control characters are not printable
  ASCII), and BERT's pre-tokenizer splits it into the runs of ASCII letters and digits and the
  single characters between them (every printable ASCII character that is neither alphanumeric nor
  a space is punctuation to BERT): one regex over the whole batch.
- Other text: BERT's normalizer maps each character on its own (cleaning, spacing out Chinese
  characters, NFD and dropping accents, lowercasing), so a table built lazily from the tokenizer's
  own normalizer and pre-tokenizer, one character at a time, gives each character's normalized
  form with punctuation set apart by spaces and whitespace as a space; `str.split` then gives the
  words. The one exception, a combining mark that normalization keeps (NFD may reorder it against
  its neighbours), sends its sentence to the last route.
- Sentences holding the text of a non-special added token, those with such a mark, and every
  sentence of any other tokenizer pipeline: `encode_batch_fast` itself.
Corpus text that spells a special token ("[MASK]", "[SEP]") is text, as in Google's
create_pretraining_data.py: only the examples' own [CLS], [SEP] and [MASK] are special (the
tokenizer's `encode_special_tokens`; a literal "[SEP]" in a sentence used to end its segment for
the model, and a literal "[MASK]" was a mask with nothing to predict).
`tests/test_sentence_encoder.py` compares the result with `encode_batch_fast` on real text.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

MAX_CACHED_WORDS = 1 << 20  # ~150 MB of Python strings and ids; the cache starts over beyond it
_SEPARATOR = "\x00"  # between the sentences of a batch (a control character: cleaned out of any text)
_UNSAFE = "\x01"  # a table value: this character's normalization may depend on its neighbours
ASCII, TABLE, REFERENCE = 0, 1, 2  # the routes (module docstring)


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
    concatenated, and each sentence's count of them; equal to `encode_batch_fast`'s ids with
    `encode_special_tokens` (special-token text is text)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = Tokenizer.from_str(tok.to_str())  # its own: special-token text is encoded as text
        self.tok.encode_special_tokens = True
        self.lowercase = bert_pipeline_lowercase(tok)
        alnum = "0-9a-z" if self.lowercase else "0-9A-Za-z"
        self._words = re.compile(f"[{alnum}]+|[^{alnum} ]").findall  # the separator is a word too
        added = [t.content for t in tok.get_added_tokens_decoder().values() if t.content and not t.special]
        # case-insensitive: an added token may be matched after lowercasing
        self._added = re.compile("|".join(map(re.escape, added)), re.IGNORECASE).search if added else None
        self._chars = _CharTable(tok)
        self._reset_cache()

    def _reset_cache(self) -> None:
        self._index: dict[str, int] = {_SEPARATOR: 0}  # word → its row in _starts / _lengths
        self._ids = _Growing()  # every cached word's ids, one after the other
        self._starts, self._lengths = _Growing(), _Growing()
        self._starts.extend([0])
        self._lengths.extend([0])

    def encode(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        routes = self._routes(sentences)
        table_sentences = []  # the TABLE route's sentences, normalized and spaced by the table
        for i in np.flatnonzero(routes == TABLE):
            text = sentences[i].translate(self._chars)
            if _UNSAFE in text:
                routes[i] = REFERENCE
            else:
                table_sentences.append(text)
        ascii_sentences = [s for s, r in zip(sentences, routes) if r == ASCII]
        by_route = [
            self._encode_words(self._ascii_words(ascii_sentences), len(ascii_sentences)),
            self._encode_words(f" {_SEPARATOR} ".join(table_sentences).split(), len(table_sentences)),
            self._reference([s for s, r in zip(sentences, routes) if r == REFERENCE]),
        ]
        return _in_order(routes, by_route)

    def _routes(self, sentences: Sequence[str]) -> np.ndarray:
        if self.lowercase is None:
            return np.full(len(sentences), REFERENCE)
        routes = np.fromiter(
            (ASCII if s.isascii() and s.isprintable() else TABLE for s in sentences), np.int64
        )
        if self._added is not None and self._added(_SEPARATOR.join(sentences)):
            routes[[i for i, s in enumerate(sentences) if self._added(s)]] = REFERENCE
        return routes

    def _reference(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if not sentences:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        encodings = self.tok.encode_batch_fast(list(sentences), add_special_tokens=False)
        ids = [e.ids for e in encodings]
        flat = np.fromiter((t for s in ids for t in s), np.int64)
        return flat, np.fromiter((len(s) for s in ids), np.int64, len(ids))

    def _ascii_words(self, sentences: list[str]) -> list[str]:
        text = _SEPARATOR.join(sentences)
        return self._words(text.lower() if self.lowercase else text) if sentences else []

    def _encode_words(self, words: list[str], sentences: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `sentences` sentences whose words, separated by _SEPARATOR, are `words`."""
        if not words:
            return np.zeros(0, np.int64), np.zeros(sentences, np.int64)
        self._add_missing(words)
        ids, starts, lengths = self._ids.view(), self._starts.view(), self._lengths.view()
        rows = np.fromiter(map(self._index.__getitem__, words), np.int64, len(words))
        word_lengths = lengths[rows]
        ends = np.cumsum(word_lengths)
        # the position of every id in `ids`: each word's start, then start + 1, ... (length times)
        firsts = np.repeat(starts[rows] - ends + word_lengths, word_lengths)
        flat = ids[firsts + np.arange(len(firsts))]
        separators = np.flatnonzero(rows == 0)
        bounds = np.concatenate(([0], ends[separators], [ends[-1]]))
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


def _in_order(
    routes: np.ndarray, by_route: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, lengths) of every sentence in its original order, from each route's (ids, lengths) of
    its own sentences in order (`routes[i]`: sentence i's route)."""
    lengths = np.zeros(len(routes), np.int64)
    starts = np.zeros(len(routes), np.int64)  # where each sentence's ids start in `ids`
    offset = 0
    for route, (route_ids, route_lengths) in enumerate(by_route):
        mine = routes == route
        lengths[mine] = route_lengths
        starts[mine] = offset + np.cumsum(route_lengths) - route_lengths
        offset += len(route_ids)
    ids = np.concatenate([route_ids for route_ids, _ in by_route])
    # each id's position in `ids`: its sentence's start there, plus its place in the sentence
    out_starts = np.cumsum(lengths) - lengths
    positions = np.repeat(starts - out_starts, lengths) + np.arange(len(ids))
    return ids[positions], lengths


class _CharTable(dict):
    """ord(c) → c as BERT's normalizer and pre-tokenizer leave it, for `str.translate` then
    `str.split`: normalized alone (by the tokenizer's own normalizer), each character of that set
    apart by spaces if the pre-tokenizer isolates it (punctuation), a space if it drops it
    (whitespace); _UNSAFE for a combining mark normalization keeps, or a word character that
    `str.split` would split at."""

    def __init__(self, tok: Tokenizer) -> None:
        super().__init__()
        self._normalize = tok.normalizer.normalize_str
        self._pre_tokenize = tok.pre_tokenizer.pre_tokenize_str

    def __missing__(self, code: int) -> str:
        value = self[code] = self._table_value(chr(code))
        return value

    def _table_value(self, char: str) -> str:
        out = []
        for c in self._normalize(char):
            pieces = len(self._pre_tokenize(f"a{c}a"))
            if unicodedata.combining(c) or (pieces == 1 and c.isspace()):
                return _UNSAFE
            out.append({1: c, 2: " ", 3: f" {c} "}[pieces])
        return "".join(out)
