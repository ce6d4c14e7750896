"""What goes wrong reading a corpus, said to the user: one line per file from the counts the readers
in `preprocessing/corpus.py` keep (`corpus_file_warnings`, said once by the tokenizer and preprocess
stages), and the flow's up-front refusal of a corpus none of whose files holds text
(`refuse_unreadable_corpus`). Each names the file and the command that fixes it: iconv for another
encoding, the tool that opens an archive or a compressed file, jq for a JSON array, a python line for
a Parquet or CSV table."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from pathlib import Path

from common.errors import UserError
from preprocessing.corpus import (
    ARCHIVE_KEY,
    ARRAY_KEY,
    BAD_JSON_KEY,
    BINARY_KEY,
    COMPRESSED,
    CUT_KEY,
    DAMAGED_KEY,
    EMPTY_KEY,
    LONG_LINES_KEY,
    LONG_ONLY_KEY,
    NO_TEXT_FIRST_KEY,
    NO_TEXT_KEY,
    NOT_UTF8_KEY,
    REPLACED_KEY,
    TABLE_KEY,
    TEXT_LINES_KEY,
    UNCLOSED_KEY,
    archive_kind,
    file_head,
    head_kind,
)

BINARY_FIX = (
    "the corpus is read as plain text, gzipped or not (a .bz2, .xz or .zip file must be decompressed first)"
)
# after the iconv command: the converted copy lands beside the original, where a folder or glob reads both
USE_CONVERTED = "use that file in place of this one (move this one out of a corpus folder or glob, which would read both)."
INVALID_UTF8_WARN_SHARE = 0.01  # of a file's lines: more is another encoding, not a stray byte


def binary_fix(path: str, archive: str | None) -> tuple[str, str]:
    """(what a skipped binary file is, what to do with it): the command that decompresses or
    unpacks an archive, naming what it writes."""
    if archive in COMPRESSED:
        _, tool, suffix = COMPRESSED[archive]
        out = path[: -len(suffix)] if path.endswith(suffix) else f"{path}.out"
        return (
            f"{'an' if archive == 'xz' else 'a'} {archive}-compressed file",
            f"decompress it with `{tool} {path}` (it writes {out}) and {USE_CONVERTED}",
        )
    if archive in ("zip", "tar"):
        folder = re.sub(r"(\.tar\.gz|\.tgz|\.tar|\.zip)$", "", path)
        folder = folder if folder != path else f"{path}.files"
        unpack = (
            f"unzip {path} -d {folder}"
            if archive == "zip"
            else f"mkdir {folder} && tar xf {path} -C {folder}"
        )
        return f"a {archive} archive", (
            f"unpack it with `{unpack}` and name the folder {folder} in place of this file (move this one "
            "out of a corpus folder or glob)."
        )
    if archive == "parquet":  # a Hugging Face dataset's format; pyarrow comes with bertflow
        jsonl = re.sub(r"\.parquet$", "", path) + ".jsonl"
        write = (
            f"import json, pyarrow.parquet as pq; out = open('{jsonl}', 'w'); [out.write(json.dumps("
            "{'text': t}, ensure_ascii=False) + '\\n') for b in pq.ParquetFile("
            f"'{path}').iter_batches(columns=['text']) for t in b.column(0).to_pylist()]"
        )
        return "a Parquet file", (
            f'write its text column as JSON lines (`python -c "{write}"`, your column\'s name for '
            f"'text') and {USE_CONVERTED}"
        )
    return "a binary file (NUL bytes)", f"{BINARY_FIX}."


def refuse_unreadable_corpus(files: list[Path], key: str) -> None:
    """A corpus whose every file the reader would skip unread (binary, or UTF-16/32 text; empty
    files aside) is refused naming the first such file and the fix, before any stage runs (the flow's
    tokenizer would otherwise train on its own input first). Reads the first SNIFF_BYTES of each
    file, up to the first of text; a file it cannot open is left to the stage to say."""
    skipped: list[tuple[Path, str, bytes]] = []
    for path in files:
        try:
            kind = head_kind(head := file_head(path))
        except (EOFError, OSError, zlib.error):
            return
        if head and kind is None:
            return
        skipped += [(path, kind, head)] if kind else []
    if not skipped:
        return  # every file empty: the stages say so
    path, kind, head = skipped[0]
    rest = f" (and no other file of {key} holds text either)" if len(files) > 1 else ""
    if kind == "binary":
        what, fix = binary_fix(str(path), archive_kind(head))
        raise UserError(
            f"{key}: {path} is {what}, not text{rest}: the run would find no document.",
            fix=f"name your text corpus in {key}: {fix}",
        )
    raise UserError(
        f"{key}: {path} is {kind} text, not UTF-8{rest}: the run would find no document.",
        fix=f"convert it with `iconv -f {kind} -t UTF-8 {path} > {_utf8_name(str(path))}` and name that file.",
    )


def unread_files(counts: Mapping[str, int]) -> list[str]:
    """The files the reader skipped whole, as their keys in `counts` name them (binary, UTF-16/32,
    empty, only lines over 1 MiB, one JSON array): no text of theirs is in the run."""
    paths = set()
    for key in counts:
        if key.startswith(NOT_UTF8_KEY):
            paths.add(key[len(NOT_UTF8_KEY) :].split(":", 1)[1])
        for whole in (BINARY_KEY, EMPTY_KEY, LONG_ONLY_KEY, ARRAY_KEY):
            if key.startswith(whole):
                paths.add(key[len(whole) :])
    return sorted(paths)


def _utf8_name(path: str) -> str:
    return (path[:-4] if path.endswith(".txt") else path) + ".utf8.txt"


def corpus_file_warnings(counts: Mapping[str, int], empty: bool = True) -> list[str]:
    """One line per corpus file of another encoding than UTF-8 (a UTF-16/32 file, skipped; or a
    meaningful share of lines with invalid UTF-8, replaced), naming it and the iconv command; one
    per binary file (skipped), per JSONL file with lines that are not JSON or hold no string `text`
    (skipped), per file with lines over 1 MiB (skipped), per damaged file, per file with unclosed
    <doc> tags and (`empty`) per empty file: what the reader counted, said once by the stage."""
    found = []
    firsts = dict(json.loads(k[len(NO_TEXT_FIRST_KEY) :]) for k in counts if k.startswith(NO_TEXT_FIRST_KEY))
    archives = dict(
        reversed(k[len(ARCHIVE_KEY) :].split(":", 1)) for k in counts if k.startswith(ARCHIVE_KEY)
    )
    for key, n in sorted(counts.items()):
        if (line := _read_trouble(key, n, counts, empty)) is not None:
            found += [line] if line else []
        elif key.startswith(NOT_UTF8_KEY):
            encoding, path = key[len(NOT_UTF8_KEY) :].split(":", 1)
            found.append(
                f"{path} is {encoding} text, not UTF-8, and was skipped: convert it with "
                f"`iconv -f {encoding} -t UTF-8 {path} > {_utf8_name(path)}` and {USE_CONVERTED}"
            )
        elif key.startswith(BAD_JSON_KEY):
            found.append(
                f"{key[len(BAD_JSON_KEY) :]}: {n} line{' is' if n == 1 else 's are'} not valid JSON, skipped (each line of a "
                'JSONL file must be one JSON object, double-quoted: {"text": "..."}).'
            )
        elif key.startswith(NO_TEXT_KEY):
            path = key[len(NO_TEXT_KEY) :]
            found.append(
                f'{path}: {n} line{" has" if n == 1 else "s have"} no string "text" field, skipped '
                f"(the first {firsts.get(path, 'is not a JSON object')}); each line of a JSONL file must be "
                'one JSON object with its document in "text": {"text": "..."}.'
            )
        elif key.startswith(LONG_ONLY_KEY):
            found.append(
                f"{key[len(LONG_ONLY_KEY) :]}: all its text is in {n} line{'' if n == 1 else 's'} longer "
                "than 1 MB, skipped (a line is read whole: a paragraph or a sentence). Break it into "
                "lines, a blank line between documents (JSONL: one document per line, each under 1 MB)."
            )
        elif key.startswith(BINARY_KEY):
            path = key[len(BINARY_KEY) :]
            what, fix = binary_fix(path, archives.get(path))
            found.append(f"{path} is {what}, not text, and was skipped: {fix}")
        elif key.startswith(REPLACED_KEY):
            path = key[len(REPLACED_KEY) :]
            lines = counts.get(TEXT_LINES_KEY + path, 0)
            if lines and n / lines >= INVALID_UTF8_WARN_SHARE:
                found.append(
                    f"{path}: {n} of {lines} lines ({n / lines:.0%}) are not valid UTF-8; their bad bytes "
                    "were replaced by U+FFFD, so their accented letters are lost (the file is likely "
                    f"Latin-1 / Windows-1252): convert it with `iconv -f latin1 -t utf-8 {path} > "
                    f"{_utf8_name(path)}` and {USE_CONVERTED}"
                )
    return found


def _read_trouble(key: str, n: int, counts: Mapping[str, int], empty: bool) -> str | None:
    """The warning of a damaged file, an empty one, lines over 1 MiB, unclosed <doc> tags or a JSON
    array ('' for the bad lines of that array: said by it); None for other keys."""
    if key.startswith(ARRAY_KEY):
        path = key[len(ARRAY_KEY) :]
        jsonl = (path[:-5] if path.endswith(".json") else path) + ".jsonl"
        return (
            f"{path} holds one JSON array, not JSON lines (one object per line), and was skipped: convert "
            f"it with `jq -c '.[]' {path} > {jsonl}` and {USE_CONVERTED}"
        )
    if key.startswith((BAD_JSON_KEY, NO_TEXT_KEY)) and ARRAY_KEY + key.split(":", 1)[1] in counts:
        return ""
    if key.startswith(DAMAGED_KEY):
        path, error = json.loads(key[len(DAMAGED_KEY) :])
        return (
            f"{path}: damaged ({error}); the documents before the damage were kept, the rest of the "
            "file is lost (a cut-off download or copy: fetch or compress it again)."
        )
    if key.startswith(EMPTY_KEY) and empty:
        return f"{key[len(EMPTY_KEY) :]}: empty file (no text), skipped."
    if key.startswith(LONG_LINES_KEY) and LONG_ONLY_KEY + key[len(LONG_LINES_KEY) :] not in counts:
        return (
            f"{key[len(LONG_LINES_KEY) :]}: {n} line{'' if n == 1 else 's'} longer than 1 MB skipped (a line "
            "is read whole: a paragraph or a sentence); break such lines up to keep their text."
        )
    if key.startswith(TABLE_KEY):
        return _table_warning(key[len(TABLE_KEY) :])
    if key.startswith(CUT_KEY):
        return (
            f"{key[len(CUT_KEY) :]}: {n} cut{'' if n == 1 else 's'} in text without a blank line: a plain-text "
            "document ends at a blank line, and one over 1 MB is read in parts of 1 MB, each a document. "
            "If each line is a document, put a blank line after each (`sed G`) or write JSONL: read as "
            "one, its next-sentence pairs join unrelated documents."
        )
    if key.startswith(UNCLOSED_KEY):
        return (
            f"{key[len(UNCLOSED_KEY) :]}: {n} <doc> tag{'' if n == 1 else 's'} without </doc>; the text up "
            "to the next <doc> or the end of the file was kept as a document (a cut-off WikiExtractor file?)."
        )
    return None


def _table_warning(path: str) -> str:
    """A .csv/.tsv file is read as plain text: said, with the python line that writes its text
    column as JSON lines (csv is in Python's standard library)."""
    jsonl = re.sub(r"\.(csv|tsv)(\.gz)?$", "", path) + ".jsonl"
    opened = (
        f"gzip.open('{path}', 'rt', newline='')" if path.endswith(".gz") else f"open('{path}', newline='')"
    )
    delimiter = "'\\t'" if re.search(r"\.tsv(\.gz)?$", path) else "','"
    write = (
        f"import csv, gzip, json, sys; csv.field_size_limit(sys.maxsize); out = open('{jsonl}', 'w'); "
        "[out.write(json.dumps({'text': r['text']}, ensure_ascii=False) + '\\n') for r in "
        f"csv.DictReader({opened}, delimiter={delimiter})]"
    )
    return (
        f"{path} is read as plain text, each row a line, its other columns, delimiters and quotes included "
        f'(a .csv or .tsv is not read by column): write its text column as JSON lines (`python -c "{write}"`, '
        f"your column's name for 'text') and {USE_CONVERTED}"
    )
