"""The WordPiece tokenizer: train it from a corpus (streaming), load an existing one, save it.

Built on the `tokenizers` library with BERT's normalizer and pre-tokenizer, so a loaded
bert-base-uncased `vocab.txt` tokenizes exactly like `transformers.BertTokenizerFast`. The one
loader for every stage: preprocessing, pretraining checks and fine-tuning (which enables
truncation per task; padding is always off, batches are padded dynamically).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import WordPiece

from common.atomic import atomic_write_json, atomic_write_text
from common.errors import UserError
from common.jsonfile import read_json_object
from common.stage_output import model_dir_hint
from common.textfile import read_user_text
from common.tokenizer_config import declared_do_lower_case, normalizer_settings

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
VOCAB_NAME = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"
VOCAB_KEY = "--vocab / tokenizer.vocab"  # where a tokenizer path comes from, unless a caller says
TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_WORD_CHARS = 100  # WordPiece's max_input_chars_per_word (as BERT): a longer word is one [UNK]
# a text that may hold such a word (normalization can lengthen a word: the check is generous)
# a run that normalization can take over MAX_WORD_CHARS: NFD splits a Hangul syllable into up to
# three jamo (other decompositions add marks, which accent stripping removes again)
_LONG_RUN = re.compile(rf"\S{{{MAX_WORD_CHARS // 3 + 1},}}")


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _set_template(tok: Tokenizer) -> Tokenizer:
    """[CLS] $A [SEP] $B [SEP] with segment ids 0/1 (not set by training, so always set here).

    Padding and truncation settings of a loaded tokenizer.json are dropped: examples are built
    from unpadded, untruncated sentences.
    """
    tok.no_padding()
    tok.no_truncation()
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 30522,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    counts: Counter | None = None,
) -> Tokenizer:
    """Train WordPiece from texts; the corpus is streamed (twice), never held whole.

    `texts` must be re-iterable (a list or an object whose __iter__ restarts the stream).

    The alphabet is the `limit_alphabet` most frequent characters (BERT's vocabulary and
    transformers' BertWordPieceTokenizer keep 1,000): without a limit every character seen once
    takes two entries (`x` and `##x`), and on Wikipedia that was over half of a 16k vocabulary,
    leaving common words split (`worst` -> `wor ##st`). A word with a character outside the
    alphabet becomes [UNK], as in BERT.

    The Rust trainer gives `##x` continuation tokens their ids in hash-map order and uses those ids
    to break ties between equally frequent merges, so two runs on the same corpus can give
    different vocabularies (huggingface/tokenizers#1794). The first pass (which also counts the
    characters) collects those that can continue a word, and their `##x` tokens are registered
    before training: every id, and so every tie-break, is then fixed, and the same corpus always
    gives the same vocab.txt.

    Words longer than MAX_WORD_CHARS are left out of training (counted in `counts` as
    `words_skipped_over_100_chars`): WordPiece encodes such a word as one [UNK], so the pieces the
    trainer would learn from it could never be produced.
    """
    base = _bert_pipeline(
        Tokenizer(WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_WORD_CHARS)), lowercase
    )
    # a tokenizer of its own: `base` is locked while it trains, and the texts are read meanwhile
    splitter = _bert_pipeline(Tokenizer(WordPiece(unk_token=UNK)), lowercase)
    texts = _WithoutLongWords(texts, splitter, counts if counts is not None else Counter())
    alphabet, continuing = _alphabet(texts, base, limit_alphabet)
    continuations = [f"##{c}" for c in sorted(continuing)]
    trainer = trainers.WordPieceTrainer(
        vocab_size=max(vocab_size, len(SPECIAL_TOKENS) + len(continuations)),
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + continuations,
        limit_alphabet=len(alphabet),
        initial_alphabet=sorted(alphabet),  # counted as most frequent: exactly these are kept
        continuing_subword_prefix="##",
        show_progress=False,
    )
    base.train_from_iterator(_batches(texts), trainer=trainer)
    # rebuild so that only the five real special tokens are added tokens (the `##x` were registered
    # as "special" only to fix their ids during training)
    vocab = base.get_vocab(with_added_tokens=True)
    model = WordPiece(
        vocab=vocab, unk_token=UNK, max_input_chars_per_word=MAX_WORD_CHARS, continuing_subword_prefix="##"
    )
    tok = _bert_pipeline(Tokenizer(model), lowercase)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return _set_template(tok)


class _WithoutLongWords:
    """The training texts without the words WordPiece never encodes into pieces (longer than
    MAX_WORD_CHARS after normalization: they become one [UNK]); re-iterable like `texts`."""

    def __init__(self, texts: Iterable[str], tok: Tokenizer, counts: Counter) -> None:
        self.texts, self.tok, self.counts, self.passes = texts, tok, counts, 0

    def __iter__(self) -> Iterator[str]:
        self.passes += 1
        for text in self.texts:
            yield self._without_long_words(text) if _LONG_RUN.search(text) else text

    def _without_long_words(self, text: str) -> str:
        words = self.tok.pre_tokenizer.pre_tokenize_str(self.tok.normalizer.normalize_str(text))
        kept = [w for w, _ in words if len(w) <= MAX_WORD_CHARS]
        if self.passes == 1:
            self.counts["words_skipped_over_100_chars"] += len(words) - len(kept)
        return " ".join(kept)


def _alphabet(texts: Iterable[str], tok: Tokenizer, limit: int) -> tuple[set[str], set[str]]:
    """The `limit` most frequent word characters (after BERT normalization; ties by code point),
    and those of them that can continue a pre-tokenized word."""
    counts: Counter[str] = Counter()
    for batch in _batches(texts):
        for text in batch:
            counts.update(tok.normalizer.normalize_str(text))
    word_chars = [c for c in counts if not c.isspace()]
    alphabet = set(sorted(word_chars, key=lambda c: (-counts[c], c))[:limit])
    # through the normalizer too: it puts spaces around CJK ideographs, which so never continue a word
    # (registering `##中` gave 115 of make run's 8,192 ids that no text can produce)
    continuing = {
        c
        for c in alphabet
        if len(tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str("a" + c))) == 1
    }
    return alphabet, continuing


def _batches(texts: Iterable[str], size: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for t in texts:
        batch.append(t)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _read_vocab_txt(path: Path) -> dict[str, int]:
    lines = read_user_text(path, "vocabulary").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        token = token.rstrip("\r")
        if token == "" and token in vocab:
            raise UserError(
                f"{path}: lines {vocab[token] + 1} and {i + 1} are blank; a vocab.txt holds one token per "
                "line, its line number being its id.",
                fix="delete the blank lines (an editor or a script may have added them at the end).",
            )
        if token in vocab:
            raise UserError(
                f"{path}: token {token!r} appears twice (lines {vocab[token] + 1} and {i + 1}).",
                fix="a vocab.txt lists each token once, its line number being its id: use the file the "
                "model was trained with, or, if no model uses this vocabulary yet, delete the repeated line.",
            )
        vocab[token] = i
    return vocab


def _check_vocab_txt_beside(tok: Tokenizer, path: Path) -> None:
    """A vocab.txt next to `path` (a tokenizer.json) holds the same tokens with the same ids: the
    slow `transformers` tokenizer reads that file, the fast one the JSON, so a directory where they
    differ (one of them truncated or from another model) tokenizes differently by who reads it."""
    beside = path.parent / VOCAB_NAME
    if not beside.is_file():
        return
    words, listed = vocab_list(tok), _read_vocab_txt(beside)
    if len(listed) != len(words) or any(listed.get(w) != i for i, w in enumerate(words)):
        first = next((i for i, w in enumerate(words) if listed.get(w) != i), len(words))
        raise UserError(
            f"{path.parent}: {VOCAB_NAME} ({len(listed):,} tokens) and {TOKENIZER_JSON} ({len(words):,} "
            f"tokens) disagree (first at id {first:,}); `transformers` would tokenize this folder "
            "differently by which file it reads.",
            fix=f"rewrite {VOCAB_NAME} from the tokenizer the model was trained with, or delete the "
            "wrong file (either one is enough: the other is derived from it).",
        )


def _check_specials(tok: Tokenizer, path: Path) -> None:
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise UserError(
            f"{path}: the vocabulary lacks the special token{'' if len(missing) == 1 else 's'} "
            f"{', '.join(missing)}.",
            fix="use a BERT vocabulary holding [PAD] [UNK] [CLS] [SEP] [MASK], or train one with `bertflow tokenizer`.",
        )
    if tok.get_vocab_size(with_added_tokens=True) <= len(SPECIAL_TOKENS):
        raise UserError(
            f"{path}: the vocabulary holds only the special tokens {' '.join(SPECIAL_TOKENS)}, so every "
            "word would be [UNK].",
            fix="train a tokenizer on the corpus (`bertflow tokenizer`) or use a real BERT vocab.txt.",
        )


def _lowercase_from_dir(directory: Path, default: bool) -> bool:
    cfg = directory / TOKENIZER_CONFIG
    if not cfg.is_file():
        return default
    return declared_do_lower_case(read_json_object(cfg, "tokenizer config"), cfg, default)


def declared_lowercase(path: str | Path) -> bool | None:
    """`do_lower_case` of the tokenizer_config.json beside a vocab.txt (a file, or a directory
    without tokenizer.json); None when there is none, or when a tokenizer.json decides the casing."""
    path = tokenizer_file(path)
    if path.suffix == ".json" or not (path.parent / TOKENIZER_CONFIG).is_file():
        return None
    return _lowercase_from_dir(path.parent, True)


def tokenizer_file(path: str | Path, key: str = VOCAB_KEY) -> Path:
    """The file a tokenizer path means: itself, or in a directory its tokenizer.json, else its
    vocab.txt (a UserError naming `key`, the flag or setting that gave it, when a directory
    holds neither)."""
    path = Path(path)
    if not path.is_dir():
        return path
    for name in (TOKENIZER_JSON, VOCAB_NAME):
        if (path / name).is_file():
            return path / name
    raise UserError(
        f"{key} {path} holds neither {TOKENIZER_JSON} nor {VOCAB_NAME}{model_dir_hint(path)}.",
        fix=f"point {key} to a tokenizer directory (the output of `bertflow tokenizer` or a model "
        "directory), a vocab.txt or a tokenizer.json.",
    )


def load_tokenizer(
    path: str | Path, lowercase: bool | None = None, key: str = VOCAB_KEY
) -> tuple[Tokenizer, bool]:
    """Load a tokenizer dir, `tokenizer.json` or `vocab.txt`; returns (tokenizer, lowercase).
    Errors name `key`, the flag or setting that gave the path.

    A `tokenizer.json` is used as is (its normalizer decides casing). A bare `vocab.txt` gets BERT's
    normalizer with `lowercase` (default: do_lower_case of a tokenizer_config.json beside it, else True).
    """
    path = tokenizer_file(path, key)
    if not path.is_file():
        raise UserError(f"tokenizer file {path} does not exist.", fix=f"check the {key} path.")
    default_lower = _lowercase_from_dir(path.parent, True) if lowercase is None else lowercase
    if path.suffix == ".json":
        try:
            tok = Tokenizer.from_str(read_user_text(path, "tokenizer file"))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise UserError(f"{path} is not a tokenizers JSON file: {exc}") from None
        if not isinstance(tok.model, WordPiece):
            raise UserError(f"{path} holds a {type(tok.model).__name__} model; BERT needs WordPiece.")
        _check_specials(tok, path)
        _check_vocab_txt_beside(tok, path)
        lower = _json_lowercase(tok, default_lower)
        return _set_template(tok), lower
    vocab = _read_vocab_txt(path)
    tok = Tokenizer(WordPiece(vocab=vocab, unk_token=UNK, max_input_chars_per_word=MAX_WORD_CHARS))
    _check_specials(tok, path)
    return _set_template(_bert_pipeline(tok, default_lower)), default_lower


def _json_lowercase(tok: Tokenizer, default: bool) -> bool:
    norm = json.loads(tok.to_str()).get("normalizer") or {}
    return bool(norm.get("lowercase", default)) if norm.get("type") == "BertNormalizer" else default


def pad_id(tok: Tokenizer) -> int:
    return tok.token_to_id(PAD)


def vocabulary_sha256(vocab: list[str]) -> str:
    """The vocabulary's identity, the sha256 of a vocab.txt holding it (tokens in id order, one a
    line): what the shards' manifest records as tokenizer_sha256, however the tokenizer was stored."""
    return hashlib.sha256(("\n".join(vocab) + "\n").encode()).hexdigest()


def vocab_list(tok: Tokenizer) -> list[str]:
    """Tokens ordered by id (the lines of vocab.txt)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    words = [""] * len(vocab)
    for word, idx in vocab.items():
        words[idx] = word
    return words


def save_tokenizer(tok: Tokenizer, out_dir: str | Path, lowercase: bool) -> None:
    """Write vocab.txt, tokenizer.json and tokenizer_config.json (each atomically)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / VOCAB_NAME, "\n".join(vocab_list(tok)) + "\n")
    atomic_write_text(out_dir / TOKENIZER_JSON, tok.to_str())
    atomic_write_json(
        out_dir / TOKENIZER_CONFIG,
        {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": lowercase,
            "tokenize_chinese_chars": True,
            "strip_accents": None,
            **normalizer_settings(tok.to_str()),  # a loaded tokenizer.json's own normalizer wins
            "model_max_length": 512,
            "unk_token": UNK,
            "sep_token": SEP,
            "pad_token": PAD,
            "cls_token": CLS,
            "mask_token": MASK,
        },
    )


def tokenizer_difference(
    a: Path, b: Path, key_a: str = VOCAB_KEY, key_b: str = VOCAB_KEY, lowercase_b: bool | None = None
) -> str | None:
    """How the tokenizers at `a` and `b` (dirs or files) tokenize differently, in words: their
    vocabularies (ids) or their lowercasing; None when alike (identical copies, or the same
    vocabulary once as vocab.txt and once as tokenizer.json). `key_a`/`key_b` name where each path
    came from in errors; `lowercase_b`: the casing `b` is read with (`load_tokenizer`'s)."""
    return _difference(load_tokenizer(a, key=key_a), load_tokenizer(b, lowercase=lowercase_b, key=key_b))


def _difference(a: tuple[Tokenizer, bool], b: tuple[Tokenizer, bool]) -> str | None:
    """`tokenizer_difference` of two loaded (tokenizer, lowercase) pairs."""
    vocab_a, vocab_b = vocab_list(a[0]), vocab_list(b[0])
    if len(vocab_a) != len(vocab_b):
        return f"{len(vocab_a)} vs {len(vocab_b)} tokens"
    differ = next((i for i, (x, y) in enumerate(zip(vocab_a, vocab_b, strict=True)) if x != y), None)
    if differ is not None:
        return f"token id {differ} is {vocab_a[differ]!r} vs {vocab_b[differ]!r}"
    if a[1] != b[1]:
        return f"lowercase {a[1]} vs {b[1]}"
    return None


def refuse_other_tokenizer(checkpoint: str | Path, own: Path, given: Path) -> None:
    """A checkpoint's weights belong to its own vocabulary: a `--tokenizer` that tokenizes
    differently from the one the checkpoint carries (`own`) is refused, not silently used
    (an identical copy is fine)."""
    try:
        own_tokenizer = load_tokenizer(own)
    except UserError:
        return  # unreadable: then the given one is the way to read the checkpoint
    differs = _difference(own_tokenizer, load_tokenizer(given, key="--tokenizer"))
    if differs is not None:
        raise UserError(
            f"checkpoint {checkpoint} has a tokenizer of its own ({own}) and --tokenizer {given} "
            f"differs from it ({differs}); the checkpoint's weights were trained with its own "
            "vocabulary, so the given one would feed them other token ids.",
            fix="drop --tokenizer to use the checkpoint's own (--tokenizer is for a checkpoint without "
            "one, such as random:PRESET); a baseline with a vocabulary of its own is scored alone with "
            "`bertflow finetune --checkpoint DIR --output OUT`.",
        )
