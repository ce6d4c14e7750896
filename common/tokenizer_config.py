"""What a Hugging Face tokenizer_config.json must say for transformers to tokenize as a
tokenizer.json does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.errors import UserError


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


def declared_do_lower_case(meta: dict[str, Any], path: Path, default: bool) -> bool:
    """`do_lower_case` of a tokenizer_config.json (`meta`, read from `path`), `default` when it has
    none. transformers writes a JSON boolean; anything else is refused, since read as a truth value
    the string "false" would lowercase a cased vocabulary (as transformers itself would)."""
    value = meta.get("do_lower_case", default)
    if not isinstance(value, bool):
        raise UserError(
            f"{path}: do_lower_case is {json.dumps(value)}, not true or false; read as a truth value "
            'it could say the opposite of what it means (the string "false" is true).',
            fix='write it as a JSON boolean, without quotes: "do_lower_case": false for a cased '
            "vocabulary, true for an uncased one.",
        )
    return value
