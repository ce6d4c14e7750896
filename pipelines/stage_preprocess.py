"""Stage 2, `bertflow preprocess`: the Beam job that turns a corpus into pretraining shards.

Output layout and format: preprocessing/shard_format.py. A rerun of a finished output with the
same config, tokenizer and inputs is a no-op; an unfinished or different one is recomputed from
scratch (the marker is removed first, shards are replaced atomically), which gives the same bytes.
Inputs and the output may be local paths or URLs of any filesystem Beam knows (`s3://`, `gs://`,
`hdfs://`): every read and write goes through `preprocessing.storage` (Beam's FileSystems).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from common.atomic import (
    IN_PROGRESS_NAME,
    MARKER_NAME,
    TMP_PREFIX,
    clear_in_progress,
    mark_in_progress,
    temp_target,
)
from common.console import command_logging
from common.dir_lock import exclusive_dir
from common.disk_space import disk_full_error, full_disk_path
from common.errors import TransientError, UserError
from common.stage_output import check_own_output, refuse_foreign_files
from pipelines.preprocess_progress import watch_preprocess
from pipelines.stage_keys import (
    code_change_note,
    flow_input,
    stage_code,
    stage_dirs,
    stage_key_inputs,
    write_stage_key,
)
from preprocessing import storage
from preprocessing.config import PreprocessConfig
from preprocessing.corpus import expand_inputs, file_labels, text_size
from preprocessing.corpus_trouble import corpus_file_warnings, unread_files
from preprocessing.shard_format import MANIFEST_NAME, SCHEMA_VERSION, SPLITS, STATS_NAME, schema_description

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.config import PipelineConfig

log = logging.getLogger("bertflow.preprocess")

PASSES_UNKNOWN_ARGS = True  # leftover flags are Beam pipeline options
WORK_DIR = "_work"
# the bucket parts and the shards a job writes, per byte of corpus text and per dupe_factor: 1.7
# at its peak on wiki_00.gz (1.0 MB of text, max_seq_length 128); rounded up for the message
OUTPUT_BYTES_PER_TEXT_BYTE = 2.0


# what the Beam job raises when one of its worker processes died (kill -9, the OOM killer)
WORKER_DIED = ("Channel closed prematurely", "Worker subprocess exited with return code")


def input_fingerprint(files: list[str]) -> list[dict]:
    """Name, size and sha256 of each input file: the manifest's provenance of the shards (content
    hashes, not the stamps of `common.fingerprint`, because the manifest travels with the shards)."""
    labels = file_labels(files)
    return [{"path": labels[p], "size": storage.size(p), "sha256": storage.sha256(p)} for p in files]


def work_dir_for(out_dir: str, temp_location: str | None) -> str:
    """Where the workers exchange files: under --temp_location when the pipeline declares one
    (a folder of its own per output), else OUTPUT/_work."""
    if temp_location:
        tag = hashlib.sha256(out_dir.encode()).hexdigest()[:12]
        return storage.join(temp_location, f"bertflow-preprocess-{tag}")
    return storage.join(out_dir, WORK_DIR)


_OWN_SPLIT_FILE = re.compile(r"^shard-\d+-of-\d+\.parquet$")


def _refuse_foreign_split_files(out_dir: Path) -> None:
    """A local `--output` whose train/ or validation/ holds files no preprocess run writes (the
    user's own data) is refused before any work: writing the shards clears those folders."""
    for split in SPLITS:
        folder = out_dir / split
        if not folder.is_dir():
            continue
        foreign = sorted(
            p.name for p in folder.iterdir() if not _OWN_SPLIT_FILE.match(temp_target(p.name) or p.name)
        )
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise UserError(
                f"the preprocess output {out_dir} has a {split}/ folder holding files that are not bertflow "
                f"shards ({shown}); preprocess clears {split}/ to write its shards there, so they would be deleted.",
                fix="choose an --output folder of its own (a new or empty one).",
            )


def _clear_outputs(out_dir: str, work_dir: str) -> None:
    storage.delete_tree(storage.join(out_dir, MARKER_NAME))
    for name in (*SPLITS, MANIFEST_NAME, STATS_NAME):
        storage.delete_tree(storage.join(out_dir, name))
    storage.delete_tree(work_dir)
    if storage.exists(out_dir):  # leftovers of its own writes, not a user's `.tmp-*`
        for leftover, _ in storage.match(storage.join(out_dir, TMP_PREFIX + "*")):
            if temp_target(storage.basename(leftover)) in (
                MARKER_NAME,
                IN_PROGRESS_NAME,
                MANIFEST_NAME,
                STATS_NAME,
            ):
                storage.delete_tree(leftover)


def _read_marker(out_dir: str) -> dict | None:
    path = storage.join(out_dir, MARKER_NAME)
    return storage.read_json(path) if storage.exists(path) else None


def _refuse_other_shards(out_dir: str, identity: dict) -> None:
    """Finished shards in `out_dir` made from other settings, tokenizer or corpus are refused
    (`key_change.refuse_replacing`); damaged ones are left to `_finished_stats` to recompute."""
    from pipelines.key_change import refuse_replacing

    if not storage.exists(storage.join(out_dir, MARKER_NAME)):
        return
    try:
        manifest = storage.read_json(storage.join(out_dir, MANIFEST_NAME))
    except (OSError, ValueError):
        return

    def named(made: dict) -> dict:  # the tokenizer and the corpus by name, as a key change says them
        return {
            "config": made.get("config"),
            "tokenizer": [made.get("tokenizer_sha256"), made.get("tokenizer_json_sha256")],
            "inputs": made.get("input_fingerprint"),
            "schema_version": made.get("schema_version"),
        }

    refuse_replacing(out_dir, "preprocess", named(manifest), named(identity))


def _finished_stats(out_dir: str, identity: dict) -> dict | None:
    """stats.json of a complete output made from the same identity with intact shards, else None."""
    if not storage.exists(storage.join(out_dir, MARKER_NAME)):
        return None
    try:
        manifest = storage.read_json(storage.join(out_dir, MANIFEST_NAME))
        if {k: manifest.get(k) for k in identity} != identity:
            log.info("%s holds other shards: recomputing", out_dir)
            return None
        for split in SPLITS:
            for entry in manifest["splits"].get(split, []):
                path = storage.join(out_dir, split, entry["path"])
                if storage.sha256(path) != entry["sha256"]:
                    log.warning("shard %s is corrupt (checksum differs from the manifest): recomputing", path)
                    return None
        return storage.read_json(storage.join(out_dir, STATS_NAME))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s holds damaged shards (%s): recomputing", out_dir, exc)
        return None


def _summarize(counts: dict[str, int], input_bytes: int, seconds: float, entries) -> dict:
    n = counts.get("examples", 0)
    masked = counts.get("masked_positions", 0)
    split_examples = {s: sum(e["num_examples"] for sp, _, e in entries if sp == s) for s in SPLITS}
    return {
        "input_files": counts.get("files_read", 0),
        "input_bytes": input_bytes,
        "documents_read": counts.get("documents_read", 0),
        "documents_used": {s: counts.get(f"documents_{s}", 0) for s in SPLITS},
        "documents_single_sentence": counts.get("documents_single_sentence", 0),
        "skipped": {
            k: v
            for k, v in sorted(counts.items())
            if k.startswith(("documents_skipped", "files_", "lines_", "jsonl_", "docs_"))
            and k != "files_read"
        },
        "documents_duplicate": counts.get("documents_duplicate", 0),
        "sentences": counts.get("sentences", 0),
        "tokens": counts.get("tokens", 0),
        "unk_token_ratio": counts.get("tokens_unk", 0) / counts["tokens"] if counts.get("tokens") else None,
        "examples": n,
        "examples_per_split": split_examples,
        "is_next_ratio": counts.get("examples_is_next", 0) / n if n else None,
        "mean_tokens_per_example": counts.get("tokens_in_examples", 0) / n if n else None,
        "mean_masked_per_example": masked / n if n else None,
        "masked_replacement_split": {
            "mask_token": counts.get("masked_as_mask_token", 0) / masked if masked else None,
            "random_token": counts.get("masked_as_random_token", 0) / masked if masked else None,
            "unchanged": counts.get("masked_kept_original", 0) / masked if masked else None,
        },
        "seconds": round(seconds, 2),
        "mb_per_second": round(input_bytes / 2**20 / seconds, 3) if seconds > 0 else None,
    }


# how far the IsNext share may stray from the configured balance (0.5) before it is flagged
NSP_RATIO_TOLERANCE = 0.1
UNK_RATIO_WARN = 0.05


def _documents(n: int | None) -> str:
    """'1 document', 'N documents'."""
    return f"{n} document{'' if n == 1 else 's'}"


def data_warnings(stats: dict, cfg: PreprocessConfig) -> list[str]:
    """Statistics that make pretraining on these shards meaningless or misleading, each one line
    (stats.json `warnings`, logged loudly, and shown in the report)."""
    found = []
    unk = stats.get("unk_token_ratio")
    if unk is not None and unk > UNK_RATIO_WARN:
        found.append(
            f"{unk:.1%} of the tokens are [UNK]: the vocabulary does not cover this corpus (train the "
            "tokenizer on it, or check the lowercase setting)."
        )
    ratio = stats.get("is_next_ratio")
    if ratio is not None and abs(ratio - 0.5) > NSP_RATIO_TOLERANCE:
        found.append(
            f"the IsNext share is {ratio:.3f}, far from the 0.5 balance: next-sentence prediction learns "
            "the imbalance (documents too short for max_seq_length, or too few documents / sentences)."
        )
    if cfg.validation_fraction > 0 and not stats.get("examples_per_split", {}).get("validation"):
        found.append(
            f"the validation split is empty (validation_fraction {cfg.validation_fraction}, "
            f"{_documents(stats.get('documents_read'))}): pretraining will report no validation metrics."
        )
    elif stats.get("documents_used", {}).get("validation") == 1:  # (an empty split says so above)
        found.append(
            f"the validation split holds one document (validation_fraction {cfg.validation_fraction}): its "
            "NotNext pairs need a second document, so all its examples are IsNext and held-out NSP accuracy "
            "says nothing (raise validation_fraction)."
        )
    duplicate = stats.get("documents_duplicate", 0)
    if duplicate:
        found.append(
            f"{duplicate} of {stats.get('documents_read')} documents repeat an earlier document's text "
            "(kept: deduplicate the corpus if they are not meant to weigh more)."
        )
    return found


# expected examples per shard that leave practically no shard empty (examples go to shards by a hash)
EXAMPLES_PER_SHARD_HINT = 10


def empty_shard_warnings(entries: list[tuple[str, int, dict]], cfg: PreprocessConfig) -> list[str]:
    """Training shards written without an example (num_shards above what the corpus fills), one
    line for stats.json `warnings`. The empty validation split has its own (data_warnings)."""
    train = [e["num_examples"] for split, _, e in entries if split == "train"]
    empty = train.count(0)
    if not empty:
        return []
    suggested = max(1, sum(train) // EXAMPLES_PER_SHARD_HINT)
    return [
        f"{empty} of the {len(train)} training shards are empty: preprocess.num_shards {cfg.num_shards} is "
        f"too many for {sum(train)} training examples (each example goes to a shard by a hash). Fix: use "
        f"fewer shards, e.g. --num-shards {suggested} (preprocess.num_shards: {suggested})."
    ]


def check_preprocess_settings(cfg: PreprocessConfig, beam_args: list[str] | None = None) -> PipelineOptions:
    """Settings the job cannot run with, refused before it reads anything (and by `bertflow run`
    before its first stage): more predictions than maskable tokens, an unknown runner or Beam
    option. Returns the job's Beam options."""
    from preprocessing.beam_job import pipeline_options

    if cfg.max_predictions_per_seq > cfg.max_seq_length - 3:
        raise UserError(
            f"preprocess.max_predictions_per_seq={cfg.max_predictions_per_seq} exceeds the "
            f"{cfg.max_seq_length - 3} maskable tokens of max_seq_length={cfg.max_seq_length}.",
            fix=f"set it to at most {cfg.max_seq_length - 3}; about max_seq_length × masked_lm_prob positions "
            f"are masked ({math.ceil(cfg.max_seq_length * cfg.masked_lm_prob)} here; BERT used 20 at 128 and "
            "80 at 512).",
        )
    return pipeline_options(cfg.runner, cfg.workers, [*cfg.beam_options, *(beam_args or [])])


def nothing_to_predict(stats: dict, files: list[str], tokenizer_path: Path) -> UserError:
    """Shards in which no example has a masked position give masked-LM pretraining nothing to learn
    (its loss is NaN at the first step): [UNK] is never chosen for prediction."""
    unk = stats.get("unk_token_ratio")
    share = (
        f"{unk:.1%} of its {stats.get('tokens')} tokens are [UNK]" if unk is not None else "it has no tokens"
    )
    return UserError(
        f"the corpus {', '.join(map(str, files))} gives no masked-LM target with the vocabulary "
        f"{tokenizer_path}: {share}, and [UNK] is never chosen for prediction, so none of the "
        f"{stats.get('examples')} examples has a masked position and pretraining would have nothing to "
        "learn; the vocabulary does not fit the corpus. No shards were written.",
        fix="train the tokenizer on this corpus (bertflow tokenizer --input CORPUS) or pass a vocabulary "
        "that covers it (check the lowercase setting).",
    )


def shard_identity(cfg: PreprocessConfig, files: list[str], tokenizer_json: str, vocab: list[str]) -> dict:
    """What determines the shards, recorded in the manifest; a finished output with another
    identity is rebuilt."""
    from preprocessing.wordpiece import vocabulary_sha256

    return {
        "schema_version": SCHEMA_VERSION,
        "config": cfg.output_settings(),  # how the job runs (workers, runner) is not in the manifest
        # the vocabulary decides the ids: its hash equals the sha256 of a vocab.txt holding it, so
        # pretraining can match the shards to a tokenizer dir however preprocess was given it
        "tokenizer_sha256": vocabulary_sha256(vocab),
        "tokenizer_json_sha256": hashlib.sha256(tokenizer_json.encode()).hexdigest(),
        "input_fingerprint": input_fingerprint(files),
    }


def run_preprocess_stage(
    cfg: PreprocessConfig,
    tokenizer_path: Path,
    out_dir: Path | str,
    data_root: str | None = None,
    beam_args: list[str] | None = None,
    replace: bool = True,
    flow: PipelineConfig | None = None,
) -> dict:
    """Write the shard directory `out_dir` (a local path or a URL); returns the stats (also in
    stats.json). `replace` False (an --output the user named): finished shards of other settings,
    tokenizer or corpus there are refused, not recomputed over. `flow`: the config whose flow writes `out_dir`, whose command the note on an output of other
    code names (a stage command's flags among its --set items: `PipelineConfig.with_section`);
    None: a folder of the user's (--output), which the note says to delete and make again with the
    same command."""
    from preprocessing.wordpiece import load_tokenizer, vocab_list

    out_dir = str(out_dir)
    local = not storage.is_remote(out_dir)  # an object store has no locks: one writer is up to the user
    if local:
        check_own_output(out_dir, "preprocess", {"tokenizer": Path(tokenizer_path)})
        _refuse_foreign_split_files(Path(out_dir))
        refuse_foreign_files(out_dir, "preprocess", (MANIFEST_NAME, STATS_NAME, WORK_DIR))
    options = _job_options(cfg, beam_args, out_dir)
    files = _corpus_files(cfg, data_root)
    tok, _ = load_tokenizer(tokenizer_path)
    tokenizer_json, vocab = tok.to_str(), vocab_list(tok)
    identity = shard_identity(cfg, files, tokenizer_json, vocab)
    if not replace:
        _refuse_other_shards(out_dir, identity)
    stats = _finished_stats(out_dir, identity)
    if stats is not None:
        log.info("shards in %s are up to date", out_dir)
        own = None if flow else out_dir
        if note := code_change_note("preprocess", [out_dir], read=_read_marker, cfg=flow, own_output=own):
            log.warning(note)
        return stats
    work_dir = work_dir_for(out_dir, options.get_all_options()["temp_location"])
    with exclusive_dir(out_dir, "preprocess") if local else nullcontext():
        if local:  # a killed run's files are its own to rewrite, not the user's (`refuse_foreign_files`)
            mark_in_progress(out_dir)
        _clear_outputs(out_dir, work_dir)
        # fail here, not in a worker, when the output or the work folder cannot be written
        if local:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
        storage.write_json(storage.join(work_dir, "job.json"), {"output": out_dir, "inputs": len(files)})
        input_bytes = sum(text_size(p) for p in files)
        num_buckets = max(1, math.ceil(input_bytes / (cfg.bucket_size_mb * 2**20)))
        counts, entries, seconds = _run_job(
            cfg, files, input_bytes, num_buckets, tokenizer_json, vocab, out_dir, work_dir, options
        )
        stats = _summarize(counts, input_bytes, seconds, entries)
        try:
            _refuse_useless_output(counts, stats, files, tokenizer_path)
        except UserError:
            _clear_outputs(out_dir, work_dir)
            raise
        labels = {str(p): label for p, label in file_labels(files).items()}
        # the files of which no text was read, named as the manifest names the inputs
        stats["files_skipped"] = [labels.get(p, p) for p in unread_files(counts)]
        stats["warnings"] = (
            data_warnings(stats, cfg) + empty_shard_warnings(entries, cfg) + corpus_file_warnings(counts)
        )
        for line in stats["warnings"]:
            log.warning("%s: %s", out_dir, line)
        _write_outputs(out_dir, work_dir, identity, stats, entries, num_buckets)
        if local:
            clear_in_progress(out_dir)
        log.info(
            "wrote %d examples (%s) to %s in %.1f s (%.2f MB/s)",
            stats["examples"], stats["examples_per_split"], out_dir, seconds, stats["mb_per_second"] or 0,
        )  # fmt: skip
        return stats


def _job_options(cfg: PreprocessConfig, beam_args: list[str] | None, out_dir: str) -> PipelineOptions:
    """The Beam job's options, checked (settings, Dask scheduler, S3 endpoint) and used for the
    driver's own reads and writes; warns when the workers may lack the credentials to read the paths."""
    from preprocessing.beam_job import (
        check_dask_scheduler,
        check_s3_buckets,
        check_s3_endpoint,
        worker_credentials_note,
    )

    options = check_preprocess_settings(cfg, beam_args)
    temp_location = options.get_all_options()["temp_location"]
    paths = [*cfg.input, out_dir, temp_location]
    if note := worker_credentials_note(options, paths):
        log.warning(note)
    check_dask_scheduler(options)
    check_s3_endpoint(options, paths)
    named = [
        *(("input", p) for p in cfg.input),
        ("output", out_dir),
        ("--temp_location", temp_location or ""),
    ]
    check_s3_buckets(options, named)
    storage.use_options(options)  # the driver's own reads and writes (S3 endpoint, credentials)
    return options


def _corpus_files(cfg: PreprocessConfig, data_root: str | None) -> list[str]:
    """The input files `preprocess.input` names; a UserError when every one of them is empty."""
    files = [str(p) for p in expand_inputs(cfg.input, data_root, remote_ok=True)]
    if all(storage.size(p) == 0 for p in files):
        raise UserError(
            f"the corpus is empty: every input file is 0 bytes ({', '.join(map(str, files))}).",
            fix="check --input / preprocess.input.",
        )
    return files


def _run_job(
    cfg: PreprocessConfig,
    files: list[str],
    input_bytes: int,
    num_buckets: int,
    tokenizer_json: str,
    vocab: list[str],
    out_dir: str,
    work_dir: str,
    options: PipelineOptions,
) -> tuple[dict[str, int], list[tuple[str, int, dict]], float]:
    """The Beam job: its counters, the written shards' (split, index, entry) and its seconds; a
    full disk anywhere in it is said with the space the job needs."""
    from common.temp_dir import own_temp_dir
    from preprocessing.beam_job import run_pipeline
    from preprocessing.examples import ExampleParams
    from preprocessing.masking import MaskingSpec
    from preprocessing.wordpiece import SPECIAL_TOKENS

    params = ExampleParams(
        cfg.max_seq_length, cfg.short_seq_prob, cfg.dupe_factor, cfg.seed, vocab.index("[CLS]"), vocab.index("[SEP]"),
        cfg.balance_nsp,
    )  # fmt: skip
    spec = MaskingSpec.from_vocab(
        vocab, SPECIAL_TOKENS, cfg.masked_lm_prob, cfg.max_predictions_per_seq, cfg.whole_word_mask
    )
    labels = file_labels(files)
    log.info(
        "preprocess: %d file(s), %.1f MB of text, %d bucket(s), %d shard(s), runner %s",
        len(files), input_bytes / 2**20, num_buckets, cfg.num_shards, options.get_all_options()["runner"],
    )  # fmt: skip
    start = time.perf_counter()
    try:
        with (
            watch_preprocess(work_dir, out_dir, len(files), cfg.num_shards + 1, log.info),
            own_temp_dir("bertflow-beam-job-"),
        ):
            counts, entries = run_pipeline(
                [(str(p), labels[p]) for p in files], tokenizer_json, vocab, params, spec,
                cfg.validation_fraction, cfg.num_shards, num_buckets, out_dir, work_dir, options,
            )  # fmt: skip
        return counts, entries, time.perf_counter() - start
    except Exception as exc:  # a Beam worker's error arrives as text in a RuntimeError
        if (full := full_disk_path(exc)) is None:
            if any(text in str(exc) for text in WORKER_DIED):
                raise TransientError(
                    "a Beam worker process died (killed, or out of memory: the kernel's OOM killer) and the job "
                    f"stopped ({exc}); nothing is complete in {out_dir}.",
                    fix="rerun the same command (the job starts over); if memory ran out, lower preprocess.workers.",
                ) from None
            raise
        needed = OUTPUT_BYTES_PER_TEXT_BYTE * input_bytes * cfg.dupe_factor
        raise disk_full_error(full or out_dir, needed, "this preprocess job") from None


def _refuse_useless_output(
    counts: dict[str, int], stats: dict, files: list[str], tokenizer_path: Path
) -> None:
    """A job that read no document, made no example or masked no position is refused: its shards
    would train nothing."""
    if counts.get("documents_read", 0) == 0:
        raise UserError(
            f"the corpus has no documents: {', '.join(map(str, files))} (skipped: "
            f"{ {k: v for k, v in counts.items() if k != 'files_read' and ':' not in k} }).",
            fix=" ".join(corpus_file_warnings(counts, empty=False))
            or "check preprocess.input (--input): plain text needs non-empty lines, WikiExtractor files "
            "<doc> blocks, JSONL a 'text' field.",
        )
    if counts.get("examples", 0) == 0:
        raise UserError(
            f"the corpus {', '.join(map(str, files))} gave no examples ({_documents(counts.get('documents_read'))}).",
            fix="next-sentence pairs need documents with at least two sentences, or at least two documents.",
        )
    if counts.get("masked_positions", 0) == 0:
        raise nothing_to_predict(stats, files, tokenizer_path)


def _write_outputs(
    out_dir: str,
    work_dir: str,
    identity: dict,
    stats: dict,
    entries: list[tuple[str, int, dict]],
    num_buckets: int,
) -> None:
    """stats.json, manifest.json (the shards of each split in order), the work folder removed,
    and the completion marker last."""
    splits = {s: [e for sp, _, e in sorted(entries, key=lambda x: (x[0], x[1])) if sp == s] for s in SPLITS}
    manifest = {**identity, "schema": schema_description(), "num_buckets": num_buckets, "splits": splits}
    storage.write_json(storage.join(out_dir, STATS_NAME), stats)
    storage.write_json(storage.join(out_dir, MANIFEST_NAME), manifest)
    storage.delete_tree(work_dir)
    storage.write_json(
        storage.join(out_dir, MARKER_NAME),
        {"stage": "preprocess", "examples": stats["examples"], "code": stage_code("preprocess")},
    )  # last


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines.config import add_set_argument

    parser.epilog = (
        "Any other --flag=value is passed to Beam as a pipeline option, e.g. "
        "--runner FlinkRunner --flink_master=host:8081 (see infra/beam/)."
    )
    parser.add_argument("config", nargs="?", help="pipeline YAML (section `preprocess:`)")
    parser.add_argument(
        "--phase", help="the shards of this phase of the config's phases: (default: the main ones)"
    )
    parser.add_argument("--input", action="append", help="corpus file or glob (repeatable)")
    parser.add_argument(
        "--vocab",
        help="vocab.txt, tokenizer.json or tokenizer dir (default: RUN_DIR/tokenizer/KEY, as in the flow)",
    )
    parser.add_argument("--output", help="shard directory (default: RUN_DIR/preprocess/KEY, as in the flow)")
    parser.add_argument(
        "--max-seq-length",
        type=int,
        help="tokens per example incl. [CLS]/[SEP] (= preprocess.max_seq_length)",
    )
    parser.add_argument(
        "--max-predictions-per-seq",
        type=int,
        help="cap on masked positions per example (default: 20 per 128 tokens of --max-seq-length)",
    )
    parser.add_argument(
        "--dupe-factor",
        type=int,
        help="passes over the corpus with different masks (= preprocess.dupe_factor)",
    )
    parser.add_argument(
        "--num-shards", type=int, help="Parquet shards of the train split (= preprocess.num_shards)"
    )
    parser.add_argument("--workers", type=int, help="local worker processes (DirectRunner)")
    parser.add_argument("--seed", type=int, help="seed of pairing and masking (= preprocess.seed)")
    parser.add_argument(
        "--whole-word-mask",
        action="store_true",
        help="mask every piece of a word together (= preprocess.whole_word_mask)",
    )
    parser.add_argument(
        "--runner", help="Beam runner (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner)"
    )
    add_set_argument(parser, dest="set")


def refuse_misread_config(args: argparse.Namespace) -> None:
    """Unknown flags pass to Beam, so the value of a mistyped one (`--tokenizer DIR`, written apart)
    became the CONFIG argument, and the error was about a config file the user never gave ('config
    file DIR is a folder', 'vocab.txt is not valid YAML'). Called when the config fails to load:
    says the flag instead."""
    from preprocessing.beam_job import unknown_beam_options

    bare = [flag for flag in unknown_beam_options(list(args.extra_args or [])) if "=" not in flag]
    if args.config and bare:
        raise UserError(
            f"unknown option {bare[-1]}: neither a bertflow preprocess flag nor a Beam pipeline option, so "
            f"the word after it, {args.config}, was read as the CONFIG argument.",
            fix="check the spelling (`bertflow preprocess --help`; the tokenizer is --vocab DIR; Beam "
            "options are --name=value).",
        ) from None


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from pipelines.config import load_config, section_flag_error

    command_logging()
    try:
        cfg = load_config(args.config, args.set)
    except UserError:
        refuse_misread_config(args)
        raise
    cfg = cfg.phase_config(cfg.phase_index(args.phase))  # the phase's shards (default: the main ones)
    section = cfg.preprocess.model_dump()
    flags = {
        "input": args.input,
        "max_seq_length": args.max_seq_length,
        "max_predictions_per_seq": args.max_predictions_per_seq,
        "dupe_factor": args.dupe_factor,
        "num_shards": args.num_shards,
        "workers": args.workers,
        "seed": args.seed,
        "runner": args.runner,
        "whole_word_mask": True if args.whole_word_mask else None,
    }
    section.update({k: v for k, v in flags.items() if v is not None})
    if args.max_seq_length and args.max_predictions_per_seq is None:
        section["max_predictions_per_seq"] = math.ceil(args.max_seq_length * 20 / 128)  # 20 at 128, 80 at 512
    try:
        pcfg = PreprocessConfig.model_validate(section)
    except ValidationError as exc:
        given = {k: v for k, v in flags.items() if v is not None}
        raise section_flag_error(exc, "preprocess", given, cfg.preprocess.model_dump()) from None
    if not cfg.pretrain.init_from:  # as `bertflow run` checks it: not after hours of Beam, at pretraining
        from pipelines.stage_pretrain import check_positions

        check_positions(cfg.model_copy(update={"preprocess": pcfg}))
    # defaults: where the flow puts the tokenizer and the shards for this config (pipelines.stage_keys)

    flow_cfg = cfg.with_section("preprocess", pcfg)  # the flags as --set items of its flow command
    flow = stage_dirs(flow_cfg)
    vocab = Path(args.vocab) if args.vocab else flow_input(cfg, flow["tokenizer"], "tokenizer", "--vocab")
    if args.vocab and not args.output and vocab.resolve() != flow["tokenizer"].resolve():
        # the flow's shard directory is keyed by the flow's own tokenizer
        raise UserError(
            "--vocab other than the flow's tokenizer for this config needs --output: the flow's shard "
            f"directory ({flow['preprocess']}) holds shards of its own tokenizer.",
            fix="add --output DIR.",
        )
    out = (
        (args.output if storage.is_remote(args.output) else Path(args.output))
        if args.output
        else flow["preprocess"]
    )
    from pipelines.beam_console import beam_log_path, quiet_beam

    with quiet_beam(beam_log_path(out)):
        flow_of_out = None if args.output else flow_cfg  # whose flow command recomputes the folder
        stats = run_preprocess_stage(
            pcfg, vocab, out, cfg.data_root, list(args.extra_args or []), not args.output, flow_of_out
        )
    if not args.output:
        write_stage_key(out, stage_key_inputs(flow_cfg)["preprocess"])
    print(f"{out}: {stats['examples']} examples, IsNext ratio {stats['is_next_ratio']:.3f}")
    return 0
