"""Corpus readers on real files, sentence splitting, and every bad-input case (counted, never lost)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import shutil
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from common.errors import UserError
from preprocessing.corpus import (
    detect_format,
    expand_inputs,
    file_labels,
    read_documents,
)
from preprocessing.corpus_trouble import corpus_file_warnings
from preprocessing.sentences import split_sentences


def test_wikiextractor_gz_file(data_dir):
    path = data_dir / "wiki/enwiki-2015/AA/wiki_00.gz"
    raw = gzip.open(path, "rt", encoding="utf-8").read()
    counts: Counter = Counter()
    docs = list(read_documents(path, counts))
    assert detect_format(path) == "wiki"
    assert len(docs) == raw.count("<doc ") == raw.count("</doc>") > 10
    assert counts["documents_read"] == len(docs) and not counts["docs_unclosed_tag"]
    titles = [line.split('title="')[1].split('"')[0] for line in raw.splitlines() if line.startswith("<doc ")]
    for doc, title in zip(docs, titles):
        assert doc.paragraphs[0] != title  # the repeated title line is dropped
        assert all("<doc" not in p and "</doc>" not in p for p in doc.paragraphs)
    assert docs[0].doc_id == "wiki_00.gz:0" and docs[1].doc_id == "wiki_00.gz:1"
    # paragraph order preserved: the first paragraph of the first article opens it in the file
    assert raw.index(docs[0].paragraphs[0]) < raw.index(docs[0].paragraphs[-1])


def test_plain_text_summaries(data_dir):
    counts: Counter = Counter()
    docs = list(read_documents(data_dir / "wiki/summaries_en.txt", counts))
    assert len(docs) == counts["documents_read"] == 10033  # README: 10,033 lead sections


def test_jsonl(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [
        {"text": "First doc. Two sentences."},
        {"id": 3},
        "not an object",
        {"text": "Line one.\nLine two."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken json\n")
    counts: Counter = Counter()
    docs = list(read_documents(path, counts))
    assert [d.paragraphs for d in docs] == [["First doc. Two sentences."], ["Line one.", "Line two."]]
    assert counts["jsonl_lines_skipped_no_text_field"] == 2
    assert counts["jsonl_lines_skipped_invalid_json"] == 1
    # lines that are not JSON (a Python dict's single quotes) or hold no string "text" (another field
    # name) are said, naming the file: they were a count in stats.json only, and half a corpus could
    # go that way unseen
    assert corpus_file_warnings(counts) == [
        f"{path}: 1 line is not valid JSON, skipped (each line of a JSONL file must be one JSON "
        'object, double-quoted: {"text": "..."}).',
        f'{path}: 2 lines have no string "text" field, skipped (the first has the fields "id"); each '
        'line of a JSONL file must be one JSON object with its document in "text": {"text": "..."}.',
    ]


def test_a_json_array_file_is_named_as_such_with_the_jq_fix(tmp_path):
    """A `.json` corpus that is one JSON array (pandas' to_json(orient='records'), many dataset
    downloads) was '1502 lines are not valid JSON' (pretty-printed) or '1 line has no string "text"
    field (the first is a JSON array, not an object)' (compact): true, but not what to do. Now the
    file is named as a JSON array with the jq command that writes it as JSON lines."""
    rows = [{"text": f"Document {i}. It has two sentences."} for i in range(20)]
    one_per_line = "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"  # its last line is JSON
    for name, text in (
        ("pretty.json", json.dumps(rows, indent=2) + "\n"),
        ("compact.json", json.dumps(rows) + "\n"),
        ("lines.json", one_per_line),  # read its last object as a document, and said it was skipped
    ):
        path = tmp_path / name
        path.write_text(text)
        counts: Counter = Counter()
        assert list(read_documents(path, counts)) == []
        assert corpus_file_warnings(counts) == [
            f"{path} holds one JSON array, not JSON lines (one object per line), and was skipped: convert "
            f"it with `jq -c '.[]' {path} > {tmp_path / name.replace('.json', '.jsonl')}` and use that file "
            "in place of this one (move this one out of a corpus folder or glob, which would read both)."
        ]
    # JSON lines with an array on a later line: not one JSON array, that line is said as what it is
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps([rows[1]]) + "\n")
    counts = Counter()
    assert len(list(read_documents(path, counts))) == 1
    [said] = corpus_file_warnings(counts)
    assert said.startswith(
        f'{path}: 1 line has no string "text" field, skipped (the first is a JSON array'
    ), said


def test_a_csv_corpus_is_read_as_text_and_said_with_the_conversion(tmp_path):
    """A .csv or .tsv corpus (a text column beside ids and labels) was read as plain text, unsaid:
    every row a line of one document, its ids, delimiters and quotes trained on. It is still read
    (its rows are text), but named, with the python line that writes its text column as JSON lines;
    the python line, run as printed, writes the rows' text."""
    for name, sep in (("reviews.csv", ","), ("reviews.tsv.gz", "\t")):
        path = tmp_path / name
        long = "A long review. " * 10000  # over the csv module's default field limit (128 KiB)
        rows = (
            f'id{sep}text{sep}label\n1{sep}"Good film, really. I liked it."{sep}pos\n2{sep}{long}{sep}neg\n'
        )
        path.write_bytes(gzip.compress(rows.encode()) if name.endswith(".gz") else rows.encode())
        counts: Counter = Counter()
        assert len(list(read_documents(path, counts))) == 1
        [said] = corpus_file_warnings(counts)
        assert said.startswith(f"{path} is read as plain text, each row a line, its other columns"), said
        assert f"out = open('{tmp_path / 'reviews.jsonl'}', 'w')" in said  # beside it, its suffixes off
        command = said.split('`python -c "')[1].split('"`')[0]  # a shell keeps its backslashes as they are
        exec(command, {})
        written = (tmp_path / "reviews.jsonl").read_text()
        assert [json.loads(line) for line in written.splitlines()] == [
            {"text": "Good film, really. I liked it."},
            {"text": long},
        ]
        (tmp_path / "reviews.jsonl").unlink()
    path = tmp_path / "rows.csv"  # JSON lines named .csv: read as JSONL, by column, so not said
    path.write_text(json.dumps({"text": "A row. Its text."}) + "\n")
    counts = Counter()
    assert len(list(read_documents(path, counts))) == 1 and corpus_file_warnings(counts) == []


def test_jsonl_without_its_suffix_is_read_as_jsonl(tmp_path):
    """Spark's and Hadoop's `part-00000`, or a `.txt` export, of JSON lines: read as plain text, the
    whole file was one document whose paragraphs were the JSON lines, braces, keys and escapes
    included ('" text " : " brian eno is ...' in the shards), and nothing said so."""
    rows = [{"id": 1, "text": "First doc. Two sentences."}, {"id": 2, "text": "Second.\nIts line two."}]
    for name in ("part-00000", "export.txt"):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert detect_format(path) == "jsonl"
        docs = list(read_documents(path, Counter()))
        assert [d.paragraphs for d in docs] == [["First doc. Two sentences."], ["Second.", "Its line two."]]
    prose = tmp_path / "notes.txt"  # one JSON line among prose: plain text, as written
    prose.write_text('A sentence. Another.\n{"text": "a quoted example"}\n')
    assert detect_format(prose) == "plain"
    braces = tmp_path / "templates.txt"  # lines that open a brace but are no JSON: plain text
    braces.write_text("{greeting}, said the template. It was filled in.\n{name} answered.\n")
    assert detect_format(braces) == "plain"


def test_jsonl_without_text_field_says_what_the_lines_hold(tmp_path):
    """A corpus whose JSONL names its field "content" is refused with the field the lines have; a
    non-string "text" and a line that is not an object are named as such."""
    for rows, first in [
        ([{"content": "A doc.", "id": 1}] * 3, 'has the fields "content", "id"'),
        ([{"text": ["A doc."]}, {"text": "Kept."}], 'has "text" as a JSON array, not a string'),
        (["A doc.", {"text": "Kept."}], "is a JSON string, not an object"),
        ([{"text": "Kept."}, [1, 2]], "is a JSON array, not an object"),
        ([{"text": True}], 'has "text" as a JSON boolean, not a string'),
        ([{"text": None}], 'has "text" as a JSON null, not a string'),
        ([{}], "is an empty object"),
        ([dict.fromkeys("abcdef", 1)], 'has the fields "a", "b", "c", "d", "e"'),  # five of them
    ]:
        path = tmp_path / "c.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        counts: Counter = Counter()
        list(read_documents(path, counts))
        [warning] = corpus_file_warnings(counts)
        assert f"skipped (the first {first});" in warning and warning.startswith(str(path))


def test_split_sentences_on_real_text(data_dir):
    text = (data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8").split("\n\n")[0]
    sentences = split_sentences(text)
    assert len(sentences) >= 2
    assert "".join(sentences).replace(" ", "") == text.replace(" ", "")  # nothing lost
    assert split_sentences("Dr. Smith paid $3.50 in the U.S. yesterday. Then he left.") == [
        "Dr. Smith paid $3.50 in the U.S. yesterday.",
        "Then he left.",
    ]
    assert split_sentences("   ") == []


def test_segmenting_with_a_kept_buffer_equals_blingfires_wrapper(data_dir):
    """The direct call with a buffer kept between calls gives blingfire.text_to_sentences' output,
    also right after a longer paragraph left bytes in the buffer."""
    import blingfire

    from preprocessing.sentences import _segment

    paragraphs = []
    for name in ("AA/wiki_00.gz", "AB/wiki_09.gz", "AC/wiki_77.gz"):
        for doc in read_documents(data_dir / "wiki/enwiki-2015" / name, Counter(), name):
            paragraphs.extend(doc.paragraphs)
    long = " ".join(paragraphs[:400])
    cases = ["", " ", "x", "a\x00b. C d.", "Zoë’s café – ok. 中文。Next one.", long, "Short. After long."]
    assert len(paragraphs) > 2000 and len(long) > 100_000
    for text in cases + paragraphs:
        assert _segment(text) == blingfire.text_to_sentences(text), text[:80]


def test_bad_inputs_are_counted_not_lost(tmp_path):
    (tmp_path / "nonutf8.txt").write_bytes(b"caf\xe9 ol\xe9. Second sentence.\n\nOther doc here. Yes.\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 64)
    long_line = b"x" * (1 << 20) + b" tail\n"
    (tmp_path / "long.txt").write_bytes(b"Before it. Yes.\n" + long_line + b"After it. Fine.\n")
    (tmp_path / "unclosed.txt").write_text(
        '<doc id="1" url="u" title="T">\nT\nBody one. More.\n<doc id="2" url="u" title="U">\nU\nBody two. Ok.\n'
    )
    (tmp_path / "outside.txt").write_text(
        'stray line\n<doc id="1" url="u" title="T">\nT\nBody. Ok.\n</doc>\n'
    )

    def read(name):
        counts: Counter = Counter()
        return list(read_documents(tmp_path / name, counts)), counts

    docs, counts = read("nonutf8.txt")
    assert docs[0].paragraphs == ["caf\ufffd ol\ufffd. Second sentence."] and len(docs) == 2
    assert counts["lines_with_invalid_utf8_replaced"] == 1
    docs, counts = read("empty.txt")
    assert docs == [] and counts["files_empty"] == 1
    docs, counts = read("binary.bin")
    assert docs == [] and counts["files_skipped_binary"] == 1
    docs, counts = read("long.txt")
    assert (
        docs[0].paragraphs == ["Before it. Yes.", "After it. Fine."] and counts["lines_skipped_over_1mb"] == 1
    )
    docs, counts = read("unclosed.txt")
    assert [d.paragraphs for d in docs] == [["Body one. More."], ["Body two. Ok."]]
    assert counts["docs_unclosed_tag"] == 2  # one closed by the next <doc>, one by end of file
    docs, counts = read("outside.txt")
    assert [d.paragraphs for d in docs] == [["Body. Ok."]] and counts["lines_outside_doc"] == 1


def test_truncated_gzip_keeps_what_was_read(tmp_path, data_dir):
    data = (data_dir / "wiki/enwiki-2015/AA/wiki_00.gz").read_bytes()
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) // 2])
    counts: Counter = Counter()
    docs = list(read_documents(path, counts))
    assert counts["files_truncated_or_corrupt"] == 1
    whole = list(read_documents(data_dir / "wiki/enwiki-2015/AA/wiki_00.gz", Counter()))
    kept = len(docs) - 1  # every document before the cut, as it is in the whole file
    assert kept >= len(whole) // 3
    assert [d.paragraphs for d in docs[:kept]] == [d.paragraphs for d in whole[:kept]]
    assert whole[kept].text.startswith(docs[kept].text)  # and the one the cut ends inside, up to it


def test_globs_and_labels(data_dir):
    files = expand_inputs(["data:wiki/enwiki-2015/A[AB]/wiki_0[01].gz"], str(data_dir))
    assert [f.name for f in files] == ["wiki_00.gz", "wiki_01.gz"] * 2
    labels = file_labels(files)
    assert labels[files[0]] == "AA/wiki_00.gz" and len(set(labels.values())) == 4
    with pytest.raises(UserError, match="matches no file"):
        expand_inputs(["data:wiki/nothing-*.gz"], str(data_dir))
    with pytest.raises(UserError, match="no corpus input"):
        expand_inputs([])
    # one file is labelled by its name alone: its documents' ids (hence the split and buckets) do
    # not depend on where the file lives
    assert file_labels([files[0]]) == {files[0]: "wiki_00.gz"}


def test_missing_file_path_is_user_error(tmp_path: Path):
    with pytest.raises(UserError, match=r"'.*missing\.txt' matches no file"):
        expand_inputs([str(tmp_path / "missing.txt")])
    (tmp_path / "present.txt").write_text("Some text.\n")  # one file found does not excuse the other
    with pytest.raises(UserError, match=r"'.*missing\.txt' matches no file"):
        expand_inputs([str(tmp_path / "present.txt"), str(tmp_path / "missing.txt")])


def test_a_directory_input_is_every_file_below_it(tmp_path: Path, data_dir: Path):
    """A folder passes `verify` and the stage key, so the tokenizer and preprocess stages must read
    it too (they used to glob it, match nothing and fail after verify had passed)."""
    from pipelines.config import load_config
    from pipelines.stage_keys import stage_key_inputs
    from pipelines.stage_tokenizer import run_tokenizer_stage
    from pipelines.verify_data import check_data_paths

    lines = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8").split("\n")
    corpus = tmp_path / "corpus"
    (corpus / "part2").mkdir(parents=True)
    (corpus / "a.txt").write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    (corpus / "part2" / "b.txt").write_text("\n".join(lines[40:80]) + "\n", encoding="utf-8")
    (corpus / ".hidden.txt").write_text("editor backup\n")
    (corpus / ".git").mkdir()  # a hidden folder: none of its files is read either
    (corpus / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    expected = [corpus / "a.txt", corpus / "part2" / "b.txt"]
    assert expand_inputs([str(corpus)]) == expected
    # hidden files are those hidden inside the folder: a corpus kept under ~/.data is read
    dotted = tmp_path / ".data" / "corpus"
    shutil.copytree(corpus, dotted)
    assert expand_inputs([str(dotted)]) == [dotted / "a.txt", dotted / "part2" / "b.txt"]

    cfg = load_config(
        None, [f"tokenizer.input=[{corpus}]", f"preprocess.input=[{corpus}]", "finetune.tasks=[]"]
    )
    assert check_data_paths(cfg) == expected * 2
    assert [s["path"] for s in stage_key_inputs(cfg)["tokenizer"]["inputs"]] == ["a.txt", "part2/b.txt"]
    out = run_tokenizer_stage(cfg.tokenizer.model_copy(update={"vocab_size": 500}), tmp_path / "tok")
    assert (out / "vocab.txt").is_file()


def test_every_line_ending_convention_gives_the_same_documents(tmp_path: Path):
    """Issue 14 item 3: a file with CR-only line endings was read as one document (IsNext ratio
    1.0, no validation examples). LF, CRLF and a lone CR all end a line; a long line is still
    skipped and counted."""
    from preprocessing.corpus import MAX_LINE_BYTES

    text = "\ufeffAlpha one.\nAlpha two.\n\nBeta one.\n\nGamma one.\n"
    docs = {}
    for name, end in {"lf": "\n", "crlf": "\r\n", "cr": "\r"}.items():
        path = tmp_path / f"{name}.txt"
        path.write_bytes(text.replace("\n", end).encode("utf-8"))
        docs[name] = [d.paragraphs for d in read_documents(path, Counter())]
    assert docs["lf"] == [["Alpha one.", "Alpha two."], ["Beta one."], ["Gamma one."]]
    assert docs["crlf"] == docs["cr"] == docs["lf"]
    path = tmp_path / "long_cr.txt"
    path.write_bytes(b"First.\r\r" + b"x" * (MAX_LINE_BYTES + 10) + b"\r\rLast.\r")
    counts: Counter = Counter()
    assert [d.paragraphs for d in read_documents(path, counts)] == [["First."], ["Last."]]
    assert counts["lines_skipped_over_1mb"] == 1


def test_every_skip_of_a_file_is_named_in_its_warnings(tmp_path):
    """The preprocess workers' own warnings reached the console twice (a raw `WARNING:preprocessing.
    corpus:` line and Beam's relay of it as a protobuf dump) and never stats.json or the report: an
    empty file, a damaged .gz (the rest of the file lost), a line over 1 MB among text and an
    unclosed <doc> were counts only. The per-file warnings, said once by the stage, name them."""
    from preprocessing.corpus import MAX_LINE_BYTES

    (tmp_path / "empty.txt").write_text(" \n\n")
    whole = gzip.compress(b"First doc. Two sentences.\n\n" * 50000)
    (tmp_path / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    long = b"x" * (MAX_LINE_BYTES + 1) + b"\n"
    (tmp_path / "long.txt").write_bytes(b"A line. Another.\n" + long + b"Last.\n" + long)
    (tmp_path / "one_line.txt").write_bytes(long + b"\n" + long)  # all its text on lines over 1 MB
    (tmp_path / "wiki.txt").write_text(
        '<doc id="1" title="T">\nT\nText. More.\n<doc id="2" title="U">\nU\nEnd.\n'
    )
    counts: Counter = Counter()
    for name in ("empty.txt", "cut.txt.gz", "long.txt", "one_line.txt", "wiki.txt"):
        list(read_documents(tmp_path / name, counts, quiet=True))
    said = corpus_file_warnings(counts)
    assert len(said) == 5, said
    assert said[0].startswith(f"{tmp_path / 'cut.txt.gz'}: damaged (Compressed file ended"), said[0]
    assert "the documents before the damage were kept, the rest of the file is lost" in said[0]
    assert said[1] == f"{tmp_path / 'empty.txt'}: empty file (no text), skipped."
    assert said[2].startswith(f"{tmp_path / 'long.txt'}: 2 lines longer than 1 MB skipped"), said[2]
    assert said[3].startswith(f"{tmp_path / 'one_line.txt'}: all its text is in 2 lines longer than 1 MB")
    assert said[4].startswith(f"{tmp_path / 'wiki.txt'}: 2 <doc> tags without </doc>"), said[4]


def test_a_plain_document_of_megabytes_is_read_in_parts_and_said(tmp_path):
    """A file with one document per line and no blank line (CC-100's, OSCAR's, many exports') was one
    document: its examples had no NotNext pair ('IsNext share 1.000'), the validation split no
    document, and nothing named the cause. Now a plain document is cut into parts of about 1 MB, each
    a document, all text kept, and the file is named with the blank-line rule."""
    from preprocessing.corpus import MAX_DOC_CHARS

    lines = [f"Document {i} has a sentence. And it has a second one." for i in range(60000)]
    path = tmp_path / "one_per_line.txt"
    path.write_text("\n".join(lines) + "\n\nA last document. It is short.\n")
    counts: Counter = Counter()
    docs = list(read_documents(path, counts, quiet=True))
    assert 3 <= len(docs) - 1 <= 4 and docs[-1].paragraphs == ["A last document. It is short."]
    assert [p for d in docs[:-1] for p in d.paragraphs] == lines  # every line, in order
    assert all(sum(map(len, d.paragraphs)) < MAX_DOC_CHARS + 100 for d in docs)  # one line over at most
    [said] = corpus_file_warnings(counts)
    assert said.startswith(f"{path}: 3 cuts in text without a blank line: a plain-text document ends"), said
    assert "put a blank line after each (`sed G`) or write JSONL" in said


def test_a_folder_input_reads_its_symlinked_folders_as_a_glob_does(tmp_path: Path):
    """A corpus folder whose parts are symlinks to folders elsewhere (a cluster's /mnt/...) read the
    linked files but not the linked folders (Path.rglob does not follow them), unsaid, while the glob
    `corpus/**/*.txt` read them all. Now a folder is read as the glob reads it; a link back up (a
    cycle) is read once."""
    elsewhere = tmp_path / "mnt" / "part2"
    elsewhere.mkdir(parents=True)
    (elsewhere / "b.txt").write_text("Two. Sentences.\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("One. Sentence.\n")
    (corpus / "part2").symlink_to(elsewhere, target_is_directory=True)
    (corpus / "loop").symlink_to(corpus, target_is_directory=True)
    expected = [corpus / "a.txt", elsewhere / "b.txt"]
    assert expand_inputs([str(corpus)]) == expected
    assert expand_inputs([f"{corpus}/*.txt", f"{corpus}/part2/*.txt"]) == expected


def test_an_existing_file_whose_name_looks_like_a_glob_is_that_file(tmp_path: Path):
    """Issue 14 item 13: `wiki[1].txt` 'matched no file' (read as a glob for wiki1.txt)."""
    from preprocessing import storage

    path = tmp_path / "wiki[1].txt"
    path.write_text("Hello there.\n")
    assert expand_inputs([str(path)]) == [path]
    assert storage.size(str(path)) == path.stat().st_size


def test_another_encoding_is_named_with_the_iconv_fix(tmp_path):
    """A UTF-16 file was 'binary file (NUL bytes)'; a Latin-1 file's replaced lines were only a
    count. Now each is a warning naming the file, its encoding and the iconv command; a stray bad
    byte in a UTF-8 file (under 1% of its lines) is what it was; a binary file (a .bz2 corpus) is
    named too (it was only a log line)."""
    text = "Café au lait is a drink. It has milk.\n\nAnother document here. It ends.\n\n" * 20
    (tmp_path / "bom16.txt").write_bytes(text.encode("utf-16"))
    (tmp_path / "le16.txt").write_bytes(text.encode("utf-16-le"))  # no byte-order mark
    # nor with a few characters past Latin-1 (their high byte is not 0)
    (tmp_path / "dash16.txt").write_bytes(text.replace(" is ", " \u2014 ").encode("utf-16-le"))
    (tmp_path / "latin1.txt").write_bytes(text.encode("latin-1"))
    good = "A fine line. It is UTF-8.\n" * 300
    (tmp_path / "stray.txt").write_bytes(good.encode() + b"One caf\xe9 here. Then more.\n")
    (tmp_path / "nuls.bin").write_bytes(b"\x00\x01" * 5000)

    def read(name):
        counts: Counter = Counter()
        return list(read_documents(tmp_path / name, counts)), counts

    for name, encoding in (("bom16.txt", "UTF-16"), ("le16.txt", "UTF-16LE"), ("dash16.txt", "UTF-16LE")):
        docs, counts = read(name)
        path = tmp_path / name
        assert docs == [] and counts["files_skipped_not_utf8"] == 1 and not counts["files_skipped_binary"]
        assert corpus_file_warnings(counts) == [
            f"{path} is {encoding} text, not UTF-8, and was skipped: convert it with "
            f"`iconv -f {encoding} -t UTF-8 {path} > {tmp_path / name.replace('.txt', '.utf8.txt')}` and use that "
            "file in place of this one (move this one out of a corpus folder or glob, which would read both)."
        ]
    docs, counts = read("latin1.txt")
    assert len(docs) == 40 and counts["lines_with_invalid_utf8_replaced"] == 20
    [warning] = corpus_file_warnings(counts)
    assert warning.startswith(f"{tmp_path / 'latin1.txt'}: 20 of 40 lines (50%) are not valid UTF-8")
    assert f"iconv -f latin1 -t utf-8 {tmp_path / 'latin1.txt'}" in warning
    # the converted copy lands beside the original: a folder or glob entry would read both
    assert warning.endswith(
        "in place of this one (move this one out of a corpus folder or glob, which would read both)."
    )
    docs, counts = read("stray.txt")
    assert counts["lines_with_invalid_utf8_replaced"] == 1 and corpus_file_warnings(counts) == []
    (tmp_path / "few.txt").write_bytes(good.encode()[:1040] + b"caf\xe9 one.\nna\xefve two.\n")  # 2 of 42
    [warning] = corpus_file_warnings(read("few.txt")[1])
    assert warning.startswith(f"{tmp_path / 'few.txt'}: 2 of 42 lines (5%) are not valid UTF-8"), warning
    docs, counts = read("nuls.bin")
    assert docs == [] and counts["files_skipped_binary"] == 1
    assert corpus_file_warnings(counts) == [
        f"{tmp_path / 'nuls.bin'} is a binary file (NUL bytes), not text, and was skipped: the corpus is "
        "read as plain text, gzipped or not (a .bz2, .xz or .zip file must be decompressed first)."
    ]
    # a compression or archive the reader does not open is named, with the command that opens it
    # (a .tar.gz of text files, the usual download, was 'a binary file (NUL bytes)' with no word of tar)
    (tmp_path / "wiki.txt.bz2").write_bytes(bz2.compress(text.encode()))
    (tmp_path / "wiki.txt.xz").write_bytes(lzma.compress(text.encode()))
    with zipfile.ZipFile(tmp_path / "corpus.zip", "w") as archive:
        archive.writestr("a.txt", text)
    with tarfile.open(tmp_path / "corpus.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "stray.txt", "stray.txt")
    shutil.copy(tmp_path / "corpus.tar.gz", tmp_path / "more.tgz")
    shutil.copy(tmp_path / "corpus.zip", tmp_path / "backup.dat")  # a zip by its bytes, not its name
    (tmp_path / "wiki.txt.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(32))  # zstd's magic, a frame
    use = "use that file in place of this one (move this one out of a corpus folder or glob, which would read both)."
    expected = {
        "wiki.txt.bz2": f"a bzip2-compressed file, not text, and was skipped: decompress it with `bunzip2 -k "
        f"{tmp_path / 'wiki.txt.bz2'}` (it writes {tmp_path / 'wiki.txt'}) and {use}",
        "wiki.txt.xz": f"an xz-compressed file, not text, and was skipped: decompress it with `unxz -k "
        f"{tmp_path / 'wiki.txt.xz'}` (it writes {tmp_path / 'wiki.txt'}) and {use}",
        "corpus.zip": f"a zip archive, not text, and was skipped: unpack it with `unzip {tmp_path / 'corpus.zip'} "
        f"-d {tmp_path / 'corpus'}` and name the folder {tmp_path / 'corpus'} in place of this file",
        "corpus.tar.gz": f"a tar archive, not text, and was skipped: unpack it with `mkdir {tmp_path / 'corpus'} "
        f"&& tar xf {tmp_path / 'corpus.tar.gz'} -C {tmp_path / 'corpus'}` and name the folder",
        "more.tgz": f"a tar archive, not text, and was skipped: unpack it with `mkdir {tmp_path / 'more'} "
        f"&& tar xf {tmp_path / 'more.tgz'} -C {tmp_path / 'more'}` and name the folder {tmp_path / 'more'} in",
        "backup.dat": f"a zip archive, not text, and was skipped: unpack it with `unzip {tmp_path / 'backup.dat'} "
        f"-d {tmp_path / 'backup.dat.files'}` and name the folder {tmp_path / 'backup.dat.files'} in place",
        "wiki.txt.zst": f"a zstd-compressed file, not text, and was skipped: decompress it with `unzstd "
        f"{tmp_path / 'wiki.txt.zst'}` (it writes {tmp_path / 'wiki.txt'}) and {use}",
    }
    import pyarrow as pa
    import pyarrow.parquet as pq

    # a Hugging Face dataset's own format: was 'a .bz2, .xz or .zip file must be decompressed first'
    pq.write_table(pa.table({"id": [7], "text": [text]}), tmp_path / "train.parquet")
    expected["train.parquet"] = (
        'a Parquet file, not text, and was skipped: write its text column as JSON lines (`python -c "import '
        f"json, pyarrow.parquet as pq; out = open('{tmp_path / 'train.jsonl'}', 'w')"
    )
    for name, said in expected.items():
        docs, counts = read(name)
        assert docs == [] and counts["files_skipped_binary"] == 1
        [warning] = corpus_file_warnings(counts)
        assert warning.startswith(f"{tmp_path / name} is {said}"), warning
    # the Parquet file's python line, run as printed, writes its text column (not its first, `id`)
    [warning] = corpus_file_warnings(read("train.parquet")[1])
    exec(warning.split('`python -c "')[1].split('"`')[0], {})
    assert (tmp_path / "train.jsonl").read_text() == json.dumps({"text": text}, ensure_ascii=False) + "\n"


def test_the_files_read_for_no_text_are_each_named_once(tmp_path):
    """stats.json's `files_skipped` (the model card's "Skipped, no text read") lists every file the
    reader skipped whole, by its path: binary, UTF-16, empty, only lines over 1 MiB, one JSON array;
    not a file of which some text was read."""
    from preprocessing.corpus import MAX_LINE_BYTES
    from preprocessing.corpus_trouble import unread_files

    files = {
        "bin.dat": b"\x00\x01" * 100,
        "wide.txt": "Some text. More text.\n".encode("utf-16"),
        "empty.txt": b" \n\n",
        "one_line.txt": b"x" * (MAX_LINE_BYTES + 1) + b"\n",
        "array.json": json.dumps([{"text": "A doc."}]).encode() + b"\n",
        "read.txt": b"A sentence. Another.\n" + b"x" * (MAX_LINE_BYTES + 1) + b"\n",
    }
    counts: Counter = Counter()
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        list(read_documents(tmp_path / name, counts, quiet=True))
    assert unread_files(counts) == sorted(str(tmp_path / n) for n in files if n != "read.txt")
