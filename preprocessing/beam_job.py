"""The Beam pipeline: corpus files → tokenized documents → buckets → examples → Parquet shards.

    files ─Reshuffle─▶ ReadAndTokenize ─(bucket, doc batch)─▶ GroupByKey ─▶ MakeExamples
      ─((split, shard), part file)─▶ GroupByKey ─▶ MergeShard (merge the sorted parts, write the shard)

Scaling (as NVIDIA's LDDL): each document goes to one of `num_buckets` buckets by a hash of its id
and text; a bucket holds ~bucket_size_mb of text, so memory per worker is bounded whatever the
corpus size, and NotNext segments are drawn from the same bucket. Every random draw is seeded from
(seed, bucket, dupe pass) and every example gets a stable 64-bit key that picks its shard and its
place in the shard, so the shards are byte-identical for any number of workers or runner.

Portable I/O: every byte goes through `preprocessing.storage` (Beam's FileSystems), so inputs,
shards and work files may be local paths or `s3://`, `gs://`, `hdfs://` URLs. What one worker
writes for another lives under `work_dir` (the pipeline's --temp_location, else OUTPUT/_work) and
is named in the pipeline's own elements: both shuffles move file names, never the corpus
(tokenized documents are written per input file as Arrow IPC files, one record batch per bucket;
bucket outputs as sorted Parquet part files), so no runner buffers the corpus in a GroupByKey.

One chain of transforms, no tagged outputs, no global combine: each unit of work writes its
counters to work_dir/stats/ and each shard its manifest entry to work_dir/entries/ (names fixed by
the input, so a retried bundle overwrites its own file) and the driver sums them after the run.
This is what every runner executes the same way (Beam's DaskRunner computes only the last
transform's ancestors and does not separate tagged outputs).

Memory of the merge is bounded: part files are Arrow IPC files sorted by key in record batches of
PART_BATCH_ROWS rows, and each part's element carries its row count and the first key of every
batch. A shard of up to MERGE_IN_MEMORY_ROWS examples is sorted in memory and written as one row
group (the layout of earlier versions, byte for byte); a larger one is written one key range at a
time (keys are uniform hashes: ranges of ~SHARD_ROW_GROUP_ROWS rows), reading from each part only
the batches that overlap the range, one file open at a time, one row group per range.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.options.pipeline_options import PipelineOptions

from common.errors import UserError
from common.paths import PROJECT_ROOT
from preprocessing import storage
from preprocessing.corpus import read_documents
from preprocessing.doc_tokens import pack, tokenize_documents, unpack
from preprocessing.examples import Example, ExampleParams, create_examples
from preprocessing.masking import MaskingSpec
from preprocessing.sentence_encoder import SentenceEncoder
from preprocessing.shard_format import SCHEMA, shard_name, write_shard

TOKENIZE_BATCH_DOCS = 64
TOKENIZE_BATCH_CHARS = 2 * 2**20  # or fewer documents: tokenizing a batch takes ~30x its text in memory
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
MERGE_IN_MEMORY_ROWS = 1 << 17  # larger shards are merged by key range (~100 MB of examples at seq 128)
PART_BATCH_ROWS = 256  # record batch size of part files: what the merge reads at least
SHARD_ROW_GROUP_ROWS = 1 << 16  # rows per key range (and row group) of shards merged by key range
KEY_SPACE = 1 << 63  # example keys are uniform in [0, 2**63)
STATS_DIR, ENTRIES_DIR, DIGESTS_DIR = "stats", "entries", "digests"
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
CONNECT_TIMEOUT_S = 5.0  # for the reachability checks before a job starts
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "PrismRunner")
AWS_CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def document_hash(doc_id: str, text: str) -> int:
    digest = hashlib.blake2b(f"{doc_id}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def count_duplicates(digest_files: Iterable[bytes]) -> int:
    """Documents whose text an earlier document already had (8-byte digests, any file)."""
    digests = np.frombuffer(b"".join(digest_files), dtype=np.uint64)
    return int(len(digests) - len(np.unique(digests)))


def split_of(h: int, validation_fraction: float) -> str:
    return "validation" if (h % 1_000_003) < validation_fraction * 1_000_003 else "train"


class _StorageFn(beam.DoFn):
    """A DoFn that reads or writes files: its setup configures Beam's filesystems in the worker
    with the driver's options (see preprocessing/storage.py)."""

    def __init__(self, fs_options: dict[str, Any]):
        self.fs_options = fs_options

    def setup(self) -> None:
        storage.use_options(self.fs_options)


class ReadAndTokenize(_StorageFn):
    """One corpus file → its documents tokenized and written as Arrow IPC files under
    work_dir/docs (one record batch per bucket); emits (bucket, (file, batch index)) and writes the
    file's counters to work_dir/stats. Memory: about DOC_FLUSH_BYTES of tokens, and the batch being
    tokenized (TOKENIZE_BATCH_DOCS documents, at most about TOKENIZE_BATCH_CHARS of text)."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        validation_fraction: float,
        num_buckets: int,
        work_dir: str,
        fs_options: dict[str, Any],
    ):
        super().__init__(fs_options)
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.validation_fraction = validation_fraction
        self.num_buckets = num_buckets
        self.work_dir = work_dir

    def setup(self) -> None:
        from tokenizers import Tokenizer

        super().setup()
        self.encoder = SentenceEncoder(Tokenizer.from_str(self.tokenizer_json))

    def process(self, element: tuple[str, str]):
        path, label = element
        counts: Counter = Counter()
        # deterministic names: a rerun rewrites the same files (atomically)
        file_id = hashlib.blake2b(path.encode(), digest_size=8).hexdigest()
        buffered: dict[str, list] = {}
        size, chunk, batch, batch_chars = 0, 0, [], 0
        digests = bytearray()  # of each document's text: duplicates are counted across all files
        # quiet: the driver says each file's skips once, from these counts (corpus_file_warnings)
        for doc in read_documents(path, counts, label, quiet=True):
            digests += hashlib.blake2b(doc.text.encode(), digest_size=8).digest()
            batch.append(doc)
            batch_chars += sum(map(len, doc.paragraphs))
            if len(batch) >= TOKENIZE_BATCH_DOCS or batch_chars >= TOKENIZE_BATCH_CHARS:
                size += self._tokenize(batch, counts, buffered)
                batch, batch_chars = [], 0
            if size >= DOC_FLUSH_BYTES:
                yield from self._flush(buffered, file_id, chunk)
                buffered, size, chunk = {}, 0, chunk + 1
        if batch:
            self._tokenize(batch, counts, buffered)
        yield from self._flush(buffered, file_id, chunk)
        counts["files_read"] += 1
        if digests:  # (an empty object is a malformed multipart upload on S3)
            storage.write_bytes(
                storage.join(self.work_dir, DIGESTS_DIR, f"read-{file_id}.bin"), bytes(digests)
            )
        storage.write_json(storage.join(self.work_dir, STATS_DIR, f"read-{file_id}.json"), dict(counts))

    def _tokenize(self, docs, counts: Counter, buffered: dict[str, list]) -> int:
        added = 0
        for doc, (ids, lengths) in zip(docs, tokenize_documents(self.encoder, docs, counts)):
            if not len(lengths):
                counts["documents_skipped_no_tokens"] += 1
                continue
            if len(lengths) == 1:
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
            packed = pack((ids, lengths), self.vocab_size)
            buffered.setdefault(f"{split}/{(h >> 24) % max(1, n):06d}", []).append((h, packed))
            added += len(packed[0]) + len(packed[1])
        return added

    def _flush(self, buffered: dict[str, list], file_id: str, chunk: int):
        """One Arrow IPC file per flush, one record batch per bucket; emits (bucket, (path, batch)).
        A retried bundle rewrites the same name with the same rows; the work dir goes at the end."""
        if not buffered:
            return
        groups = sorted(buffered)
        path = storage.join(self.work_dir, "docs", f"{file_id}-{chunk:05d}.arrow")

        def write(sink) -> None:
            with pa.ipc.new_file(sink, DOC_SCHEMA) as writer:
                for group in groups:
                    docs = buffered[group]
                    writer.write_batch(
                        pa.record_batch(
                            [
                                pa.array([h for h, _ in docs], type=pa.uint64()),
                                pa.array([p[0] for _, p in docs], type=pa.binary()),
                                pa.array([p[1] for _, p in docs], type=pa.binary()),
                                pa.array([p[2] for _, p in docs], type=pa.string()),
                            ],
                            schema=DOC_SCHEMA,
                        )
                    )

        storage.write_atomically(path, write)
        for index, group in enumerate(groups):
            yield group, (path, index)


def read_docs(slices) -> list[tuple[int, tuple[bytes, bytes, str]]]:
    """The (hash, packed sentences) records of a bucket: its (path, record batch) slices of the
    document files that ReadAndTokenize wrote (each file opened once)."""
    by_path: dict[str, list[int]] = {}
    for path, index in slices:
        by_path.setdefault(path, []).append(index)
    docs = []
    for path, indices in sorted(by_path.items()):
        with storage.open_read(path) as source:
            reader = pa.ipc.open_file(source)
            for index in sorted(indices):
                batch = reader.get_batch(index)
                cols = [batch.column(name).to_pylist() for name in ("hash", "ids", "lens", "dtype")]
                docs.extend((h, (ids, lens, dtype)) for h, ids, lens, dtype in zip(*cols))
    return docs


class MakeExamples(_StorageFn):
    """One bucket → its examples, one key-sorted part file per (dupe pass, shard) under
    work_dir/parts (`write_part`); emits ((split, shard), (part path, rows, first keys)) and
    writes the bucket's counters."""

    def __init__(
        self,
        work_dir: str,
        params: ExampleParams,
        spec: MaskingSpec,
        num_shards: int,
        fs_options: dict[str, Any],
    ):
        super().__init__(fs_options)
        self.work_dir = work_dir
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
                name = f"{group.replace('/', '-')}-{dupe:03d}.arrow"
                path = storage.join(self.work_dir, "parts", split, f"{shard:05d}", name)
                yield (split, shard), write_part(path, examples_to_table(examples))
        name = f"examples-{group.replace('/', '-')}.json"
        storage.write_json(storage.join(self.work_dir, STATS_DIR, name), dict(stats))


def write_part(path: str, table: pa.Table) -> tuple[str, int, list[int]]:
    """A key-sorted part as an Arrow IPC file (zstd buffers, batches of PART_BATCH_ROWS rows);
    returns (path, rows, first key of each batch): what MergeShard plans its reads from."""
    batches = table.to_batches(max_chunksize=PART_BATCH_ROWS)

    def write(sink) -> None:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(sink, PART_SCHEMA, options=options) as writer:
            for batch in batches:
                writer.write_batch(batch)

    storage.write_atomically(path, write)
    return path, table.num_rows, [b.column(0)[0].as_py() for b in batches]


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


class MergeShard(_StorageFn):
    """The sorted part files of one shard → the shard (see the module docstring for the memory
    bound); writes its manifest entry to work_dir/entries and emits (split, shard)."""

    def __init__(self, out_dir: str, work_dir: str, num_shards: int, fs_options: dict[str, Any]):
        super().__init__(fs_options)
        self.out_dir = out_dir
        self.work_dir = work_dir
        self.num_shards = num_shards

    def process(self, element):
        (split, shard), parts = element
        parts = sorted(tuple(p) for p in parts if p)  # (path, rows, first keys); "" = no part
        count = self.num_shards if split == "train" else 1
        target = storage.join(self.out_dir, split, shard_name(shard, count))
        rows = sum(r for _, r, _ in parts)
        if rows <= MERGE_IN_MEMORY_ROWS:
            tables = []
            for path, _, _ in parts:
                with storage.open_read(path) as fh:
                    tables.append(pa.ipc.open_file(fh).read_all())
            table = pa.concat_tables(tables) if tables else PART_SCHEMA.empty_table()
            order = pc.sort_indices(table, sort_keys=[("key", "ascending")])
            entry = write_shard(target, table.take(order).drop_columns(["key"]))
        else:
            entry = write_shard(target, merge_by_key_range(parts, rows))
        storage.write_json(
            storage.join(self.work_dir, ENTRIES_DIR, f"{split}-{shard:05d}.json"),
            {"split": split, "shard": shard, "entry": entry},
        )
        yield split, shard


def merge_by_key_range(
    parts: list[tuple[str, int, list[int]]], rows: int, range_rows: int | None = None
) -> Iterator[pa.Table]:
    """The rows of sorted part files in key order, as one table per key range (without the key
    column). The key space is cut into ceil(rows / range_rows) equal ranges; for each range only
    the part batches that overlap it are read, each file opened for as long as its batches take."""
    ranges = max(1, math.ceil(rows / (range_rows or SHARD_ROW_GROUP_ROWS)))
    bounds = [KEY_SPACE * i // ranges for i in range(ranges)] + [KEY_SPACE]
    for lo, hi in zip(bounds, bounds[1:]):
        pieces = []
        for path, _, first_keys in parts:
            # batch i holds keys in [first_keys[i], first_keys[i + 1]]
            wanted = [
                i
                for i, first in enumerate(first_keys)
                if first < hi and (i + 1 == len(first_keys) or first_keys[i + 1] >= lo)
            ]
            if not wanted:
                continue
            with storage.open_read(path) as fh:
                reader = pa.ipc.open_file(fh)
                for i in wanted:
                    batch = reader.get_batch(i)
                    keys = batch.column(0).to_numpy()
                    a, b = int(keys.searchsorted(lo)), int(keys.searchsorted(hi))
                    if b > a:  # a copy: a slice would keep the whole batch alive
                        pieces.append(batch.take(pa.array(range(a, b), pa.int64())))
        if not pieces:
            continue
        table = pa.Table.from_batches(pieces, schema=PART_SCHEMA)
        table = table.take(pc.sort_indices(table, sort_keys=[("key", "ascending")]))
        yield table.drop_columns(["key"]).combine_chunks()


def _sum_counts(dicts) -> dict[str, int]:
    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return dict(total)


def unknown_beam_options(extra: list[str]) -> list[str]:
    """The flags in `extra` that no Beam pipeline option knows (of the runners registered so far)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(extra)
    return [u for u in unknown if u.startswith("-")]


def pipeline_options(runner: str, workers: int, extra: list[str]) -> PipelineOptions:
    """Local default: DirectRunner, one worker process per `workers`; any flag in `extra` wins.
    A flag no Beam option knows is an error (Beam itself would only warn and drop it)."""
    if runner in ("DaskRunner", DASK_RUNNER):
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers DaskOptions: --dask_*)

        runner = DASK_RUNNER  # Beam knows it only by its full name
    if unknown := unknown_beam_options(extra):
        raise UserError(
            f"unknown option(s) {' '.join(unknown)}: neither a bertflow preprocess flag nor a Beam pipeline option.",
            fix="check the spelling (`bertflow preprocess --help`; Beam options are --name=value).",
        )
    if runner == DASK_RUNNER and not any(
        f.startswith(("--dask_npartitions", "--dask_partition_size")) for f in extra
    ):
        # DaskRunner's default puts up to 128 input files in one dask partition (one task, one
        # worker): one file per partition spreads reading and tokenizing over the cluster
        extra = ["--dask_partition_size=1", *extra]
    flags = [
        f"--runner={runner}",
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
        "--default_sdk_harness_log_level=WARNING",
        *extra,
    ]
    options = PipelineOptions(flags)
    check_runner(options.get_all_options()["runner"])
    return options


def check_runner(name: str) -> None:
    """The runner must be one Beam knows (a name or a class path) and installed here."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import create_runner

    try:
        create_runner(name)
    except ValueError:
        raise UserError(
            f"preprocess.runner {name!r} is not a Beam runner.",
            fix=f"use one of {', '.join(StandardOptions.KNOWN_RUNNER_NAMES)} (see infra/beam/), "
            "or the full class path of a PipelineRunner.",
        ) from None
    except (ImportError, AttributeError) as exc:
        raise UserError(
            f"preprocess.runner {name!r} cannot be loaded here: {exc}.",
            fix="install the runner's extra (e.g. apache-beam[gcp] for DataflowRunner) or pick another runner.",
        ) from None


def connect_error(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why a TCP connection to host:port does not open within `timeout` seconds; None if it does."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


def check_dask_scheduler(options: PipelineOptions) -> None:
    """A DaskRunner job's --dask_client_address must answer: refused in seconds with what to do,
    instead of Dask's traceback after its 30 s connection timeout."""
    settings = options.get_all_options()
    address = settings.get("address")
    if settings["runner"] != DASK_RUNNER or not address:
        return
    from distributed.comm import parse_address, parse_host_port

    scheme, location = parse_address(address)
    if scheme not in ("tcp", "tls"):
        return  # (inproc://, ucx://: no plain TCP port to try)
    host, port = parse_host_port(location, default_port=8786)
    if (error := connect_error(host, port)) is not None:
        raise UserError(
            f"no Dask scheduler answers at --dask_client_address={address} ({error}).",
            fix=f"start the scheduler (`dask scheduler --port {port}` on {host}, then its workers; see "
            "infra/beam/README.md) or correct --dask_client_address.",
        )


def check_s3_endpoint(options: PipelineOptions, paths: list[str]) -> None:
    """An --s3_endpoint_url for s3:// inputs or outputs must answer: refused in seconds, instead of
    Beam's retries with growing waits (a traceback each, minutes) on a dead address."""
    endpoint = options.get_all_options().get("s3_endpoint_url")
    if not endpoint or not any(str(p).startswith("s3://") for p in paths if p):
        return
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        return  # (boto3 refuses such an endpoint with its own message)
    port = url.port or (443 if url.scheme == "https" else 80)
    if (error := connect_error(url.hostname, port)) is not None:
        raise UserError(
            f"nothing answers at --s3_endpoint_url={endpoint} ({error}), the S3 endpoint for the s3:// "
            "input and output.",
            fix="start the S3 service there, or correct --s3_endpoint_url (leave it out for AWS S3 itself).",
        )


def check_s3_buckets(options: PipelineOptions, paths: list[tuple[str, str]]) -> None:
    """Each bucket an s3:// path names (`paths`: (what the user calls it, the path)) must exist and be
    readable with the job's credentials: refused before the job, naming the setting, instead of 90
    lines of Beam's NoSuchBucket tracebacks from its first upload (a missing output bucket) or 'matches
    no file' (a missing input bucket). Other answers are left to the job to say."""
    from urllib.parse import urlsplit

    from apache_beam.io.aws.clients.s3.boto3_client import Client

    buckets = {urlsplit(p).netloc: (name, p) for name, p in reversed(paths) if p.startswith("s3://")}
    if not buckets:
        return
    from botocore.exceptions import BotoCoreError, ClientError

    client = Client(options).client
    endpoint = options.get_all_options().get("s3_endpoint_url")
    where, cli_endpoint = (endpoint, f" --endpoint-url {endpoint}") if endpoint else ("AWS S3", "")
    for bucket, (name, path) in sorted(buckets.items()):
        try:
            client.head_bucket(Bucket=bucket)
        except BotoCoreError:
            return  # no credentials here (a remote runner's workers may have them), and the like
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404:
                raise UserError(
                    f"{name} {path}: the bucket {bucket!r} does not exist at {where}.",
                    fix=f"create it (`aws s3 mb s3://{bucket}{cli_endpoint}`) or name a bucket that exists.",
                ) from None
            if status == 403:
                raise UserError(
                    f"{name} {path}: the job's credentials may not use the bucket {bucket!r} at {where} "
                    "(403 Forbidden).",
                    fix="pass credentials that may (--s3_access_key_id/--s3_secret_access_key, or the AWS "
                    "environment), or name another bucket.",
                ) from None


def worker_credentials_note(
    options: PipelineOptions, paths: list[str], environ: Mapping[str, str] = os.environ
) -> str | None:
    """A warning when the S3 credentials are only in this driver's environment while the workers of
    a remote runner read and write s3:// themselves: they do not get that environment (names the
    variables, never their values)."""
    settings = options.get_all_options()
    runner = settings["runner"].rsplit(".", 1)[-1]
    found = [name for name in AWS_CREDENTIAL_VARIABLES if environ.get(name)]
    s3 = any(str(p).startswith("s3://") for p in paths if p)
    if runner in LOCAL_RUNNERS or not s3 or not found or settings.get("s3_access_key_id"):
        return None
    return (
        f"the S3 credentials are in this machine's environment ({', '.join(found)}) but not in the "
        f"pipeline options: the {runner} workers read and write s3:// themselves, and a worker without "
        "credentials fails with 'Unable to locate credentials' (after minutes). Pass them as "
        "--s3_access_key_id=... --s3_secret_access_key=... (Beam options travel to every worker), or set "
        "the AWS environment on every worker (an IAM role there needs neither)."
    )


def filesystem_options(options: PipelineOptions) -> dict[str, Any]:
    """The options the workers' filesystems need (all non-default ones: S3/GCS/HDFS settings)."""
    return options.get_all_options(drop_default=True, retain_unknown_options=False)


def run_pipeline(
    files: list[tuple[str, str]],
    tokenizer_json: str,
    vocab: list[str],
    params: ExampleParams,
    spec: MaskingSpec,
    validation_fraction: float,
    num_shards: int,
    num_buckets: int,
    out_dir: str,
    work_dir: str,
    options: PipelineOptions,
) -> tuple[dict[str, int], list[tuple[str, int, dict]]]:
    """Run the job; returns (summed counters, [(split, shard, manifest entry)])."""
    # local worker processes import this package: make sure they can find it
    path = os.environ.get("PYTHONPATH", "")
    if str(PROJECT_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), path) if p)
    fs = filesystem_options(options)
    empty_shards = [(("train", s), "") for s in range(num_shards)] + [(("validation", 0), "")]
    with beam.Pipeline(options=options) as p:
        slices = (
            p
            | "Files" >> beam.Create(files)
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadAndTokenize"
            >> beam.ParDo(
                ReadAndTokenize(tokenizer_json, len(vocab), validation_fraction, num_buckets, work_dir, fs)
            )
        )
        parts = (
            slices
            | "GroupBuckets" >> beam.GroupByKey()
            | "MakeExamples" >> beam.ParDo(MakeExamples(work_dir, params, spec, num_shards, fs))
        )
        every_shard = p | "AllShards" >> beam.Create(empty_shards)
        _ = (
            (parts, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "GroupShards" >> beam.GroupByKey()
            | "MergeShards" >> beam.ParDo(MergeShard(out_dir, work_dir, num_shards, fs))
        )
    client = getattr(p.result, "client", None)  # DaskRunner leaves its dask Client open
    if client is not None:
        client.close()
    stats = _sum_counts(
        storage.read_json(f) for f, _ in storage.match(storage.join(work_dir, STATS_DIR, "*.json"))
    )
    stats["documents_duplicate"] = count_duplicates(
        storage.read_bytes(f) for f, _ in storage.match(storage.join(work_dir, DIGESTS_DIR, "*.bin"))
    )
    entries = [storage.read_json(f) for f, _ in storage.match(storage.join(work_dir, ENTRIES_DIR, "*.json"))]
    return stats, [(e["split"], e["shard"], e["entry"]) for e in entries]
