"""Corpus readers: WikiExtractor `<doc>` files, plain text (blank line between documents) and JSONL.

Files may be gzip-compressed, on local disk or on any filesystem Beam knows (`s3://`, `gs://`,
`hdfs://`): every read goes through `preprocessing.storage` (Beam's FileSystems). Every
irregularity is counted in a `Counter` (it ends up in stats.json), never silently dropped, never a
traceback: non-UTF-8 bytes (replaced), UTF-16/32 files, empty and binary files (archives named),
lines over 1 MB, damaged .gz files, unclosed `<doc>` tags, text outside `<doc>`, bad JSON lines, a
JSON array, empty documents, plain-text documents cut at 1 MB. The stages say each file's trouble
once, from the counts (`preprocessing/corpus_trouble.py`); a read that is not `quiet` also logs it
as it goes.
"""

from __future__ import annotations

import glob
import gzip
import json
import logging
import os
import posixpath
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from common.errors import UserError
from common.paths import resolve_data_path

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20  # lines longer than this are skipped and counted
MAX_DOC_CHARS = 1 << 20  # a plain-text document is cut into parts of about this size (memory)
READ_BLOCK_BYTES = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"\r\n|\r|\n")
SNIFF_BYTES = 8192
# UTF-16/32 byte-order marks (0xFF and 0xFE never occur in UTF-8), longest first
_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
# per-file counts of encoding trouble, keyed by the file (kept out of stats.json's `skipped`):
NOT_UTF8_KEY = "not_utf8:"  # not_utf8:ENCODING:PATH = 1, a UTF-16/32 file (skipped)
REPLACED_KEY = "utf8_replaced_lines:"  # utf8_replaced_lines:PATH = lines with invalid UTF-8 replaced
TEXT_LINES_KEY = "text_lines:"  # text_lines:PATH = its non-blank lines (counted only beside the above)
BINARY_KEY = "binary:"  # binary:PATH = 1, a file with NUL bytes in its head (skipped)
BAD_JSON_KEY = "bad_json:"  # bad_json:PATH = its JSONL lines that are not JSON (skipped)
NO_TEXT_KEY = "no_text:"  # no_text:PATH = its JSONL lines without a string `text` (skipped)
NO_TEXT_FIRST_KEY = "no_text_first:"  # no_text_first:["PATH", "what its first such line holds"] = 1
LONG_ONLY_KEY = "long_lines_only:"  # long_lines_only:PATH = its lines, all over 1 MiB (skipped)
LONG_LINES_KEY = "long_lines:"  # long_lines:PATH = its lines over 1 MiB (skipped)
EMPTY_KEY = "empty:"  # empty:PATH = 1, a file without text
DAMAGED_KEY = "damaged:"  # damaged:["PATH", "the error"] = 1, a file read up to its damage
UNCLOSED_KEY = "unclosed_doc:"  # unclosed_doc:PATH = its <doc> tags without </doc>
ARRAY_KEY = "json_array:"  # json_array:PATH = 1, a JSONL file whose first line opens a JSON array
TABLE_KEY = "table:"  # table:PATH = 1, a .csv or .tsv file read as plain text
CUT_KEY = "doc_cuts:"  # doc_cuts:PATH = its plain-text documents' cuts at MAX_DOC_CHARS
ARCHIVE_KEY = "archive:"  # archive:KIND:PATH = 1, a binary file that is a compressed file or archive
# compressions the reader does not open, by their magic bytes: (the tool that decompresses, its suffix)
COMPRESSED = {
    "bzip2": (b"BZh", "bunzip2 -k", ".bz2"),
    "xz": (b"\xfd7zXZ\x00", "unxz -k", ".xz"),
    "zstd": (b"\x28\xb5\x2f\xfd", "unzstd", ".zst"),
}
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_DOC_OPEN = re.compile(r"^<doc(\s[^>]*)?>\s*$")
_TITLE = re.compile(r'title="([^"]*)"')


@dataclass
class Document:
    doc_id: str  # "<file label>:<ordinal in file>", stable for the same inputs
    paragraphs: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.paragraphs)


def match_inputs(patterns: list[str], data_root: str | None = None) -> tuple[list[Path], list[str]]:
    """Corpus entries → (the sorted, de-duplicated files they name, the entries that name none).

    An entry is a file, a folder (every file below it, hidden ones skipped) or a glob (`**`
    allowed); `data:` paths are relative to the data root. Never raises: see `expand_inputs`.
    """
    files: set[Path] = set()
    unmatched: list[str] = []
    for pattern in patterns:
        found = _entry_files(resolve_data_path(pattern, data_root))
        if not found:
            unmatched.append(pattern)
        files.update(found)
    return sorted(files), unmatched


def _entry_files(path: Path) -> list[Path]:
    text = str(path)
    # an existing file or folder is itself, even when its name holds glob characters (`wiki[1].txt`)
    literal = path.exists() or not glob.has_magic(text)
    matches = [path] if literal else [Path(m) for m in glob.glob(text, recursive=True)]
    files: list[Path] = []
    for match in matches:
        if match.is_dir():
            files += _folder_files(match)
        elif match.is_file():
            files.append(match)
    return [f.resolve() for f in files]


def _folder_files(folder: Path) -> list[Path]:
    """Every file below `folder`, hidden ones (a name starting with '.') left out, through symlinked
    folders as a `**` glob goes (Path.rglob does not), each real folder once (a link back up)."""
    files: list[Path] = []
    seen: set[str] = set()
    for root, dirs, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs.clear()
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [p for n in names if not n.startswith(".") and (p := Path(root, n)).is_file()]
    return files


def expand_inputs(
    patterns: list[str], data_root: str | None = None, remote_ok: bool = False
) -> list[Path | str]:
    """The files of the corpus entries (see `match_inputs`): local ones as Paths, object-store ones
    (`s3://...`, only with `remote_ok`) as URL strings. An entry naming no file is a UserError."""
    if not patterns:
        raise UserError(
            "no corpus input given.", fix="pass --input GLOB or set preprocess.input / tokenizer.input."
        )
    files: set[Path | str] = set()
    for pattern in patterns:
        if "://" in pattern:
            files.update(_expand_remote(pattern, remote_ok))
    local, unmatched = match_inputs([p for p in patterns if "://" not in p], data_root)
    if unmatched:
        resolved = resolve_data_path(unmatched[0], data_root)
        raise UserError(
            f"input {unmatched[0]!r} matches no file (looked for {resolved}).",
            fix="check the path or glob; `data:` paths are relative to the data root (BERTFLOW_DATA).",
        )
    files.update(local)
    return sorted(files, key=str)


def _expand_remote(pattern: str, remote_ok: bool) -> list[str]:
    if not remote_ok:
        raise UserError(
            f"input {pattern!r} is on an object store; only the preprocess stage reads those.",
            fix="give the tokenizer stage a local copy of (part of) the corpus, or an existing --vocab.",
        )
    from preprocessing import storage

    try:
        matches = [path for path, _ in storage.match(pattern)]
    except Exception as exc:  # Beam raises BeamIOError, or ValueError for an unknown scheme
        raise UserError(
            f"cannot list input {pattern!r}: {exc}",
            fix="check the URL and the filesystem's options (e.g. --s3_endpoint_url, credentials).",
        ) from None
    if not matches:
        raise UserError(f"input {pattern!r} matches no file.", fix="check the URL or glob.")
    return matches


def file_labels(paths: list[Path | str]) -> dict[Path | str, str]:
    """Short, stable names for document ids: each path relative to the inputs' common folder (the
    file name alone for one file), the same for a corpus on local disk or in a bucket (`s3://...`)."""
    split = [str(p).split("/") for p in paths]
    if len(paths) == 1:
        return {paths[0]: split[0][-1]}
    common = posixpath.commonprefix([parts[:-1] for parts in split])
    return {p: "/".join(parts[len(common) :]) for p, parts in zip(paths, split)}


def _open_binary(path: Path | str) -> BinaryIO:
    """The file's bytes through Beam's filesystems, gunzipped when it starts with gzip's magic."""
    from preprocessing import storage

    fh = storage.open_read(str(path))
    if fh.read(2) == b"\x1f\x8b":
        fh.seek(0)
        return _GzipClosingSource(fileobj=fh, mode="rb")  # type: ignore[return-value]
    fh.seek(0)
    return fh


def text_size(path: Path | str) -> int:
    """The bytes of text the reader gets from a file: a gzip file's inflated bytes, counted (its
    trailer holds only its last member's size, modulo 4 GiB: a multi-member file, bgzip's or `cat
    a.gz b.gz`, or a cut-off one misstated it), up to any damage; else the file's size."""
    from preprocessing import storage

    with _open_binary(path) as fh:
        if not isinstance(fh, gzip.GzipFile):
            return storage.size(str(path))
        total = 0
        try:
            while chunk := fh.read1(READ_BLOCK_BYTES):  # read1: the bytes before damage count
                total += len(chunk)
        except (EOFError, OSError, zlib.error):
            pass  # the reader keeps the text before the damage, and says so
        return total


class _GzipClosingSource(gzip.GzipFile):
    """GzipFile that also closes the stream it reads from."""

    def close(self) -> None:
        source = self.fileobj
        try:
            super().close()
        finally:
            if source is not None:
                source.close()


def _raw_lines(fh: BinaryIO, on_long_line: Callable[[], None]) -> Iterator[bytes]:
    """The lines of a binary stream without their ends. A line ends at LF, CRLF or a lone CR (old
    Mac files, some exports), so no line-ending convention turns a file into one line. A line over
    MAX_LINE_BYTES is skipped (`on_long_line` is called once for it)."""
    pending = b""  # the unfinished last line (a trailing CR may be half of a CRLF: kept with it)
    skipping = False  # inside a line over MAX_LINE_BYTES: drop bytes up to its end
    while block := fh.readline(READ_BLOCK_BYTES):  # by line: a damaged gzip loses only the last one
        if not pending and not skipping and block.endswith(b"\n") and b"\r" not in block[:-2]:
            line = block[:-2] if block.endswith(b"\r\n") else block[:-1]  # the common case, fast
            if len(line) <= MAX_LINE_BYTES:
                yield line
            else:
                on_long_line()
            continue
        data = pending + block
        held = b"\r" if data.endswith(b"\r") else b""
        parts = _LINE_END.split(data[: len(data) - len(held)])
        tail = parts.pop()
        for part in parts:
            if skipping:  # the end of the long line
                skipping = False
            elif len(part) > MAX_LINE_BYTES:
                on_long_line()
            else:
                yield part
        if not skipping and len(tail) > MAX_LINE_BYTES:
            on_long_line()
            skipping = True
        pending = held if skipping else tail + held
    if pending and not skipping:
        yield pending[:-1] if pending.endswith(b"\r") else pending


def wide_encoding(head: bytes) -> str | None:
    """UTF-16 or UTF-32 (iconv's name) when a file's first bytes are such text: a byte-order mark,
    or, without one, NUL bytes at every other position around printable text (UTF-16LE/BE of
    mostly ASCII text). None for UTF-8 and for binary data."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            return name
    even = head[: len(head) // 2 * 2]
    if len(even) < 8:
        return None
    for name, zeros in (("UTF-16LE", even[1::2]), ("UTF-16BE", even[0::2])):
        if zeros.count(0) >= 0.9 * len(zeros):
            text = even.decode(name.lower(), errors="replace")
            if sum(c.isprintable() or c in "\t\n\r" for c in text) >= 0.95 * len(text):
                return name
    return None


def head_kind(head: bytes) -> str | None:
    """Why the reader skips a file unread, by its first bytes: its encoding ("UTF-16", ...: see
    `wide_encoding`) or "binary" (NUL bytes, or an archive); None for text it reads."""
    return wide_encoding(head) or ("binary" if b"\x00" in head or archive_kind(head) else None)


def archive_kind(head: bytes) -> str | None:
    """'bzip2', 'xz', 'zstd', 'zip', 'parquet' or 'tar' (gzipped or not: `head` is what the reader
    gets) by a file's first bytes; None for anything else."""
    for kind, (magic, _, _) in COMPRESSED.items():
        if head.startswith(magic):
            return kind
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if head.startswith(b"PAR1"):
        return "parquet"
    return "tar" if head[257:262] == b"ustar" else None


def _head(fh: BinaryIO) -> bytes:
    """The first SNIFF_BYTES of a stream opened by `_open_binary`, left unread."""
    return fh.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(fh, "peek") else b""


def file_head(path: Path | str) -> bytes:
    """The first SNIFF_BYTES the reader gets of a file (decompressed, for a .gz)."""
    with _open_binary(path) as fh:
        return _head(fh)


def _warner(quiet: bool) -> Callable[..., None]:
    """log.warning, or nothing for a quiet read (a second pass over a file already warned about)."""
    return (lambda *a: None) if quiet else log.warning


def _lines(path: Path | str, counts: Counter, quiet: bool = False) -> Iterator[str]:
    """Decoded lines (without newline) of one file; handles binary, long lines, bad bytes."""
    warn = _warner(quiet)
    try:
        fh = _open_binary(path)
    except OSError as exc:
        raise UserError(f"cannot read corpus file {path}: {exc}") from None
    with fh:
        try:
            kind = head_kind(head := _head(fh))
            if kind == "binary":
                counts["files_skipped_binary"] += 1
                counts[f"{BINARY_KEY}{path}"] = 1
                if archive := archive_kind(head):
                    counts[f"{ARCHIVE_KEY}{archive}:{path}"] = 1
                warn("skipping %s: binary file (NUL bytes)", path)
                return
            if kind is not None:  # another encoding: UTF-16, UTF-32
                counts["files_skipped_not_utf8"] += 1
                counts[f"{NOT_UTF8_KEY}{kind}:{path}"] = 1
                warn(
                    "skipping %s: %s text, not UTF-8 (convert it with iconv -f %s -t UTF-8)", path, kind, kind
                )
                return
            any_content = False
            lines = replaced = 0  # non-blank lines, and those with invalid UTF-8
            long_lines: list[int] = []

            def long_line() -> None:
                counts["lines_skipped_over_1mb"] += 1
                counts[f"{LONG_LINES_KEY}{path}"] += 1
                long_lines.append(1)
                warn("%s: skipped a line longer than 1 MB", path)

            for n, raw in enumerate(_raw_lines(fh, long_line)):
                if n == 0 and raw.startswith(UTF8_BOM):
                    raw = raw[len(UTF8_BOM) :]
                if b"\x00" in raw:
                    counts["lines_skipped_binary"] += 1
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    line = raw.decode("utf-8", errors="replace")
                    counts["lines_with_invalid_utf8_replaced"] += 1
                    replaced += 1
                text = bool(line.strip())
                lines += text
                any_content = any_content or text
                yield line
            if replaced:  # per file: corpus_file_warnings says which files hold another encoding
                counts[f"{REPLACED_KEY}{path}"] += replaced
                counts[f"{TEXT_LINES_KEY}{path}"] += lines
        except (EOFError, OSError, zlib.error) as exc:
            counts["files_truncated_or_corrupt"] += 1
            counts[DAMAGED_KEY + json.dumps([str(path), str(exc)])] = 1
            warn("%s: stopped reading, file is damaged (%s); documents before the damage are kept", path, exc)
            return
    if not any_content and long_lines:  # not empty: a document written on one line of megabytes
        counts[f"{LONG_ONLY_KEY}{path}"] = len(long_lines)
        warn("%s: every line of text is longer than 1 MB and was skipped", path)
    elif not any_content:
        counts["files_empty"] += 1
        counts[f"{EMPTY_KEY}{path}"] = 1
        warn("%s: empty file", path)


def detect_format(path: Path | str) -> str:
    """'jsonl' by suffix, else 'wiki' when one of the first 100 non-blank lines is a `<doc ...>` tag,
    else 'jsonl' when each of them is a JSON object (`part-00000`, a `.txt` export), else 'plain'."""
    name = str(path).rsplit("/", 1)[-1]
    name = name[:-3] if name.endswith(".gz") else name
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    seen, objects = 0, True
    for line in _lines(path, Counter(), quiet=True):
        if line.strip():
            if _DOC_OPEN.match(line.strip()):
                return "wiki"
            objects = objects and _is_json_object(line)
            seen += 1
            if seen >= 100:
                break
    return "jsonl" if seen and objects else "plain"


def _is_json_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def read_documents(
    path: Path | str, counts: Counter, label: str | None = None, fmt: str | None = None, quiet: bool = False
) -> Iterator[Document]:
    """Documents of one corpus file, in file order; `quiet`: count skips without logging them."""
    label = label or str(path).rsplit("/", 1)[-1]
    fmt = fmt or detect_format(path)
    reader = {"wiki": _read_wiki, "plain": _read_plain, "jsonl": _read_jsonl}[fmt]
    if fmt == "plain" and re.search(r"\.(csv|tsv)(\.gz)?$", str(path)):
        counts[f"{TABLE_KEY}{path}"] = 1  # read as it is: corpus_file_warnings says how to convert it
    ordinal = 0
    for paragraphs in reader(path, counts, quiet=quiet):
        paragraphs = [p.strip() for p in paragraphs if p.strip()]
        if not paragraphs:
            counts["documents_skipped_empty"] += 1
            continue
        counts["documents_read"] += 1
        yield Document(f"{label}:{ordinal}", paragraphs)
        ordinal += 1


def _read_plain(path: Path | str, counts: Counter, quiet: bool = False) -> Iterator[list[str]]:
    """Documents end at a blank line; one over MAX_DOC_CHARS is yielded in parts of that size (a
    file of one document per line, without blank lines, was otherwise one document)."""
    doc: list[str] = []
    size = 0
    for line in _lines(path, counts, quiet):
        if line.strip():
            doc.append(line)
            size += len(line)
            if size < MAX_DOC_CHARS:
                continue
            counts[f"{CUT_KEY}{path}"] += 1
        elif not doc:
            continue
        yield doc
        doc, size = [], 0
    if doc:
        yield doc


def _read_wiki(path: Path | str, counts: Counter, quiet: bool = False) -> Iterator[list[str]]:
    warn = _warner(quiet)
    doc: list[str] | None = None
    title: str | None = None
    for line in _lines(path, counts, quiet):
        stripped = line.strip()
        if _DOC_OPEN.match(stripped):
            if doc is not None:
                counts["docs_unclosed_tag"] += 1
                counts[f"{UNCLOSED_KEY}{path}"] += 1
                warn("%s: <doc> without </doc>; its text is kept as a document", path)
                yield doc
            doc = []
            m = _TITLE.search(stripped)
            title = m.group(1) if m else None
            continue
        if stripped == "</doc>":
            if doc is None:
                counts["lines_outside_doc"] += 1
                continue
            yield doc
            doc, title = None, None
            continue
        if doc is None:
            if stripped:
                counts["lines_outside_doc"] += 1
            continue
        if not doc and title is not None and stripped == title.strip():
            continue  # WikiExtractor repeats the title as the first line
        doc.append(line)
    if doc is not None:
        counts["docs_unclosed_tag"] += 1
        counts[f"{UNCLOSED_KEY}{path}"] += 1
        warn("%s: file ends inside a <doc>; its text is kept as a document", path)
        yield doc


def _read_jsonl(
    path: Path | str, counts: Counter, field: str = "text", quiet: bool = False
) -> Iterator[list[str]]:
    first = True
    for line in _lines(path, counts, quiet):
        if not line.strip():
            continue
        if first and line.lstrip().startswith("["):  # one JSON array: skipped whole, as said of it
            counts[f"{ARRAY_KEY}{path}"] = 1  # (corpus_file_warnings, unread_files)
            return
        first = False
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            counts["jsonl_lines_skipped_invalid_json"] += 1
            counts[f"{BAD_JSON_KEY}{path}"] += 1
            continue
        text = obj.get(field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            counts["jsonl_lines_skipped_no_text_field"] += 1
            counts[f"{NO_TEXT_KEY}{path}"] += 1
            if counts[f"{NO_TEXT_KEY}{path}"] == 1:
                counts[NO_TEXT_FIRST_KEY + json.dumps([str(path), _no_text_line(obj, field)])] = 1
            continue
        yield text.split("\n")


def _no_text_line(obj: object, field: str) -> str:
    """What a JSONL line without a string `field` holds, for the warning that names its file."""
    if not isinstance(obj, dict):
        return f"is a JSON {_json_type(obj)}, not an object"
    if field in obj:
        return f'has "{field}" as a JSON {_json_type(obj[field])}, not a string'
    keys = ", ".join(f'"{k}"' for k in list(obj)[:5])
    return f"has the fields {keys}" if keys else "is an empty object"


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def iter_texts(paths: list[Path], counts: Counter, quiet: bool = False) -> Iterator[str]:
    """Every paragraph of every document, streamed (what the tokenizer trains on); `quiet`: skips
    are counted but not logged (a second pass over the same files)."""
    labels = file_labels(paths)
    for path in paths:
        for doc in read_documents(path, counts, labels[path], quiet=quiet):
            yield from doc.paragraphs
