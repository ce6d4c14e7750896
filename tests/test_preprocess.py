"""Stage 2 end to end: the real Beam job (DirectRunner, worker processes) on real text.

One small mixed corpus (Wikipedia .gz, plain text, JSONL and bad files) is processed with 1 and
with 2 workers: the shards must be byte-identical, round-trip through shard_format, and agree with
manifest.json and stats.json.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.atomic import read_marker
from common.errors import UserError
from common.paths import PROJECT_ROOT
from pipelines.config import load_config
from pipelines.stage_preprocess import run_preprocess_stage
from preprocessing.config import PreprocessConfig
from preprocessing.shard_format import (
    IS_NEXT,
    NOT_NEXT,
    SCHEMA_VERSION,
    read_manifest,
    read_shard,
    shard_paths,
)
from preprocessing.wordpiece import SPECIAL_TOKENS


def make_corpus(root: Path, data_dir: Path) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    for name in ("AA/wiki_01.gz", "AC/wiki_07.gz"):
        (corpus / name.replace("/", "_")).write_bytes((data_dir / "wiki/enwiki-2015" / name).read_bytes())
    docs = (data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8").split("\n\n")
    (corpus / "summaries.txt").write_text("\n\n".join(docs[:1200]), encoding="utf-8")
    with gzip.open(corpus / "more.jsonl.gz", "wt", encoding="utf-8") as fh:
        for d in docs[1200:1500]:
            fh.write(json.dumps({"text": d}) + "\n")
        fh.write("{not json\n")
    (corpus / "latin1.txt").write_bytes(
        "Caf\u00e9 au lait. It is good.\n\nOne more. And two.\n".encode("latin-1")
    )
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "image.bin").write_bytes(bytes(range(256)) * 100)
    return corpus


def config(corpus: Path, workers: int) -> PreprocessConfig:
    return PreprocessConfig(
        input=[str(corpus / "*")],
        dupe_factor=2,
        num_shards=3,
        validation_fraction=0.05,
        workers=workers,
        bucket_size_mb=0.5,
        seed=11,
    )


TMP = "tmp"  # under the `runs` fixture's root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir, minilm_dir):
    """Two jobs, with 1 and 2 Beam workers, in a temp directory of their own (`TMP`, left as the
    jobs left it)."""
    root = tmp_path_factory.mktemp("pp")
    corpus = make_corpus(root, data_dir)
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        (root / TMP).mkdir()
        patch.setenv("TMPDIR", str(root / TMP))  # Beam's worker processes
        patch.setattr(tempfile, "tempdir", str(root / TMP))
        for workers in (1, 2):
            stats = run_preprocess_stage(config(corpus, workers), minilm_dir, root / f"out{workers}")
            out[workers] = (root / f"out{workers}", stats)
    return corpus, out


@pytest.mark.slow
def test_the_jobs_leave_nothing_in_the_temp_directory(runs):
    """Beam's local job service and job server make folders with tempfile.mkdtemp() and left them:
    each job left a `beam-temp*`, two `tmp*` and a `beam-requirements-cache` folder in /tmp."""
    _, out = runs
    root = out[1][0].parent
    assert sorted(p.name for p in (root / TMP).iterdir()) == []


@pytest.mark.slow
def test_identical_shards_with_1_and_2_workers(runs):
    _, out = runs
    (d1, s1), (d2, s2) = out[1], out[2]
    files1 = sorted(p.relative_to(d1) for p in d1.rglob("*.parquet"))
    files2 = sorted(p.relative_to(d2) for p in d2.rglob("*.parquet"))
    assert files1 == files2 and len(files1) == 4  # 3 train + 1 validation
    for rel in files1:
        assert (d1 / rel).read_bytes() == (d2 / rel).read_bytes(), rel
    assert (d1 / "manifest.json").read_bytes() == (d2 / "manifest.json").read_bytes()
    assert {k: v for k, v in s1.items() if k not in ("seconds", "mb_per_second")} == {
        k: v for k, v in s2.items() if k not in ("seconds", "mb_per_second")
    }


@pytest.mark.slow
def test_shards_round_trip_and_agree_with_manifest_and_stats(runs, minilm_dir):
    _, out = runs
    directory, stats = out[2]
    assert read_marker(directory) is not None and not (directory / "_work").exists()
    manifest = read_manifest(directory)
    assert manifest["schema_version"] == SCHEMA_VERSION
    # the recorded vocabulary hash is the one pretraining matches against a tokenizer dir's vocab.txt
    from training.preflight import tokenizer_hashes

    assert manifest["tokenizer_sha256"] in tokenizer_hashes(minilm_dir)
    assert len(manifest["input_fingerprint"]) == 7 and all(
        "sha256" in f for f in manifest["input_fingerprint"]
    )
    assert "workers" not in manifest["config"]  # the output does not depend on it
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    cls_id, sep_id, mask_id = (vocab.index(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    special = {vocab.index(t) for t in SPECIAL_TOKENS}
    total = 0
    labels = []
    for split in ("train", "validation"):
        paths = shard_paths(directory, split, verify=True)
        for path, entry in zip(paths, manifest["splits"][split]):
            rows = read_shard(path).to_pylist()
            assert len(rows) == entry["num_examples"] > 0
            total += len(rows)
            for r in rows:
                ids = r["input_ids"]
                assert 5 <= len(ids) <= 128 and ids[0] == cls_id and ids[-1] == sep_id
                assert ids.count(sep_id) - sum(ids[p] == sep_id for p in r["masked_lm_positions"]) >= 2
                assert len(r["segment_ids"]) == len(ids) and set(r["segment_ids"]) <= {0, 1}
                assert len(r["masked_lm_positions"]) == len(r["masked_lm_ids"]) <= 20
                assert all(t not in special for t in r["masked_lm_ids"])
                assert r["masked_lm_positions"] == sorted(set(r["masked_lm_positions"]))
                assert all(
                    ids[p] in (mask_id, t) or ids[p] not in special
                    for p, t in zip(r["masked_lm_positions"], r["masked_lm_ids"])
                )
                labels.append(r["next_sentence_label"])
    assert total == stats["examples"] == sum(stats["examples_per_split"].values())
    assert set(labels) == {IS_NEXT, NOT_NEXT}
    assert abs(labels.count(IS_NEXT) / len(labels) - stats["is_next_ratio"]) < 1e-9
    assert abs(stats["is_next_ratio"] - 0.5) < 0.03
    assert stats["documents_used"]["validation"] > 0
    split = stats["masked_replacement_split"]
    assert abs(split["mask_token"] - 0.8) < 0.02 and abs(split["random_token"] - 0.1) < 0.02
    # every bad file of the corpus is counted, none crashed the job
    skipped = stats["skipped"]
    assert skipped["files_empty"] == 1 and skipped["files_skipped_binary"] == 1
    assert (
        skipped["lines_with_invalid_utf8_replaced"] == 1 and skipped["jsonl_lines_skipped_invalid_json"] == 1
    )
    assert stats["input_files"] == 7
    # the files of which no text was read, named as the manifest names the inputs (the model card
    # lists the others as the corpus)
    assert stats["files_skipped"] == ["empty.txt", "image.bin"]
    # pandas-free check that the files are plain Parquet any tool can open
    schema = pq.ParquetFile(shard_paths(directory, "train")[0]).schema_arrow
    assert schema.names[0] == "input_ids"
    # ... and that they explain themselves: the label convention and the masking in the file itself
    label_meaning = schema.field("next_sentence_label").metadata[b"description"].decode()
    assert label_meaning.startswith("0 = IsNext") and "1 = NotNext" in label_meaning
    assert "[MASK]" in schema.field("input_ids").metadata[b"description"].decode()
    assert json.loads(schema.metadata[b"bertflow_columns"])["next_sentence_label"] == label_meaning
    assert manifest["schema"]["next_sentence_label"] == {"0": "IsNext", "1": "NotNext"}


@pytest.mark.slow
def test_rerun_is_a_noop(runs, minilm_dir):
    corpus, out = runs
    directory, stats = out[1]
    shard = shard_paths(directory, "train")[0]
    before = shard.stat().st_mtime_ns
    assert run_preprocess_stage(config(corpus, 2), minilm_dir, directory) == stats  # workers do not matter
    assert shard.stat().st_mtime_ns == before


def test_shards_made_by_other_code_are_reused_and_said(runs, minilm_dir, caplog):
    corpus, out = runs
    directory, stats = out[1]
    marker_path = Path(directory) / "_COMPLETE.json"
    original = marker_path.read_text()
    marker = json.loads(original)
    assert set(marker["code"]) >= {"preprocessing/masking.py", "pipelines/stage_preprocess.py"}
    marker["code"]["preprocessing/masking.py"] = "0" * 16
    marker_path.write_text(json.dumps(marker))
    flow = load_config(None, ["run_dir=elsewhere"])
    try:
        with caplog.at_level(logging.WARNING, logger="bertflow"):
            assert run_preprocess_stage(config(corpus, 1), minilm_dir, directory) == stats
            assert run_preprocess_stage(config(corpus, 1), minilm_dir, directory, flow=flow) == stats
    finally:
        marker_path.write_text(original)
    # a folder of the user's (`bertflow preprocess --output`): deleting it recomputes it; the flow's
    # folder of a config: its flow command
    assert [r.getMessage() for r in caplog.records if "other code" in r.getMessage()] == [
        f"preprocess: reusing {directory} made by other code (changed since: preprocessing/masking.py); "
        f"to recompute with this code: {how}"
        for how in (
            f"delete {directory} and run this command again",
            flow.command_line("run", "--force", "preprocess"),
        )
    ]


def test_bad_settings_fail_before_any_work(tmp_path, minilm_dir):
    """Each refusal comes before the stage writes anything: no output folder appears."""
    out = tmp_path / "o"
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.txt").write_text("Some text. More text.\n")
    b_txt = str(tmp_path / "b.txt")
    refused = [
        ("every input file is 0 bytes", PreprocessConfig(input=[str(tmp_path / "a.txt")]), minilm_dir),
        ("matches no file", PreprocessConfig(input=[str(tmp_path / "*.gz")]), minilm_dir),
        (
            "max_predictions_per_seq",
            PreprocessConfig(input=[b_txt], max_seq_length=16, max_predictions_per_seq=20),
            minilm_dir,
        ),
        ("does not exist", PreprocessConfig(input=[b_txt]), tmp_path / "vocab.txt"),
    ]
    for message, settings, vocab in refused:
        with pytest.raises(UserError, match=message):
            run_preprocess_stage(settings, vocab, out)
        assert not out.exists(), message


def cli(*args: str, timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        env={**(env or os.environ), "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_cli_help_and_user_errors(tmp_path, minilm_dir, capsys):
    from pipelines.cli import main as cli_main

    for command in ("preprocess", "tokenizer"):
        r = cli(command, "--help")
        assert r.returncode == 0 and "--input" in r.stdout and "--set" in r.stdout
        assert r.stderr == "", r.stderr  # Beam's import-time apitools warning included
    # the refusals, in this process (a traceback would be an exception here)
    (tmp_path / "empty.txt").write_text("")
    empty = [
        "--input",
        str(tmp_path / "empty.txt"),
        "--vocab",
        str(minilm_dir),
        "--output",
        str(tmp_path / "o"),
    ]
    assert cli_main(["preprocess", *empty]) == 2 and "empty" in capsys.readouterr().err
    none = ["--input", str(tmp_path / "none*.txt"), "--output", str(tmp_path / "t")]
    assert cli_main(["tokenizer", *none]) == 2 and "matches no file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli_main(["tokenizer", "--bogus-flag=1"])
    assert exc.value.code == 2 and "unrecognized" in capsys.readouterr().err
    # another vocabulary into the flow's shard directory, which the flow would take as its own
    assert cli_main(["preprocess", "--vocab", str(minilm_dir), "--set", f"run_dir={tmp_path / 'runs'}"]) == 2
    assert "--vocab other than the flow's tokenizer for this config needs --output" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "preprocess").exists()


@pytest.mark.slow
def test_binary_only_corpus_is_a_clear_error(tmp_path, minilm_dir):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01" * 5000)
    r = cli(
        "preprocess",
        "--input",
        str(tmp_path / "x.bin"),
        "--vocab",
        str(minilm_dir),
        "--output",
        str(tmp_path / "o"),
        "--workers",
        "1",
    )
    assert r.returncode == 2 and "no documents" in r.stderr and "files_skipped_binary" in r.stderr
    assert "Traceback" not in r.stderr and read_marker(tmp_path / "o") is None


def test_a_corpus_without_documents_names_the_config_key_and_the_flag(tmp_path, minilm_dir, capfd, caplog):
    """Inside `bertflow run CONFIG` the user set preprocess.input, not --input: the fix names both.
    A JSONL corpus whose lines name their field otherwise is refused naming the field they have.
    The workers' own warning of the empty file reached the console twice (raw, and relayed by Beam
    as a protobuf dump); the stage says it once."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("   \n\n \t \n")
    cfg = PreprocessConfig(input=[str(corpus)], workers=1, num_shards=1)
    with pytest.raises(UserError) as exc:
        run_preprocess_stage(cfg, minilm_dir, tmp_path / "o")
    assert "the corpus has no documents" in str(exc.value) and "files_empty" in str(exc.value)
    assert "empty file" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "empty file" in r.getMessage()]
    assert "Fix: check preprocess.input (--input): " in str(exc.value) and "JSONL a 'text' field" in str(
        exc.value
    )
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": f"Sentence {i}. Another one."}) for i in range(5)) + "\n")
    with pytest.raises(UserError) as exc:
        run_preprocess_stage(
            PreprocessConfig(input=[str(jsonl)], workers=1, num_shards=1), minilm_dir, tmp_path / "o"
        )
    assert "jsonl_lines_skipped_no_text_field" in str(exc.value)
    assert (
        f'Fix: {jsonl}: 5 lines have no string "text" field, skipped (the first has the fields "body")'
        in str(exc.value)
    )
    assert read_marker(tmp_path / "o") is None


def test_example_settings_other_than_the_defaults_reach_the_shards(tmp_path, data_dir, minilm_dir):
    """masked_lm_prob, whole_word_mask, short_seq_prob and balance_nsp, each away from its default,
    change the shards the stage writes (each was recorded in the manifest but could be dropped on
    the way to the job unnoticed)."""
    docs = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8").split("\n\n")[:300]
    (tmp_path / "c.txt").write_text("\n\n".join(docs), encoding="utf-8")
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    settings = dict(masked_lm_prob=0.3, max_predictions_per_seq=40, whole_word_mask=True, balance_nsp=False)

    def run(name, short_seq_prob):
        cfg = PreprocessConfig(
            input=[str(tmp_path / "c.txt")], max_seq_length=64, dupe_factor=1, num_shards=1,
            validation_fraction=0.0, workers=1, seed=3, short_seq_prob=short_seq_prob, **settings,
        )  # fmt: skip
        return run_preprocess_stage(cfg, minilm_dir, tmp_path / name)

    stats, fewer_short = run("short", 1.0), run("few-short", 0.1)
    assert stats["mean_masked_per_example"] / stats["mean_tokens_per_example"] == pytest.approx(0.3, abs=0.02)
    # whole words: a masked '##' piece has its word's previous piece masked too (but where
    # truncation cut the word's head off)
    pieces = split = 0
    for row in read_shard(shard_paths(tmp_path / "short", "train")[0]).to_pylist():
        chosen = set(row["masked_lm_positions"])
        for position, token in zip(row["masked_lm_positions"], row["masked_lm_ids"]):
            if vocab[token].startswith("##"):
                pieces += 1
                split += position - 1 not in chosen
    assert pieces > 100 and split < 0.05 * pieces
    assert stats["examples"] > 1.2 * fewer_short["examples"]  # shorter targets: more, shorter pairs
    # Google's exact NSP rule on short documents: forced NotNext pairs are not paid back
    assert stats["is_next_ratio"] < 0.3


def test_documents_that_tokenize_to_nothing_are_skipped_and_counted(tmp_path, data_dir, minilm_dir):
    """A document of zero-width spaces is text to the reader but no token to WordPiece: skipped and
    counted; the job does not fail on them (a NotNext partner without sentences would have no
    sentence to start from)."""
    docs = (data_dir / "wiki" / "summaries_en.txt").read_text(encoding="utf-8").split("\n\n")[:100]
    blanks = ["\u200b\u200b\n\u200b"] * 100
    (tmp_path / "c.txt").write_text(
        "\n\n".join(d for pair in zip(docs, blanks) for d in pair), encoding="utf-8"
    )
    cfg = PreprocessConfig(
        input=[str(tmp_path / "c.txt")], max_seq_length=64, dupe_factor=3, num_shards=1, workers=1, seed=3
    )
    stats = run_preprocess_stage(cfg, minilm_dir, tmp_path / "out")
    assert stats["skipped"]["documents_skipped_no_tokens"] == 100
    assert stats["documents_read"] == 200 and stats["examples"] > 300


def test_work_dir_is_under_temp_location_when_the_pipeline_declares_one(tmp_path):
    """The workers' exchange files go to --temp_location (a cluster's shared scratch, with its own
    lifecycle), one folder per output so two stages do not clear each other's; without one, to
    OUTPUT/_work."""
    from pipelines.stage_preprocess import work_dir_for

    temp, out_a, out_b = str(tmp_path / "scratch"), str(tmp_path / "a"), str(tmp_path / "b")
    work_a = work_dir_for(out_a, temp)
    assert Path(work_a).parent == Path(temp) and not Path(work_a).is_relative_to(out_a)
    assert work_dir_for(out_a, temp) == work_a != work_dir_for(out_b, temp)
    assert work_dir_for(out_a, None) == str(Path(out_a) / "_work")


@pytest.mark.parametrize("name", ["flink", "spark", "dataflow", "dask"])
def test_runner_option_files_parse_into_beam_options(name):
    from pipelines.config import load_config
    from preprocessing.beam_job import pipeline_options

    cfg = load_config(PROJECT_ROOT / "infra" / "beam" / f"{name}.yaml").preprocess
    options = pipeline_options(cfg.runner, cfg.workers, cfg.beam_options).get_all_options()
    assert options["runner"].endswith(cfg.runner) and cfg.runner != "DirectRunner"
    if name == "dask":  # Beam knows DaskRunner by its full name; one input file per dask partition
        assert options["runner"] == "apache_beam.runners.dask.dask_runner.DaskRunner"
        assert options["partition_size"] == 1 and options["address"] == "tcp://dask-scheduler:8786"
    # command-line Beam flags come last and win over the defaults
    local = pipeline_options("DirectRunner", 2, ["--direct_num_workers=3"]).get_all_options()
    assert local["direct_num_workers"] == 3 and local["direct_running_mode"] == "multi_processing"
    with pytest.raises(UserError, match="--dupe_factr=3"):
        pipeline_options("DirectRunner", 2, ["--dupe_factr=3"])


def test_first_shuffle_moves_file_names_not_documents(tmp_path, data_dir, minilm_dir, monkeypatch):
    """ReadAndTokenize writes each input file's tokenized documents to Arrow files (one record batch
    per bucket) and emits only (bucket, (file, batch)), so no runner buffers the corpus in a
    GroupByKey; the files hold every document, and a file larger than the flush size is split
    without losing any. Its counters go to the work dir, not through the pipeline."""
    from tokenizers import Tokenizer

    from preprocessing import beam_job, storage
    from preprocessing.doc_tokens import unpack

    tok_json = Tokenizer.from_file(str(minilm_dir / "tokenizer.json")).to_str()
    source = data_dir / "wiki/enwiki-2015/AA/wiki_01.gz"
    outputs = {}
    monkeypatch.setattr(beam_job, "TOKENIZE_BATCH_DOCS", 4)  # this file has 53 long articles
    for flush in (beam_job.DOC_FLUSH_BYTES, 50_000):
        monkeypatch.setattr(beam_job, "DOC_FLUSH_BYTES", flush)
        work = str(tmp_path / f"work-{flush}")
        fn = beam_job.ReadAndTokenize(tok_json, 30522, 0.1, 4, work, {})
        fn.setup()
        emitted = list(fn.process((str(source), "wikiextractor")))
        (stats_file, _), *more = storage.match(f"{work}/stats/*.json")
        stats = storage.read_json(stats_file)
        assert not more and stats["files_read"] == 1
        assert all(isinstance(g, str) and Path(sl[0]).is_file() for g, sl in emitted)
        by_group: dict[str, list] = {}
        for group, doc_slice in emitted:
            by_group.setdefault(group, []).extend(beam_job.read_docs([doc_slice]))
        documents = stats["documents_train"] + stats.get("documents_validation", 0)
        assert sum(len(v) for v in by_group.values()) == documents
        outputs[flush] = {g: sorted(v) for g, v in by_group.items()}
        files = {sl[0] for _, sl in emitted}
        assert (len(files) == 1) if flush > 50_000 else (len(files) > 1)  # one file per flush
    assert outputs[max(outputs)] == outputs[50_000]  # the same records, however they were split
    h, packed = next(iter(outputs[50_000].values()))[0]
    assert isinstance(h, int) and all(isinstance(s, list) and s for s in unpack(packed))


def test_documents_are_tokenized_in_batches_of_bounded_text(tmp_path, minilm_dir, monkeypatch):
    """Tokenizing a batch takes ~30x its text in memory, and a batch was 64 documents whatever their
    size: a corpus of 1 MB documents (plain ones cut at 1 MB, JSONL lines up to 1 MB) put 37 MB in one
    batch, peak RSS 1.05 GB against 0.42 GB for the same text in Wikipedia-sized documents. A batch
    now also ends at TOKENIZE_BATCH_CHARS of text; the records are the same."""
    from tokenizers import Tokenizer

    from preprocessing import beam_job

    doc = " ".join(f"Sentence number {i} of this document." for i in range(600))  # ~22k characters
    source = tmp_path / "docs.txt"
    source.write_text("\n\n".join([doc] * 12) + "\n")
    tok_json = Tokenizer.from_file(str(minilm_dir / "tokenizer.json")).to_str()
    seen: list[int] = []

    class Recorded(beam_job.ReadAndTokenize):
        def _tokenize(self, docs, counts, buffered):
            seen.append(sum(len(d.text) for d in docs))
            return super()._tokenize(docs, counts, buffered)

    monkeypatch.setattr(beam_job, "TOKENIZE_BATCH_CHARS", 50_000, raising=False)  # also where it is missing
    fn = Recorded(tok_json, 30522, 0.1, 4, str(tmp_path / "work"), {})
    fn.setup()
    emitted = list(fn.process((str(source), "docs.txt")))
    assert emitted and sum(seen) == 12 * len(doc) and max(seen) <= 50_000 + len(doc), seen


def _part_files(
    root: Path, num_parts: int, rows_per_part: int, seed: int
) -> list[tuple[str, int, list[int]]]:
    """Sorted part files as MakeExamples writes them (random keys, real example columns)."""
    import random

    from preprocessing import beam_job
    from preprocessing.examples import Example

    rng = random.Random(seed)
    parts = []
    for p in range(num_parts):
        examples = []
        for _ in range(rows_per_part):
            n = rng.randint(5, 40)
            ids = [rng.randrange(30522) for _ in range(n)]
            examples.append(
                Example(rng.getrandbits(63), ids, [0] * n, [1, 2], ids[1:3], rng.randint(0, 1), [])
            )
        table = beam_job.examples_to_table(examples)
        parts.append(beam_job.write_part(str(root / f"part-{p:03d}.arrow"), table))
    return parts


def test_large_shards_are_merged_by_key_range_with_the_same_rows(tmp_path, monkeypatch):
    """Above MERGE_IN_MEMORY_ROWS a shard is written one key range at a time (a row group each):
    the same rows in the same key order as the in-memory sort, and the manifest entry (rows,
    sha256) agrees with the file."""
    from common.atomic import sha256_file
    from preprocessing import beam_job

    parts = _part_files(tmp_path, num_parts=7, rows_per_part=300, seed=3)
    assert all(rows == 300 and len(keys) == 2 and keys == sorted(keys) for _, rows, keys in parts)  # 256 + 44
    monkeypatch.setattr(beam_job, "SHARD_ROW_GROUP_ROWS", 500)
    results = {}
    for limit in (10**9, 1000):  # in memory, then by key range (2,100 rows > 1,000)
        monkeypatch.setattr(beam_job, "MERGE_IN_MEMORY_ROWS", limit)
        out, work = tmp_path / f"out-{limit}", tmp_path / f"work-{limit}"
        merge = beam_job.MergeShard(str(out), str(work), 1, {})
        merge.setup()
        assert list(merge.process((("train", 0), ["", *parts]))) == [("train", 0)]
        shard = out / "train" / "shard-00000-of-00001.parquet"
        entry = json.loads((work / "entries" / "train-00000.json").read_text())["entry"]
        assert entry == {"path": shard.name, "num_examples": 2100, "sha256": sha256_file(shard)}
        results[limit] = (read_shard(shard).to_pylist(), pq.ParquetFile(shard).metadata.num_row_groups)
    (in_memory, groups_in_memory), (merged, groups_merged) = results[10**9], results[1000]
    assert merged == in_memory and groups_in_memory == 1 and groups_merged == 5  # ceil(2100 / 500) ranges


def test_merge_by_key_range_yields_every_row_in_key_order_for_any_range_size(tmp_path):
    from preprocessing import beam_job

    parts = _part_files(tmp_path, num_parts=3, rows_per_part=300, seed=8)  # 2 batches each (256 + 44)
    expected = pa.concat_tables([pa.ipc.open_file(path).read_all() for path, _, _ in parts])
    keys = sorted(expected.column("key").to_pylist())
    by_key = dict(zip(expected.column("key").to_pylist(), expected.column("input_ids").to_pylist()))
    rows = sum(n for _, n, _ in parts)
    for range_rows in (1, 7, 640, 10**6):  # a range per row ... one range for all 900 rows
        groups = list(beam_job.merge_by_key_range(parts, rows, range_rows=range_rows))
        ids = [row for g in groups for row in g.column("input_ids").to_pylist()]
        assert ids == [by_key[k] for k in keys], range_rows
        assert all("key" not in g.column_names and g.num_rows for g in groups)


def test_the_text_size_of_a_gzip_file_is_what_the_reader_gets(tmp_path) -> None:
    """The buckets (memory per worker), the disk check and MB/s come from the corpus's text size.
    A gzip file's trailer holds only its last member's size: a multi-member file (bgzip, `cat a.gz
    b.gz`) was taken for a fraction of its text (37.4 MB read as 4.7: 2 buckets, not 10), and a
    cut-off one for whatever its last 4 bytes held (1 MB of text read as 924 MB: 231 buckets)."""
    from pipelines.stage_preprocess import text_size

    text = b"One sentence here. Another one follows.\n\n" * 20000
    multi = tmp_path / "multi.txt.gz"
    multi.write_bytes(b"".join(gzip.compress(text) for _ in range(4)))
    assert text_size(str(multi)) == 4 * len(text)
    whole = gzip.compress(text)
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with gzip.open(cut) as fh:  # what the corpus reader keeps: the text before the damage
        kept = len(fh.read(len(text) // 4))
    assert kept <= text_size(str(cut)) < len(text)
    plain = tmp_path / "plain.txt"
    plain.write_bytes(text)
    assert text_size(str(plain)) == len(text)
    # a whole file whose CRC does not match (a flipped bit): its text is read up to the check, which
    # raises gzip.BadGzipFile, an OSError, as the reader keeps it and says the file damaged
    bad_crc = tmp_path / "bad_crc.txt.gz"
    bad_crc.write_bytes(whole[:-8] + bytes(4) + whole[-4:])
    assert text_size(str(bad_crc)) == len(text)


def test_a_validation_split_is_said_empty_or_of_one_document_never_both() -> None:
    """A one-document split whose document gave no example was said to be empty and, in the same
    breath, to hold one document whose examples are all IsNext."""
    from pipelines.stage_preprocess import data_warnings
    from preprocessing.config import PreprocessConfig

    cfg = PreprocessConfig(validation_fraction=0.01)
    empty = {"examples_per_split": {"train": 90, "validation": 0}, "documents_used": {"validation": 1}}
    said = data_warnings({**empty, "documents_read": 50}, cfg)
    assert len(said) == 1 and said[0].startswith("the validation split is empty"), said
    assert "50 documents)" in said[0]
    [said] = data_warnings({**empty, "documents_read": 1}, cfg)
    assert "(validation_fraction 0.01, 1 document)" in said, said
    one = {"examples_per_split": {"train": 90, "validation": 4}, "documents_used": {"validation": 1}}
    said = data_warnings({**one, "documents_read": 50}, cfg)
    assert len(said) == 1 and said[0].startswith("the validation split holds one document"), said


def test_finished_shards_in_a_named_output_are_not_recomputed_over(tmp_path, data_dir, minilm_dir, capsys):
    """`bertflow preprocess --output DIR` with another setting than DIR's finished shards cleared
    them and wrote others, unsaid (hours of Beam on a real corpus, and the shards a killed
    pretraining resumes on); pretrain refuses the same mistake. Now refused before any work, naming
    the setting, nothing touched; the old settings find the shards again."""
    from pipelines.cli import main as cli_main

    docs = (data_dir / "wiki/summaries_en.txt").read_text(encoding="utf-8").split("\n\n")
    (tmp_path / "c.txt").write_text("\n\n".join(docs[:150]), encoding="utf-8")
    out = tmp_path / "shards"
    command = ["preprocess", "--input", str(tmp_path / "c.txt"), "--vocab", str(minilm_dir)]
    command += ["--output", str(out), "--num-shards", "1", "--workers", "1"]
    assert cli_main([*command, "--max-seq-length", "64"]) == 0
    files = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert cli_main([*command, "--max-seq-length", "48"]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds a finished preprocess output made with other settings or inputs " in err
    assert "(preprocess.max_predictions_per_seq 10 -> 8; preprocess.max_seq_length 64 -> 48)" in err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == files
    assert cli_main([*command, "--max-seq-length", "64"]) == 0  # reused as it is
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == files


def test_a_mistyped_flag_is_named_not_the_config_its_value_became(tmp_path, minilm_dir, capsys):
    """`bertflow preprocess --tokenizer DIR` (pretrain's and finetune's flag; preprocess's is --vocab):
    unknown flags pass to Beam, so DIR became the CONFIG argument and the error said 'config file DIR
    is a folder', or for a vocab.txt 'is not valid YAML'. Now the flag is named, and --vocab."""
    from pipelines.cli import main as cli_main

    for value in (minilm_dir, minilm_dir / "vocab.txt"):
        assert cli_main(["preprocess", "--tokenizer", str(value), "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        said = "unknown option --tokenizer: neither a bertflow preprocess flag nor a Beam pipeline option"
        assert f"{said}, so the word after it, {value}, was read as the CONFIG argument" in err
        assert "the tokenizer is --vocab DIR" in err and "config file" not in err
    assert not (tmp_path / "o").exists()


def test_sequences_longer_than_the_configs_model_are_refused_before_the_job(tmp_path, minilm_dir, capsys):
    """`bertflow preprocess --max-seq-length 1024` for a model of 512 positions ran the whole Beam job
    (hours on a real corpus); only pretraining then refused the shards. Refused first now, as
    `bertflow run` refuses it; a model given more positions takes them."""
    from pipelines.cli import main as cli_main

    (tmp_path / "c.txt").write_text("One sentence here. And another one.\n\nA second document. It ends.\n")
    command = ["preprocess", "--input", str(tmp_path / "c.txt"), "--vocab", str(minilm_dir)]
    command += ["--output", str(tmp_path / "o"), "--max-seq-length", "1024", "--num-shards", "1"]
    assert cli_main(command) == 2
    err = capsys.readouterr().err
    assert "preprocess.max_seq_length 1024 exceeds the model's 512 positions" in err
    assert not (tmp_path / "o").exists()
    assert cli_main([*command, "--set", "model.max_position_embeddings=1024"]) == 0


def test_an_output_whose_split_folder_holds_the_users_files_is_refused(tmp_path, minilm_dir, capsys):
    """`bertflow preprocess --output DIR` where DIR/train/ held the user's own files (a data folder
    with train/ and validation/) cleared that folder to write the shards: the files were deleted
    unsaid, the corpus too when it lay there. Now refused before any work, naming the folder and
    its files; nothing touched."""
    from pipelines.cli import main as cli_main

    out = tmp_path / "data"
    (out / "train").mkdir(parents=True)
    corpus = out / "train" / "corpus.txt"
    corpus.write_text("One sentence here. Another one follows.\n\nA second document. It has two.\n")
    (out / "validation").mkdir()
    command = ["preprocess", "--input", str(corpus), "--vocab", str(minilm_dir), "--output", str(out)]
    assert cli_main([*command, "--num-shards", "1", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        f"the preprocess output {out} has a train/ folder holding files that are not bertflow shards" in err
    )
    assert "(corpus.txt)" in err and "Fix: choose an --output folder of its own" in err
    assert sorted(p.name for p in out.rglob("*")) == ["corpus.txt", "train", "validation"]


def test_an_output_holding_the_users_manifest_or_stats_is_refused(tmp_path, minilm_dir, capsys):
    """`bertflow preprocess --output DIR` where DIR held the user's own manifest.json and stats.json
    (no bertflow output) replaced both with the run's. Now refused before any work, naming them;
    a folder of unrelated files is used and they are kept."""
    from pipelines.cli import main as cli_main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one follows.\n\nA second document. It has two.\n")
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("manifest.json", "stats.json", "notes.md"):
        (out / name).write_text("mine\n")
    command = ["preprocess", "--input", str(corpus), "--vocab", str(minilm_dir), "--output", str(out)]
    command += ["--num-shards", "1", "--workers", "1"]
    assert cli_main(command) == 2
    err = capsys.readouterr().err
    assert f"the preprocess output {out} already holds manifest.json, stats.json, and it is not" in err
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.md", "stats.json"]
    assert all((out / n).read_text() == "mine\n" for n in ("manifest.json", "stats.json", "notes.md"))
    (out / "manifest.json").unlink()
    (out / "stats.json").unlink()
    (out / ".tmp-draft").write_text("mine\n")  # no temp file of a write of preprocess: the user's
    assert cli_main(command) == 0
    assert (out / "notes.md").read_text() == "mine\n" and (out / "_COMPLETE.json").is_file()
    assert (out / ".tmp-draft").read_text() == "mine\n" and not (out / "_IN_PROGRESS.json").exists()
