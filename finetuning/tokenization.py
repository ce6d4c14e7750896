"""The fine-tuning tokenizer: the `tokenizers` library, identical to transformers' fast BERT tokenizer.

`tokenizer.json` is used as is when the directory has one; otherwise a WordPiece tokenizer is
built from `vocab.txt` with the BERT normalizer (lower-casing from `tokenizer_config.json`),
the BERT pre-tokenizer and the `[CLS] A [SEP] B [SEP]` template. Padding is always off (batches
are padded dynamically) and truncation is set per task.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from common.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _do_lower_case(directory: Path) -> bool:
    meta = directory / "tokenizer_config.json"
    if meta.is_file():
        try:
            return bool(json.loads(meta.read_text(encoding="utf-8")).get("do_lower_case", True))
        except json.JSONDecodeError as exc:
            raise UserError(f"{meta} is not valid JSON: {exc}") from None
    return True


def wordpiece_from_vocab(vocab_file: Path, lowercase: bool = True) -> Tokenizer:
    vocab: dict[str, int] = {}
    for i, line in enumerate(vocab_file.read_text(encoding="utf-8").splitlines()):
        token = line.rstrip("\n")
        if token and token not in vocab:
            vocab[token] = i
    for tok in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"):
        if tok not in vocab:
            raise UserError(f"{vocab_file} has no {tok} token.", fix="use a BERT WordPiece vocab.txt.")
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """A fast BERT tokenizer from a model/tokenizer directory (tokenizer.json or vocab.txt)."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as exc:
            raise UserError(f"cannot read {directory / 'tokenizer.json'}: {exc}") from None
    elif (directory / "vocab.txt").is_file():
        tok = wordpiece_from_vocab(directory / "vocab.txt", _do_lower_case(directory))
    else:
        raise UserError(
            f"{directory} has no tokenizer.json or vocab.txt.",
            fix="pass --tokenizer DIR (a directory with the vocabulary the checkpoint was trained with).",
        )
    tok.no_padding()
    tok.no_truncation()
    if tok.token_to_id("[CLS]") is None or tok.token_to_id("[SEP]") is None:
        raise UserError(f"the tokenizer in {directory} has no [CLS]/[SEP] tokens.")
    return tok


def pad_id(tok: Tokenizer) -> int:
    pid = tok.token_to_id("[PAD]")
    return 0 if pid is None else pid
