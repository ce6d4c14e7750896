"""What a Hugging Face tokenizer_config.json must say for transformers to tokenize as a
tokenizer.json does."""

from __future__ import annotations

import json
from typing import Any


def normalizer_settings(tokenizer_json: str) -> dict[str, Any]:
    """The tokenizer_config.json settings that transformers' BertTokenizerFast rebuilds its
    normalizer from (`do_lower_case`, `strip_accents`, `tokenize_chinese_chars`), read from a
    tokenizer.json's BertNormalizer: written to match, transformers tokenizes as the file does.
    Empty for another normalizer."""
    norm = json.loads(tokenizer_json).get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        return {}
    return {
        "do_lower_case": bool(norm.get("lowercase", True)),
        "strip_accents": norm.get("strip_accents"),
        "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True)),
    }
