"""Every check that can fail on user input, run before a process is launched or a file is written.

Shards (present, our schema, token ids inside the vocabulary, made with this tokenizer), the
tokenizer dir, the model shape, the DeepSpeed JSON against the CLI, and any checkpoint already in
the output dir (same model shape, same world size and batch). The result is the run spec that the
per-rank script reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from common.atomic import MARKER_NAME, sha256_file
from common.errors import UserError
from common.textfile import read_user_text
from common.tracking import WandbTarget
from model.config import BertConfig
from preprocessing import shard_format
from preprocessing.wordpiece import SPECIAL_TOKENS
from training import checkpoint
from training.data import require_one_global_batch
from training.ds_config import build_ds_config
from training.run_spec import MaskingSettings, RunSpec

SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


def read_vocab(tokenizer_dir: Path) -> list[str]:
    path = tokenizer_dir / "vocab.txt"
    if not path.is_file():
        what = "has no vocab.txt" if tokenizer_dir.is_dir() else "does not exist"
        raise UserError(
            f"tokenizer directory {tokenizer_dir} {what}.",
            fix="pass the output dir of `bertflow tokenizer` (or an HF model dir with vocab.txt).",
        )
    vocab = read_user_text(path, "vocabulary").splitlines()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(
            f"{path} lacks the special token{'' if len(missing) == 1 else 's'} {', '.join(missing)}.",
            fix="retrain the tokenizer.",
        )
    return vocab


def tokenizer_hashes(tokenizer_dir: Path) -> set[str]:
    """sha256 of vocab.txt (and of tokenizer.json): a manifest may record either."""
    return {
        sha256_file(tokenizer_dir / n)
        for n in ("vocab.txt", "tokenizer.json")
        if (tokenizer_dir / n).is_file()
    }


def vocabulary_hash(tokenizer_dir: Path) -> str:
    """The vocabulary of `tokenizer_dir` as preprocess records it in the manifest (tokenizer_sha256,
    `vocabulary_sha256`): the same for the same tokens and ids whatever bytes hold them
    (transformers' save_pretrained rewrites the files, and may write only tokenizer.json). A folder
    whose vocab.txt and tokenizer.json disagree is refused by `load_tokenizer`."""
    from preprocessing.wordpiece import load_tokenizer, vocab_list, vocabulary_sha256

    return vocabulary_sha256(vocab_list(load_tokenizer(tokenizer_dir)[0]))


def _column_max(meta: pq.FileMetaData, column: str) -> int | None:
    """Max of a list<int> column from Parquet row-group statistics (None if not recorded)."""
    best = None
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for c in range(group.num_columns):
            col = group.column(c)
            if col.path_in_schema.split(".")[0] != column:
                continue
            st = col.statistics
            if st is None or not st.has_min_max:
                return None
            best = st.max if best is None else max(best, st.max)
    return best


def _column_values(meta: pq.FileMetaData, column: str) -> int | None:
    """How many values a list<int> column holds in all, from row-group statistics (None if not
    recorded): 0 when every row's list is empty."""
    total = 0
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for c in range(group.num_columns):
            col = group.column(c)
            if col.path_in_schema.split(".")[0] == column:
                if col.statistics is None:
                    return None
                total += col.statistics.num_values
    return total


def require_mlm_targets(shards_dir: Path, train: list[pq.FileMetaData]) -> None:
    """Refuse a training split without a single masked position: its masked-LM loss is 0/0, NaN at
    the first step (a vocabulary that makes every token [UNK], which is never chosen for
    prediction). Read from the shards' Parquet statistics, so no example is loaded."""
    counts = [_column_values(meta, "masked_lm_positions") for meta in train]
    if not train or any(c is None or c > 0 for c in counts):
        return
    examples = sum(meta.num_rows for meta in train)
    raise UserError(
        f"the training split of {shards_dir} has no masked-LM targets: none of its {examples} examples "
        "has a masked position, so the masked-LM loss is undefined (NaN at the first step). [UNK] is "
        "never chosen for prediction, so a vocabulary that does not fit the corpus leaves nothing to predict "
        f"({shards_dir / shard_format.STATS_NAME} gives the [UNK] share, unk_token_ratio).",
        fix="preprocess again with a vocabulary that covers the corpus (train the tokenizer on it with "
        "`bertflow tokenizer --input CORPUS`, or check the lowercase setting).",
    )


def check_shards(
    shards_dir: Path,
    tokenizer_dir: Path,
    vocab_size: int,
    fix: str = "pass the tokenizer the shards were preprocessed with, or preprocess again with this one.",
) -> dict[str, Any]:
    """The shards' manifest, once they are readable, of our schema, made with the vocabulary of
    `tokenizer_dir` and within `vocab_size`; `fix`: the advice when the vocabulary differs."""
    manifest = shard_format.read_manifest(shards_dir)
    recorded = manifest.get("tokenizer_sha256")
    if recorded is None:
        raise UserError(
            f"{shards_dir / shard_format.MANIFEST_NAME} records no tokenizer_sha256, so the shards "
            "cannot be matched to a vocabulary.",
            fix="rerun preprocess with this version of bertflow.",
        )
    # the same bytes, or else the same tokens and ids in every tokenizer file
    if recorded not in tokenizer_hashes(tokenizer_dir) and vocabulary_hash(tokenizer_dir) != recorded:
        raise UserError(
            f"the shards in {shards_dir} were made with a different tokenizer than {tokenizer_dir}: its "
            f"vocabulary (tokens and their ids) differs from the one the manifest records (tokenizer_sha256 "
            f"{recorded[:12]}…).",
            fix=fix,
        )
    paths = shard_format.shard_paths(shards_dir, "train", verify=False)
    if not paths:
        raise UserError(f"{shards_dir / shard_format.MANIFEST_NAME} lists no train shards.")
    train_meta = []
    for split in shard_format.SPLITS:
        for p in (
            shard_format.shard_paths(shards_dir, split, verify=False)
            if split in manifest.get("splits", {})
            else []
        ):
            try:
                f = pq.ParquetFile(p)
            except Exception as exc:
                raise UserError(
                    f"cannot read shard {p}: {exc}", fix=f"delete {shards_dir} and rerun preprocess."
                ) from None
            if not f.schema_arrow.equals(shard_format.SCHEMA, check_metadata=False):
                raise UserError(
                    f"shard {p} does not have the bertflow example schema: {f.schema_arrow}",
                    fix=f"delete {shards_dir} and rerun preprocess with this version of bertflow.",
                )
            for column in ("input_ids", "masked_lm_ids"):
                top = _column_max(f.metadata, column)
                if top is not None and top >= vocab_size:
                    raise UserError(
                        f"shard {p} holds token id {top} in {column}, but the vocabulary of "
                        f"{tokenizer_dir} has only {vocab_size} entries.",
                        fix="pretrain with the tokenizer the shards were made with.",
                    )
            if split == "train":
                train_meta.append(f.metadata)
    require_mlm_targets(shards_dir, train_meta)
    return manifest


def check_init_from(init_from: str) -> Path:
    """`pretrain.init_from` must be an existing model directory (checked before any stage runs)."""
    init_dir = Path(init_from)
    if not (init_dir / "config.json").is_file():
        raise UserError(
            f"pretrain.init_from {init_dir} does not exist"
            + (" as a model directory (no config.json)." if init_dir.is_dir() else "."),
            fix="point it to a model directory (a run's RUN_DIR/latest/model), or train the earlier "
            "phase in the same flow with a phases: section (README, Pretraining).",
        )
    return init_dir


def shorter_init_length(init_from: str | None, seq: int | None) -> int | None:
    """The length `init_from` was trained at, if it is shorter than the shards' `seq` (phase 1 at
    32 tokens, phase 2 at 128; or 128, then 512); else None."""
    if not init_from or not isinstance(seq, int):
        return None
    from model.model_dir import trained_length

    trained = trained_length(Path(init_from))
    return trained if trained is not None and trained < seq else None


def own_tokenizer_fix(init_dir: Path, cfg: Any) -> str:
    """How to pretrain `init_dir` with its own tokenizer: the shards hold the token ids of the
    tokenizer that made them, so they are made again with it; in the flow, `tokenizer.vocab` does
    that (the tokenizer and preprocess stages are keyed by the vocabulary and run again). `cfg`:
    the pipeline config (pipelines/config.py) of the phase that starts from `init_dir` (its
    `phase_config`), whose stage commands the fix names, with `--phase NAME` for a phase's."""
    from model.hf_io import TOKENIZER_FILES

    own = next((init_dir / n for n in TOKENIZER_FILES if (init_dir / n).is_file()), None)
    if own is None:
        return (
            f"pretrain with the tokenizer {init_dir} was trained with (for a phase, the tokenizer of the "
            "phase before), and shards made with it: it has no vocab.txt or tokenizer.json to name."
        )
    phase = cfg.phase_flag()
    return (
        "pretrain with init_from's own tokenizer, on shards made with it (shards hold the token ids "
        f"of the tokenizer that made them): in the flow (`bertflow run`), set tokenizer.vocab: {own}, "
        "and its tokenizer and preprocess stages run again for that vocabulary; with the stage commands, "
        f"`{cfg.command_line('preprocess', *phase, '--vocab', str(init_dir), '--output', 'NEW_SHARDS')}`, "
        f"then `{cfg.command_line('pretrain', *phase, '--tokenizer', str(init_dir), '--shards', 'NEW_SHARDS', '--output', 'OUT')}`."
    )


def check_init_vocabulary(init_dir: Path, tokenizer: Path, cfg: Any, lowercase: bool | None = None) -> None:
    """The rows of init_from's embeddings are the ids of its own vocabulary: a tokenizer with other
    tokens, the same ones in another order, or another casing would train them on the wrong words.
    `cfg`: the config of the phase that starts from `init_dir` (`own_tokenizer_fix`); `lowercase`: the casing `tokenizer` is read with (a bare vocab.txt:
    tokenizer.lowercase)."""
    from model.hf_io import has_tokenizer, read_config, tokenizer_fit_problem, tokenizer_size
    from preprocessing.wordpiece import tokenizer_difference

    if (
        has_tokenizer(init_dir)
        and (init_dir / "config.json").is_file()
        and (problem := tokenizer_fit_problem(tokenizer_size(init_dir), read_config(init_dir).vocab_size))
    ):  # its own tokenizer is not the one to train it with either (a truncated vocab.txt)
        raise UserError(
            f"pretrain.init_from {init_dir}: its own tokenizer does not fit its weights: {problem}.",
            fix=f"put the tokenizer it was trained with into {init_dir} (or import it again with `bertflow import-hf`).",
        )
    differs = (
        tokenizer_difference(init_dir, tokenizer, "pretrain.init_from", "tokenizer", lowercase)
        if has_tokenizer(init_dir)
        else None
    )
    if differs is not None:
        raise UserError(
            f"pretrain.init_from {init_dir} was trained with another vocabulary than {tokenizer} "
            f"({differs}): its embeddings would be read as the wrong tokens.",
            fix=own_tokenizer_fix(init_dir, cfg),
        )


def model_config(cfg, vocab: list[str], tokenizer_dir: Path) -> BertConfig:
    m = cfg.model
    if cfg.pretrain.init_from:
        from model.hf_io import read_config

        init_dir = check_init_from(cfg.pretrain.init_from)
        base = read_config(init_dir)
        if base.vocab_size != len(vocab):
            raise UserError(
                f"pretrain.init_from {init_dir} has vocab_size {base.vocab_size}, the tokenizer "
                f"{tokenizer_dir} has {len(vocab)}.",
                fix=own_tokenizer_fix(init_dir, cfg),
            )
        check_init_vocabulary(init_dir, tokenizer_dir, cfg)
        check_init_shape(m, base, init_dir)
        base.hidden_dropout_prob = m.hidden_dropout_prob
        base.attention_probs_dropout_prob = m.attention_probs_dropout_prob
        return base
    return BertConfig.from_preset(
        m.preset,
        vocab_size=len(vocab),
        hidden_dropout_prob=m.hidden_dropout_prob,
        attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings,
    )


def check_init_shape(m: Any, base: BertConfig, init_dir: Path) -> None:
    """With `pretrain.init_from` the model is that checkpoint's; a `model:` setting given
    explicitly that describes another shape is refused (it would be recorded but not trained)."""
    given = m.model_fields_set
    wanted: dict[str, Any] = {}
    if m.preset is not None and "preset" in given:
        preset = BertConfig.from_preset(m.preset).to_hf_dict()
        wanted.update(
            {k: preset[k] for k in SHAPE_KEYS if k not in ("vocab_size", "max_position_embeddings")}
        )
    if "max_position_embeddings" in given:
        wanted["max_position_embeddings"] = m.max_position_embeddings
    actual = base.to_hf_dict()
    differ = {k: v for k, v in wanted.items() if actual[k] != v}
    if differ:
        detail = ", ".join(f"{k} {v} vs {actual[k]}" for k, v in differ.items())
        from_preset = set(differ) - {"max_position_embeddings"}
        source = f"model.preset {m.preset!r}" if from_preset else "model.max_position_embeddings"
        raise UserError(
            f"{source} describes another model than pretrain.init_from {init_dir} ({detail}); "
            "the run would train init_from's shape while its record names the other.",
            fix="drop model.preset / model.max_position_embeddings (or set model.preset: null) to take "
            "init_from's shape, or point init_from to a model of that shape.",
        )


def check_resume(spec: RunSpec) -> None:
    """A checkpoint in the output dir is resumed only by the run that wrote it: the same world size
    and global batch, and the same settings (`RunSpec.settings`: everything that decides the
    weights). Anything else is refused, naming each differing key, before a process starts; a
    resume never silently keeps the checkpoint's optimizer and schedule under new settings. The
    checkpoints a finished run keeps are no resume's: its marker decides (`_finished_model` of
    pipelines/stage_pretrain.py reuses it or refuses it as a finished run)."""
    if (spec.out_dir / MARKER_NAME).is_file():
        return
    for tag in checkpoint.tag_dirs(spec.checkpoints_dir):
        info = checkpoint.read_verification(tag)
        if info is None:
            continue
        world, global_batch = spec.world_size, spec.ds_config["train_batch_size"]
        if info.get("world_size") != world or info.get("global_batch") != global_batch:
            raise UserError(
                f"checkpoint {tag} was written by {_processes(info.get('world_size'))} with global batch "
                f"{info.get('global_batch')}; this run has {_processes(world)} and global batch {global_batch}. "
                "ZeRO partitions and the data position cannot be carried over.",
                fix="resume with the same number of processes (pretrain.num_processes x pretrain.nnodes) and "
                "batch settings; or continue on the new size from its weights: `bertflow export-hf "
                f"{spec.out_dir} DIR`, then a new --output with --set pretrain.init_from=DIR (fresh optimizer).",
            )
        recorded = info.get("settings") or _recorded_settings(spec.out_dir)
        if recorded is not None:
            differences = spec.differences(recorded)
        else:  # a checkpoint of an older bertflow: only its model shape is known
            old = info.get("model_config", {})
            differences = [
                f"model.{k}: {old.get(k)!r} -> {spec.model.get(k)!r}"
                for k in SHAPE_KEYS
                if old.get(k) != spec.model.get(k)
            ]
        if differences:
            raise UserError(
                f"{spec.out_dir} holds checkpoint {tag.name} of a run with other settings: {'; '.join(differences)}. "
                "A resume would carry on its optimizer state, schedule and weights without applying them.",
                fix="rerun with the recorded settings to resume it (they are in its run_spec.json), or "
                "start a new run in another --output (with --set pretrain.init_from=DIR to start from "
                f"its weights, after `bertflow export-hf {spec.out_dir} DIR`).",
            )
        return  # the newest recorded one decides


def resume_threads_note(spec: RunSpec, threads: int) -> str | None:
    """What a CPU resume should say when the checkpoint it continues was written by ranks on
    another number of torch threads: the same math with other float rounding, so its later losses
    are not an uninterrupted run's bit for bit (a machine with other cores, or OMP_NUM_THREADS)."""
    if spec.on_gpu:
        return None
    # the tag a resume picks (`checkpoint.newest_good`), without its checksums: the ranks verify them
    complete = (
        t for t in checkpoint.tag_dirs(spec.checkpoints_dir) if checkpoint.verify(t, deep=False) is None
    )
    if (tag := next(complete, None)) is None:
        return None
    recorded = (checkpoint.read_verification(tag) or {}).get("cpu_threads")
    if recorded is None or recorded == threads:
        return None
    return (
        f"resuming {tag} with {threads} torch thread(s) per rank, where it was written with "
        f"{recorded}: float sums round otherwise with another thread count, so from here the losses "
        "and weights differ in their last digits from those of an uninterrupted run (the keys do not "
        f"hold the thread count); to continue it exactly, rerun with OMP_NUM_THREADS={recorded}."
    )


def _processes(n: Any) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _recorded_settings(out_dir: Path) -> dict[str, Any] | None:
    """The settings of the run spec an earlier launch wrote (checkpoints from before they were
    recorded in `_VERIFIED.json`)."""
    path = out_dir / "run_spec.json"
    if not path.is_file():
        return None
    try:
        return RunSpec.read(path).settings()
    except (UserError, ValueError):
        return None


def masking_settings(manifest: dict[str, Any]) -> MaskingSettings:
    """The shards' masking settings, which dynamic masking repeats (defaults: preprocess's)."""
    from preprocessing.config import PreprocessConfig

    made_with = manifest.get("config") or {}
    defaults = PreprocessConfig.model_fields
    return MaskingSettings(**{k: made_with.get(k, defaults[k].default) for k in MaskingSettings.model_fields})


def build_spec(
    cfg,
    shards_dir: Path,
    tokenizer_dir: Path,
    out_dir: Path,
    on_gpu: bool,
    bf16_ok: bool,
    world_size: int,
    wandb: WandbTarget,
    stage: str = "pretrain",
) -> RunSpec:
    """`cfg` is the pipeline config (pipelines/config.py); raises a UserError for any bad input.
    `stage`: the flow's name of the stage (pretrain@NAME for a phase), which names the W&B run."""
    shards_dir, tokenizer_dir, out_dir = (Path(p).resolve() for p in (shards_dir, tokenizer_dir, out_dir))
    vocab = read_vocab(tokenizer_dir)
    manifest = check_shards(shards_dir, tokenizer_dir, len(vocab))
    mcfg = model_config(cfg, vocab, tokenizer_dir)
    seq = (manifest.get("config") or {}).get("max_seq_length")
    if isinstance(seq, int) and seq > mcfg.max_position_embeddings:
        raise UserError(
            f"the shards in {shards_dir} have sequences up to {seq} tokens, but the model has only "
            f"{mcfg.max_position_embeddings} positions.",
            fix="raise model.max_position_embeddings (phase 1 should use 512 so phase 2 can follow).",
        )
    ds = build_ds_config(cfg.pretrain, world_size, on_gpu, bf16_ok)
    p = cfg.pretrain
    n_train = sum(int(e.get("num_examples", 0)) for e in manifest["splits"]["train"])
    require_one_global_batch(
        n_train, p.micro_batch_size, p.gradient_accumulation_steps, world_size, f" of {shards_dir}"
    )
    spec = RunSpec(
        out_dir=out_dir,
        shards_dir=shards_dir,
        tokenizer_dir=tokenizer_dir,
        on_gpu=on_gpu,
        world_size=world_size,
        run_name=f"{cfg.name}-{stage}",
        pretrain=cfg.pretrain,
        model=mcfg.to_hf_dict(),
        ds_config=ds,
        masking=masking_settings(manifest),
        wandb=wandb,
        pipeline_config=cfg.model_dump(mode="json"),
        shards_manifest_sha256=sha256_file(shards_dir / shard_format.MANIFEST_NAME),
        init_trained_length=shorter_init_length(p.init_from, seq),
    )
    check_resume(spec)
    return spec
