"""The cached sentence encoder gives exactly `encode_batch_fast`'s ids (special-token text encoded
as text): on real Wikipedia text, on the
cases its fast path must hand over (non-ASCII, control characters, added-token text), with a cased
vocabulary, a non-BERT pipeline, and a cache that starts over."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers

from preprocessing import sentence_encoder
from preprocessing.corpus import read_documents
from preprocessing.sentence_encoder import SentenceEncoder, bert_pipeline_lowercase
from preprocessing.sentences import split_sentences
from preprocessing.wordpiece import load_tokenizer, train_tokenizer

HARD_CASES = [
    "Plain ASCII, with punctuation: (a) b; c! snake_case a+b=c ~tilde~ `quote` 3.14 $5 50% #1 @x {y} [z] |w|",
    "UPPER lower MiXeD 1990s x86_64 e-mail",
    "Café crème and naïve – an en dash — an em dash … “curly quotes”",
    "Chinese 中文字 and Japanese かな and Greek Ωμέγα and Σίσυφος",
    "tab\there, bell\x07 and a nul\x00 char",
    "non\xa0breaking space",
    "The model reads [MASK] and [CLS] literally, and [mask] in lower case, and [SEP][PAD][UNK].",
    "",
    "   ",
    ".,;:!?",
    "a" * 150 + " after a word of 150 characters",
    "qzxjqzxj unknownish wordpieces zzzzzzzzzz",
    "ends with a separator-like character \x01",
    "decomposed accents: Cafe\u0301 and re\u0301sume\u0301, and a kept mark: \u0915\u093f\u0902",
    "Turkish \u0130stanbul, German STRASSE and stra\u00dfe, final sigma \u039f\u0394\u039f\u03a3",
    "zero\u200bwidth, soft\u00adhyphen, private\ue000use, ideographic\u3000space, line\u2028separator",
    "ligature \ufb01le, fullwidth \uff21\uff22\uff23, superscript x\u00b2, fraction \u00bd, \u2167",
]


def wiki_sentences(data_dir, names: list[str]) -> list[str]:
    sentences = []
    for name in names:
        for doc in read_documents(data_dir / "wiki/enwiki-2015" / name, Counter(), name):
            for para in doc.paragraphs:
                sentences.extend(split_sentences(para))
    return sentences


def reference(tok: Tokenizer, sentences: list[str]) -> list[list[int]]:
    """`encode_batch_fast` with special-token text encoded as text (Google's data script)."""
    tok = Tokenizer.from_str(tok.to_str())
    tok.encode_special_tokens = True
    return [e.ids for e in tok.encode_batch_fast(sentences, add_special_tokens=False)]


def test_special_token_text_in_the_corpus_is_text(trained):
    """A literal "[SEP]" or "[MASK]" in a sentence is not the special token: it would end the
    segment for the model, or be a mask with nothing to predict."""
    encoder = SentenceEncoder(trained)
    [ids] = encoded(encoder, ["the [MASK] token and [SEP] and [cls] in text"])
    specials = {trained.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    assert not specials & set(ids)
    assert [trained.id_to_token(i) for i in ids[:2]] == ["the", "["]
    assert trained.encode("[MASK]", add_special_tokens=False).ids == [
        trained.token_to_id("[MASK]")
    ]  # untouched
    # the same on the route that hands every sentence to the tokenizer (a non-BERT pipeline)
    other = Tokenizer.from_str(trained.to_str())
    other.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])
    assert bert_pipeline_lowercase(other) is None
    [ids] = encoded(SentenceEncoder(other), ["the [MASK] token and [SEP] and [cls] in text"])
    assert not specials & set(ids)


def encoded(encoder: SentenceEncoder, sentences: list[str]) -> list[list[int]]:
    ids, lengths = encoder.encode(sentences)
    assert len(lengths) == len(sentences) and int(lengths.sum()) == len(ids)
    ends = np.cumsum(lengths)
    return [ids[end - n : end].tolist() for end, n in zip(ends, lengths)]


@pytest.fixture(scope="module")
def wiki(data_dir):
    return wiki_sentences(data_dir, ["AA/wiki_03.gz", "AB/wiki_17.gz", "AC/wiki_42.gz"])


@pytest.fixture(scope="module")
def trained(data_dir):
    """A tokenizer as the tokenizer stage trains it: the special tokens are added tokens."""
    lines = (data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8").splitlines()[:3000]
    return train_tokenizer(lines, vocab_size=2000)


def test_real_text_equals_encode_batch_fast(minilm_dir, wiki):
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    encoder = SentenceEncoder(tok)
    assert encoder.lowercase is True
    batches = [wiki[i : i + 5000] for i in range(0, len(wiki), 5000)]
    got = [s for batch in batches for s in encoded(encoder, batch)]
    assert len(wiki) > 20_000
    assert got == reference(tok, wiki)


@pytest.mark.parametrize("kind", ["vocab.txt uncased", "vocab.txt cased", "trained"])
def test_cases_the_fast_path_must_hand_over(kind, minilm_dir, trained, wiki):
    if kind == "trained":
        tok = trained
        assert tok.get_added_tokens_decoder()  # [MASK] etc. are matched in raw text
    else:
        tok, _ = load_tokenizer(minilm_dir / "vocab.txt", lowercase=kind.endswith("uncased"))
    encoder = SentenceEncoder(tok)
    assert encoder.lowercase is (kind != "vocab.txt cased")  # the trained tokenizer lowercases
    mixed = [s for pair in zip(HARD_CASES, wiki[:: len(wiki) // len(HARD_CASES)]) for s in pair]
    assert encoded(encoder, mixed) == reference(tok, mixed)
    for case in HARD_CASES:  # alone too: a batch with nothing for the fast path, or nothing else
        assert encoded(encoder, [case]) == reference(tok, [case]), case
    assert encoded(encoder, []) == []


def test_routes_on_real_text(minilm_dir, wiki):
    """Most of Wikipedia takes the ASCII route, nearly all the rest the character table."""
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    encoder = SentenceEncoder(tok)
    routes = encoder._routes(wiki)
    table = np.flatnonzero(routes == sentence_encoder.TABLE)
    unsafe = [i for i in table if sentence_encoder._UNSAFE in wiki[i].translate(encoder._chars)]
    assert np.mean(routes == sentence_encoder.ASCII) > 0.8 and len(table) > 1000 and len(unsafe) < 10


def test_other_pipelines_use_the_tokenizer_itself(minilm_dir, wiki):
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])  # keeps accents
    assert bert_pipeline_lowercase(tok) is None
    assert encoded(SentenceEncoder(tok), HARD_CASES + wiki[:500]) == reference(tok, HARD_CASES + wiki[:500])
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    tok.enable_truncation(8)
    assert bert_pipeline_lowercase(tok) is None
    assert encoded(SentenceEncoder(tok), wiki[:500]) == reference(tok, wiki[:500])


def test_a_full_cache_starts_over(minilm_dir, wiki, monkeypatch):
    monkeypatch.setattr(sentence_encoder, "MAX_CACHED_WORDS", 3000)
    tok, _ = load_tokenizer(minilm_dir / "vocab.txt")
    encoder = SentenceEncoder(tok)
    got = []
    for i in range(0, 4000, 200):
        got += encoded(encoder, wiki[i : i + 200])
        assert len(encoder._index) <= 3000
    assert got == reference(tok, wiki[:4000])


def test_marks_that_normalization_reorders_go_to_the_tokenizer():
    """NFD puts combining marks in canonical order across characters, which a per-character table
    cannot: U+1D16D (class 226) before U+1D165 (class 216) is reordered, and only the reordered
    form is in this vocabulary."""
    from tokenizers.models import WordPiece

    from preprocessing.wordpiece import SPECIAL_TOKENS, _bert_pipeline, _set_template

    reordered = "a\U0001d165\U0001d16d"
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, "a", reordered, "b", "##b"])}
    tok = _set_template(_bert_pipeline(Tokenizer(WordPiece(vocab=vocab, unk_token="[UNK]")), True))
    sentences = ["b a\U0001d16d\U0001d165 b", "a\U0001d165\U0001d16d", "bb a"]
    assert reference(tok, sentences)[0] == [7, vocab[reordered], 7]
    assert encoded(SentenceEncoder(tok), sentences) == reference(tok, sentences)
