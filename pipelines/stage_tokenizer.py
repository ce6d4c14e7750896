"""Stage 1, `bertflow tokenizer`: train a WordPiece vocabulary from the corpus (or load one).

Writes vocab.txt, tokenizer.json ([CLS] $A [SEP] $B [SEP] template) and tokenizer_config.json,
then the completion marker. A rerun with the same settings and inputs is a no-op.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from common.atomic import (
    MARKER_NAME,
    mark_in_progress,
    read_marker,
    remove_temp_files,
    sha256_file,
    write_marker,
)
from common.console import command_logging
from common.dir_lock import exclusive_dir
from common.errors import UserError
from common.fingerprint import content_stamp
from common.paths import resolve_data_path
from common.stage_output import check_own_output, refuse_foreign_files
from pipelines.stage_keys import code_change_note, stage_code, stage_dir, stage_key_inputs, write_stage_key
from preprocessing.config import TokenizerConfig
from preprocessing.corpus import expand_inputs, iter_texts
from preprocessing.corpus_trouble import corpus_file_warnings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from pipelines.config import PipelineConfig

log = logging.getLogger("bertflow.tokenizer")
OUTPUT_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")
# settings of training a vocabulary, which loading one (tokenizer.vocab) does not use
TRAINING_ONLY = ("input", "vocab_size", "min_frequency", "limit_alphabet")


def _files_intact(out_dir: Path, checksums: dict[str, str] | None) -> bool:
    """True when every output file exists with the sha256 the marker recorded."""
    if not checksums or set(checksums) != set(OUTPUT_FILES):
        return False
    return all((out_dir / n).is_file() and sha256_file(out_dir / n) == h for n, h in checksums.items())


def _check_declared_case(source: Path, lowercase: bool) -> None:
    """A vocab.txt whose tokenizer_config.json declares the other casing is refused before any work:
    read with `tokenizer.lowercase`, its cased entries would never match (or the reverse)."""
    from preprocessing.wordpiece import declared_lowercase

    declared = declared_lowercase(source)
    if declared is not None and declared != lowercase:
        said, want = str(declared).lower(), str(lowercase).lower()
        flag = " (leave out --cased, which sets it to false)" if declared else " (or --cased)"
        raise UserError(
            f"{source} comes with a tokenizer_config.json that says do_lower_case {said}, but "
            f"tokenizer.lowercase is {want}: the vocabulary would be read with the other casing.",
            fix=f"set tokenizer.lowercase: {said}{flag}, or remove the tokenizer_config.json if it is wrong.",
        )


def _same_loaded_vocabulary(out_dir: Path, done: dict, cfg: TokenizerConfig, source: Path | None) -> bool:
    """A finished --output holding a loaded vocabulary (its marker records no settings) is kept:
    True for the same tokenizer again (nothing to do); another one, loaded or trained, is refused
    (the shards made with the old one would match no tokenizer)."""
    from preprocessing.wordpiece import load_tokenizer

    old = f"{done.get('vocab_source') or 'a vocabulary'} (tokenizer sha256 {str(done.get('tokenizer_sha256'))[:12]})"
    if source is not None:
        tok, _ = load_tokenizer(source, lowercase=cfg.lowercase)
        sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
        if sha == done.get("tokenizer_sha256"):
            return _files_intact(out_dir, done.get("files"))
        new = f"--vocab {source} (tokenizer sha256 {sha[:12]}: another vocabulary or casing)"
    else:
        new = "a vocabulary trained from --input"
    raise UserError(
        f"{out_dir} holds a finished tokenizer output loaded from {old}; bertflow tokenizer would "
        f"replace it with {new}, and shards made with the old one would match no tokenizer.",
        fix=f"choose another --output for this vocabulary, or delete {out_dir} first to replace it.",
    )


def vocab_source(cfg: TokenizerConfig, data_root: str | None) -> Path:
    """The file `tokenizer.vocab` names, its declared casing checked against `tokenizer.lowercase`."""
    source = resolve_data_path(cfg.vocab, data_root)
    _check_declared_case(source, cfg.lowercase)
    return source


# Hangul conjoining letters (jamo): what Unicode NFD, which `lowercase` applies to strip accents,
# splits each Hangul syllable into
_JAMO = range(0x1100, 0x1200)
JAMO_WARN_SHARE = 0.05  # of the trained vocabulary's tokens


def hangul_warning(cfg: TokenizerConfig, tok) -> str | None:
    """A lowercased vocabulary of Korean text: BERT-uncased's normalization (NFD, accents stripped)
    splits every Hangul syllable into its letters, so WordPieces are letters and the tokens per word
    several times those of a cased vocabulary, unsaid (`서울은` → `ᄉ ##ᅥ ...`)."""
    from preprocessing.wordpiece import vocab_list

    if not cfg.lowercase:
        return None
    words = vocab_list(tok)
    jamo = sum(any(ord(c) in _JAMO for c in w) for w in words)
    if jamo < JAMO_WARN_SHARE * len(words):
        return None
    return (
        f"{jamo} of the {len(words)} WordPieces hold Hangul letters (jamo): tokenizer.lowercase true "
        "normalizes text as BERT-uncased does (Unicode NFD, accents stripped), which splits every Hangul "
        "syllable into its letters, so a Korean word becomes several pieces of single letters. For Korean "
        "text set tokenizer.lowercase: false (`bertflow tokenizer --cased`), as multilingual BERT's cased "
        "model does."
    )


def vocab_size_warning(cfg: TokenizerConfig, tok) -> str | None:
    """A trained vocabulary whose size is not tokenizer.vocab_size, and why (None when it is)."""
    from preprocessing.wordpiece import SPECIAL_TOKENS, vocab_list

    got = tok.get_vocab_size()
    if got == cfg.vocab_size:
        return None
    if got > cfg.vocab_size:
        chars = [t for t in vocab_list(tok) if len(t) == 1 or (len(t) == 3 and t.startswith("##"))]
        return (
            f"tokenizer.vocab_size is {cfg.vocab_size}, but the trained vocabulary has {got} tokens: the "
            f"{len(SPECIAL_TOKENS)} special tokens and the corpus's alphabet ({len(chars)} entries: its "
            "characters and their ## continuations, up to tokenizer.limit_alphabet characters) are always "
            f"kept. Raise vocab_size to at least {got}, or lower limit_alphabet ({cfg.limit_alphabet})."
        )
    return (
        f"tokenizer.vocab_size is {cfg.vocab_size}, but the corpus gave only {got} tokens: the trainer "
        "found no further merge (each remaining pair of pieces occurs fewer than tokenizer.min_frequency "
        f"({cfg.min_frequency}) times, or is already a whole word). Use a larger corpus or a lower "
        "min_frequency, or set vocab_size to what it gives."
    )


def unused_training_settings(cfg: TokenizerConfig) -> str | None:
    """With tokenizer.vocab (a vocabulary loaded, not trained), the training settings that differ
    from their defaults are not used: said, not refused (a config may keep them from a template;
    the command-line flags are refused in `main`)."""
    if not cfg.vocab:
        return None
    unused = [
        f"tokenizer.{k} {getattr(cfg, k)}"
        for k in TRAINING_ONLY
        if k != "input" and getattr(cfg, k) != TokenizerConfig.model_fields[k].default
    ]
    if not unused:
        return None
    return (
        f"{', '.join(unused)} not used: the vocabulary is loaded from tokenizer.vocab {cfg.vocab}, not "
        "trained (drop tokenizer.vocab to train one with these settings)."
    )


def run_tokenizer_stage(
    cfg: TokenizerConfig,
    out_dir: Path,
    data_root: str | None = None,
    replace: bool = True,
    flow: PipelineConfig | None = None,
) -> Path:
    """Write vocab.txt, tokenizer.json and tokenizer_config.json to `out_dir`: loaded from
    `tokenizer.vocab`, or trained on the corpus; a trained one is reused while its settings, corpus
    and files are unchanged. `replace` False (an --output the user named): a vocabulary trained
    there with other settings or inputs is refused, not retrained over. `flow`: the config whose flow writes `out_dir`, whose command the note on an output of other
    code names (a stage command's flags among its --set items: `PipelineConfig.with_section`); None:
    a folder of the user's (--output), which the note says to delete and make again with the same
    command. Returns `out_dir`."""
    from preprocessing.wordpiece import load_tokenizer, save_tokenizer

    out_dir = Path(out_dir)
    check_own_output(out_dir, "tokenizer", {})
    refuse_foreign_files(out_dir, "tokenizer", OUTPUT_FILES)
    if cfg.vocab:
        source = vocab_source(cfg, data_root)
        identity = None  # loading is cheap: always redone
    else:
        files = expand_inputs(cfg.input, data_root)
        identity = {"config": cfg.model_dump(), "inputs": [content_stamp(p) for p in files]}
    done = read_marker(out_dir)
    if not replace and done is not None and done.get("identity") is not None:
        from pipelines.key_change import refuse_replacing

        refuse_replacing(out_dir, "tokenizer", done["identity"], identity or {"config": cfg.model_dump()})
    if not replace and done is not None and done.get("identity") is None:
        if _same_loaded_vocabulary(out_dir, done, cfg, source if cfg.vocab else None):
            log.info("tokenizer in %s is up to date (the same vocabulary)", out_dir)
            return out_dir
    if identity is not None and done is not None and done.get("identity") == identity:
        if _files_intact(out_dir, done.get("files")):
            log.info("tokenizer in %s is up to date", out_dir)
            if note := code_change_note(
                "tokenizer", [out_dir], cfg=flow, own_output=None if flow else out_dir
            ):
                log.warning(note)
            return out_dir
        log.warning("tokenizer files in %s differ from their checksums: retraining", out_dir)
    with exclusive_dir(out_dir, "the tokenizer stage"):
        mark_in_progress(out_dir)  # a killed run's files are its own to rewrite, not the user's
        (out_dir / MARKER_NAME).unlink(missing_ok=True)
        remove_temp_files(out_dir, OUTPUT_FILES)  # leftovers of a killed run's writes, not the user's .tmp-*
        counts: Counter = Counter()
        warnings: list[str] = []
        if cfg.vocab:
            tok, lowercase = load_tokenizer(source, lowercase=cfg.lowercase)
            log.info("loaded %s (%d tokens)", source, tok.get_vocab_size())
            warnings.append(unused_training_settings(cfg))
        else:
            tok, lowercase = _train(cfg, files, counts), cfg.lowercase
            warnings += [
                vocab_size_warning(cfg, tok),
                hangul_warning(cfg, tok),
                *corpus_file_warnings(counts),
            ]
        warnings = [w for w in warnings if w]
        for line in warnings:
            log.warning("%s: %s", out_dir, line)
        save_tokenizer(tok, out_dir, lowercase)
        sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
        write_marker(
            out_dir,
            {
                "stage": "tokenizer",
                "identity": identity,
                "vocab_source": str(source) if cfg.vocab else None,
                "files": {name: sha256_file(out_dir / name) for name in OUTPUT_FILES},
                "vocab_size": tok.get_vocab_size(),
                "tokenizer_sha256": sha,
                "corpus": dict(counts),
                "warnings": warnings,
                "code": stage_code("tokenizer"),
            },
        )
        log.info("wrote %s (vocab %d)", out_dir, tok.get_vocab_size())
        return out_dir


def _train(cfg: TokenizerConfig, files: list[Path], counts: Counter) -> Tokenizer:
    """WordPiece trained on `files` (`counts` gets the corpus counters); a corpus with no
    document, or one that gives an empty vocabulary, is refused."""
    from preprocessing.wordpiece import train_tokenizer

    log.info("training WordPiece (vocab %d) on %d file(s)", cfg.vocab_size, len(files))
    tok = train_tokenizer(
        _Corpus(files, counts),
        cfg.vocab_size,
        cfg.lowercase,
        cfg.min_frequency,
        cfg.limit_alphabet,
        counts=counts,
    )
    if counts["words_skipped_over_100_chars"]:
        log.warning(
            "left %d word(s) longer than 100 characters out of the vocabulary (WordPiece encodes "
            "each as one [UNK])",
            counts["words_skipped_over_100_chars"],
        )
    if counts["documents_read"] == 0:
        raise UserError(
            f"the corpus {', '.join(map(str, files))} holds no documents to train a vocabulary on.",
            fix=" ".join(corpus_file_warnings(counts, empty=False))
            or "check tokenizer.input (--input): plain text needs non-empty lines, WikiExtractor files "
            "<doc> blocks, JSONL a 'text' field.",
        )
    if tok.get_vocab_size() < 6:
        raise UserError("the trained vocabulary is empty.", fix="use a larger corpus or lower min_frequency.")
    return tok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument

    parser.add_argument("config", nargs="?", help="pipeline YAML (section `tokenizer:`)")
    parser.add_argument("--input", action="append", help="corpus file or glob (repeatable)")
    parser.add_argument(
        "--output", help="output directory (default: RUN_DIR/tokenizer/KEY, where the flow puts it)"
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="WordPiece vocabulary size incl. special tokens (= tokenizer.vocab_size)",
    )
    parser.add_argument("--cased", action="store_true", help="keep case (default: lowercase)")
    parser.add_argument("--vocab", help="load this vocab.txt / tokenizer.json instead of training")
    add_set_argument(parser, dest="set")


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from pipelines.config import load_config, section_flag_error

    command_logging()
    cfg = load_config(args.config, args.set)
    section = cfg.tokenizer.model_dump()
    if args.input:
        section["input"] = args.input
    if args.vocab_size is not None:
        section["vocab_size"] = args.vocab_size
    if args.cased:
        section["lowercase"] = False
    if args.vocab:
        section["vocab"] = args.vocab
    try:
        tcfg = TokenizerConfig.model_validate(section)
    except ValidationError as exc:
        given = {"input": args.input, "vocab_size": args.vocab_size, "vocab": args.vocab}
        flagged = {k: v for k, v in given.items() if v is not None}
        raise section_flag_error(exc, "tokenizer", flagged, cfg.tokenizer.model_dump()) from None
    refuse_training_flags(args, tcfg)
    flow_cfg = cfg.with_section("tokenizer", tcfg)  # the flags as --set items of its flow command
    out = Path(args.output) if args.output else stage_dir(flow_cfg, "tokenizer")  # or where the flow puts it
    flow = None if args.output else flow_cfg  # whose flow command recomputes the folder
    run_tokenizer_stage(tcfg, out, cfg.data_root, replace=not args.output, flow=flow)
    if not args.output:
        write_stage_key(out, stage_key_inputs(flow_cfg)["tokenizer"])
    print(out)
    return 0


def refuse_training_flags(args: argparse.Namespace, tcfg: TokenizerConfig) -> None:
    """Flags that only apply when training (--input, --vocab-size, --set tokenizer.KEY of
    TRAINING_ONLY) next to a loaded vocabulary would be silently ignored: refused, naming them."""
    if not tcfg.vocab:
        return
    flags = (("--input", bool(args.input)), ("--vocab-size", args.vocab_size is not None))
    given = [flag for flag, present in flags if present]
    given += [
        f"--set {item}"
        for item in args.set or []
        if item.split("=", 1)[0].strip() in {f"tokenizer.{k}" for k in TRAINING_ONLY}
    ]
    if given:
        raise UserError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only when training a "
            f"vocabulary, but this one is loaded from "
            f"{tcfg.vocab} (--vocab / tokenizer.vocab): they would be ignored.",
            fix="drop them to load the vocabulary, or drop --vocab (and tokenizer.vocab) to train one with them.",
        )


class _Corpus:
    """The corpus as a re-iterable stream (training reads it twice); skips are counted on the first
    pass, and said once, per file, after training (corpus_file_warnings)."""

    def __init__(self, files: list[Path], counts: Counter) -> None:
        self.files, self.counts, self.passes = files, counts, 0

    def __iter__(self):
        self.passes += 1
        return iter_texts(self.files, self.counts if self.passes == 1 else Counter(), quiet=True)
