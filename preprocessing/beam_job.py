"""The Beam pipeline: corpus files → tokenized documents → buckets → examples → Parquet shards.

    files ─Reshuffle─▶ ReadAndTokenize ─(split/bucket) → doc file─▶ GroupByKey ─▶ MakeExamples
      ─(split, shard) → part file─▶ GroupByKey ─▶ MergeShard (sort by key, write_shard) ─▶ entries

Scaling (as NVIDIA's LDDL): each document goes to one of `num_buckets` buckets by a hash of its id
and text; a bucket holds ~bucket_size_mb of text, so memory per worker is bounded whatever the
corpus size, and NotNext segments are drawn from the same bucket. Every random draw is seeded from
(seed, bucket, dupe pass) and every example gets a stable 64-bit key that picks its shard and its
place in the shard, so the shards are byte-identical for any number of workers or runner.
Both shuffles move only file names: tokenized documents are written per input file as Arrow
files (rows grouped by bucket) under the work dir (a filesystem the workers and the driver share) and bucket outputs
as Parquet part files, so no runner ever buffers the corpus itself (the local runner holds a
GroupByKey's values in the driver and hands each worker its share as one bundle, which made
memory grow with the corpus: docs/benchmarks.md §2). MergeShard writes each final shard
atomically with `shard_format.write_shard`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions

from common.atomic import atomic_path, atomic_write_json
from common.errors import UserError
from common.paths import PROJECT_ROOT
from preprocessing.corpus import read_documents
from preprocessing.doc_tokens import pack, tokenize_documents, unpack
from preprocessing.examples import Example, ExampleParams, create_examples
from preprocessing.masking import MaskingSpec
from preprocessing.shard_format import SCHEMA, shard_name, write_shard

TOKENIZE_BATCH_DOCS = 64
DOC_FLUSH_BYTES = 32 * 2**20  # tokenized text a worker buffers per input file before writing it out
DOC_SCHEMA = pa.schema(
    [
        pa.field("hash", pa.uint64(), nullable=False),
        pa.field("ids", pa.binary(), nullable=False),
        pa.field("lens", pa.binary(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
    ]
)
PART_SCHEMA = pa.schema([pa.field("key", pa.int64(), nullable=False), *SCHEMA])


def document_hash(doc_id: str, text: str) -> int:
    digest = hashlib.blake2b(f"{doc_id}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def split_of(h: int, validation_fraction: float) -> str:
    return "validation" if (h % 1_000_003) < validation_fraction * 1_000_003 else "train"


class ReadAndTokenize(beam.DoFn):
    """One corpus file → its documents tokenized and written as Arrow files under `docs_dir`
    (rows grouped by bucket); emits (bucket, file slice). Memory: about DOC_FLUSH_BYTES of tokens."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        validation_fraction: float,
        num_buckets: int,
        docs_dir: str,
    ):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.validation_fraction = validation_fraction
        self.num_buckets = num_buckets
        self.docs_dir = docs_dir

    def setup(self) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_str(self.tokenizer_json)

    def process(self, element: tuple[str, str]):
        path, label = element
        counts: Counter = Counter()
        # deterministic names: a rerun rewrites the same files (atomically)
        file_id = hashlib.blake2b(path.encode(), digest_size=8).hexdigest()
        buffered: dict[str, list] = {}
        size, chunk, batch = 0, 0, []
        for doc in read_documents(Path(path), counts, label):
            batch.append(doc)
            if len(batch) >= TOKENIZE_BATCH_DOCS:
                size += self._tokenize(batch, counts, buffered)
                batch = []
            if size >= DOC_FLUSH_BYTES:
                yield from self._flush(buffered, file_id, chunk)
                buffered, size, chunk = {}, 0, chunk + 1
        if batch:
            self._tokenize(batch, counts, buffered)
        yield from self._flush(buffered, file_id, chunk)
        counts["files_read"] += 1
        yield beam.pvalue.TaggedOutput("stats", dict(counts))

    def _tokenize(self, docs, counts: Counter, buffered: dict[str, list]) -> int:
        added = 0
        for doc, sentences in zip(docs, tokenize_documents(self.tok, docs, counts)):
            if not sentences:
                counts["documents_skipped_no_tokens"] += 1
                continue
            if len(sentences) == 1:
                counts["documents_single_sentence"] += 1  # usable only as A with a NotNext B, or as B
            h = document_hash(doc.doc_id, doc.text)
            split = split_of(h, self.validation_fraction)
            counts[f"documents_{split}"] += 1
            # validation holds a fraction of the documents: proportionally fewer buckets
            n = (
                self.num_buckets
                if split == "train"
                else math.ceil(self.num_buckets * self.validation_fraction)
            )
            packed = pack(sentences, self.vocab_size)
            buffered.setdefault(f"{split}/{(h >> 24) % max(1, n):06d}", []).append((h, packed))
            added += len(packed[0]) + len(packed[1])
        return added

    def _flush(self, buffered: dict[str, list], file_id: str, chunk: int):
        """One Arrow file per flush, rows grouped by bucket; emits (bucket, (path, first row, rows)).
        Work files need no fsync: a crash clears the whole work dir and the job reruns."""
        if not buffered:
            return
        groups = sorted(buffered)
        docs = [d for g in groups for d in buffered[g]]
        table = pa.Table.from_arrays(
            [
                pa.array([h for h, _ in docs], type=pa.uint64()),
                pa.array([p[0] for _, p in docs], type=pa.binary()),
                pa.array([p[1] for _, p in docs], type=pa.binary()),
                pa.array([p[2] for _, p in docs], type=pa.string()),
            ],
            schema=DOC_SCHEMA,
        )
        path = Path(self.docs_dir) / f"{file_id}-{chunk:05d}.arrow"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, DOC_SCHEMA) as writer:
            writer.write_table(table)
        os.replace(tmp, path)  # a retried bundle rewrites the same name with the same rows
        start = 0
        for group in groups:
            yield group, (str(path), start, len(buffered[group]))
            start += len(buffered[group])


def read_docs(slices) -> list[tuple[int, tuple[bytes, bytes, str]]]:
    """The (hash, packed sentences) records of a bucket: (path, first row, rows) slices of the
    document files that ReadAndTokenize wrote."""
    docs = []
    for path, start, length in slices:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all().slice(start, length)
            cols = [table.column(name).to_pylist() for name in ("hash", "ids", "lens", "dtype")]
        docs.extend((h, (ids, lens, dtype)) for h, ids, lens, dtype in zip(*cols))
    return docs


class MakeExamples(beam.DoFn):
    def __init__(self, parts_dir: str, params: ExampleParams, spec: MaskingSpec, num_shards: int):
        self.parts_dir = parts_dir
        self.params = params
        self.spec = spec
        self.num_shards = num_shards

    def process(self, element):
        group, doc_files = element
        docs = sorted(
            read_docs(sorted(doc_files)), key=lambda d: (d[0], d[1])
        )  # arrival order varies; this does not
        stats: Counter = Counter()
        split = group.split("/")[0]
        n_shards = self.num_shards if split == "train" else 1
        documents = [unpack(p) for _, p in docs]
        for dupe in range(self.params.dupe_factor):  # one pass at a time: memory ~ one bucket's text
            by_shard: dict[int, list[Example]] = {}
            for ex in create_examples(documents, self.params, self.spec, group, stats, passes=[dupe]):
                by_shard.setdefault(ex.key % n_shards, []).append(ex)
            for shard, examples in sorted(by_shard.items()):
                name = f"{group.replace('/', '-')}-{dupe:03d}.parquet"
                path = Path(self.parts_dir) / split / f"{shard:05d}" / name
                with atomic_path(path) as tmp:
                    pq.write_table(examples_to_table(examples), tmp, compression="zstd")
                yield (split, shard), str(path)
        yield beam.pvalue.TaggedOutput("stats", dict(stats))


def examples_to_table(examples: list[Example]) -> pa.Table:
    examples = sorted(examples, key=lambda e: e.key)
    return pa.Table.from_arrays(
        [
            pa.array([e.key for e in examples], type=pa.int64()),
            pa.array([e.input_ids for e in examples], type=pa.list_(pa.int32())),
            pa.array([e.segment_ids for e in examples], type=pa.list_(pa.int8())),
            pa.array([e.masked_lm_positions for e in examples], type=pa.list_(pa.int32())),
            pa.array([e.masked_lm_ids for e in examples], type=pa.list_(pa.int32())),
            pa.array([e.next_sentence_label for e in examples], type=pa.int8()),
        ],
        schema=PART_SCHEMA,
    )


class MergeShard(beam.DoFn):
    def __init__(self, out_dir: str, num_shards: int):
        self.out_dir = out_dir
        self.num_shards = num_shards

    def process(self, element):
        (split, shard), paths = element
        paths = sorted(p for p in paths if p)
        tables = [pq.read_table(p, schema=PART_SCHEMA) for p in paths]
        table = pa.concat_tables(tables) if tables else PART_SCHEMA.empty_table()
        table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")])).drop_columns(["key"])
        count = self.num_shards if split == "train" else 1
        entry = write_shard(Path(self.out_dir) / split / shard_name(shard, count), table)
        yield split, shard, entry


def _sum_counts(dicts) -> dict[str, int]:
    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return dict(total)


def _write_json(obj: Any, path: str) -> None:
    atomic_write_json(path, obj)


def pipeline_options(runner: str, workers: int, extra: list[str]) -> PipelineOptions:
    """Local default: DirectRunner, one worker process per `workers`; any flag in `extra` wins.
    A flag no Beam option knows is an error (Beam itself would only warn and drop it)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(extra)
    unknown = [u for u in unknown if u.startswith("-")]
    if unknown:
        raise UserError(
            f"unknown option(s) {' '.join(unknown)}: neither a bertflow preprocess flag nor a Beam pipeline option.",
            fix="check the spelling (`bertflow preprocess --help`; Beam options are --name=value).",
        )
    flags = [
        f"--runner={runner}",
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
        "--default_sdk_harness_log_level=WARNING",
        *extra,
    ]
    return PipelineOptions(flags)


def run_pipeline(
    files: list[tuple[str, str]],
    tokenizer_json: str,
    vocab: list[str],
    params: ExampleParams,
    spec: MaskingSpec,
    validation_fraction: float,
    num_shards: int,
    num_buckets: int,
    out_dir: Path,
    work_dir: Path,
    options: PipelineOptions,
) -> tuple[dict[str, int], list[tuple[str, int, dict]]]:
    """Run the job; returns (summed counters, [(split, shard, manifest entry)])."""
    # local worker processes import this package: make sure they can find it
    path = os.environ.get("PYTHONPATH", "")
    if str(PROJECT_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), path) if p)
    stats_path, entries_path = work_dir / "stats.json", work_dir / "entries.json"
    empty_shards = [(("train", s), "") for s in range(num_shards)] + [(("validation", 0), "")]
    with beam.Pipeline(options=options) as p:
        docs = (
            p
            | "Files" >> beam.Create(files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadAndTokenize"
            >> beam.ParDo(
                ReadAndTokenize(
                    tokenizer_json, len(vocab), validation_fraction, num_buckets, str(work_dir / "docs")
                )
            ).with_outputs("stats", main="docs")
        )
        examples = (
            docs.docs
            | "GroupBuckets" >> beam.GroupByKey()
            | "MakeExamples"
            >> beam.ParDo(MakeExamples(str(work_dir / "parts"), params, spec, num_shards)).with_outputs(
                "stats", main="parts"
            )
        )
        every_shard = p | "AllShards" >> beam.Create(empty_shards)
        entries = (
            (examples.parts, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "MergeShards" >> beam.ParDo(MergeShard(str(out_dir), num_shards))
        )
        _ = (
            entries
            | "AllEntries" >> beam.combiners.ToList()
            | "WriteEntries" >> beam.Map(_write_json, str(entries_path))
        )
        _ = (
            (docs.stats, examples.stats)
            | "AllStats" >> beam.Flatten()
            | "SumStats" >> beam.CombineGlobally(_sum_counts)
            | "WriteStats" >> beam.Map(_write_json, str(stats_path))
        )
    stats = json.loads(stats_path.read_text())
    entries = [tuple(e) for e in json.loads(entries_path.read_text())]
    return stats, entries
