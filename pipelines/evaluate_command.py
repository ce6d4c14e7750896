"""`bertflow evaluate CHECKPOINT --shards DIR`: held-out masked-LM and NSP quality of any BERT.

CHECKPOINT is anything `export-hf` reads: our model directory, an exported or third-party Hugging
Face BERT with pretraining heads, a pretrain output directory or a DeepSpeed checkpoint. DIR is a
shard directory written by `bertflow preprocess` with the same vocabulary (checked against the
checkpoint's vocab.txt when it has one). Prints MLM accuracy/loss and NSP accuracy/loss next to the
split's context-free baselines, and says so plainly when the model does no better than them.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.atomic import MARKER_NAME, atomic_write_json
from common.errors import UserError
from common.paths import check_output_file
from pipelines.model_commands_export import ResolvedModel, fresh_weights, resolve_model

if TYPE_CHECKING:
    from model.config import BertConfig
    from training.data import ExampleStore


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="model dir, HF BERT dir with heads, or pretrain output dir")
    p.add_argument(
        "--shards", type=Path, required=True, help="shard directory written by `bertflow preprocess`"
    )
    p.add_argument("--split", default="validation", help="train or validation (default: validation)")
    p.add_argument(
        "--max-examples",
        type=int,
        default=None,
        help="evaluate only the first N examples (a pretraining's held-out figures, in its model card, "
        "are those of the first N it names)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="examples per forward pass")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")


def evaluate_checkpoint(
    checkpoint: Path,
    shards: Path,
    split: str = "validation",
    max_examples: int | None = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Load, check compatibility, evaluate; returns metrics, baselines and what was evaluated."""
    import torch

    from finetuning.chance import nsp_at_chance
    from training.data import collate, load_split
    from training.evaluate import beats_unigram, evaluate_pretraining, mlm_baselines, train_target_counts

    if batch_size < 1 or (max_examples is not None and max_examples < 1):
        raise UserError("--batch-size and --max-examples must be positive integers.")
    _check_split_has_examples(shards, split)
    resolved, has_nsp_head = _checked_model(checkpoint, shards)
    model = resolved.model
    vocab_size = model.config.vocab_size
    store = load_split(shards, split)
    _check_examples_fit(store, model.config, checkpoint, shards, split)
    n = len(store) if max_examples is None else min(max_examples, len(store))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    batches = (collate(store, np.arange(i, min(i + batch_size, n))) for i in range(0, n, batch_size))
    sums = evaluate_pretraining(model, batches, device)
    metrics = sums.metrics()
    if not has_nsp_head:  # e.g. a BertForMaskedLM checkpoint: its NSP layer would be random
        metrics = {k: v for k, v in metrics.items() if "nsp" not in k}
    baselines = mlm_baselines(store, train_target_counts(shards, vocab_size), n)
    reference = baselines.as_dict()
    return {
        "checkpoint": str(checkpoint),
        "checkpoint_kind": resolved.kind,
        "shards": str(shards),
        "split": split,
        "examples": n,  # the split's first n
        "split_examples": len(store),
        "masked_tokens": int(sums.mlm_count),
        "metrics": named_for_split(metrics, split),
        "baselines": reference,
        "beats_unigram": beats_unigram(metrics, baselines),
        "nsp_at_chance": nsp_at_chance(metrics, reference, n),
        # False: the checkpoint has no tokenizer files, so only the ids' range could be checked
        "vocabulary_checked": resolved.tokenizer_dir is not None,
    }


def _checked_model(checkpoint: Path, shards: Path) -> tuple[ResolvedModel, bool]:
    """The checkpoint's model, refused when its weights are not finite, when it has no trained MLM
    head, or when its tokenizer (if it has one) is not the shards'; and whether it has its NSP head."""
    from model.model_dir import check_finite
    from training.preflight import check_shards

    resolved = resolve_model(checkpoint)
    check_finite(
        resolved.model,
        str(checkpoint),
        refusal="its figures would be meaningless",
        fix="evaluate an earlier checkpoint of that run (its training diverged after it), or another model.",
    )
    has_nsp_head = _check_pretraining_heads(
        resolved.fresh, fresh_weights(checkpoint, resolved.fresh), checkpoint
    )
    if resolved.tokenizer_dir is not None:
        check_shards(
            shards,
            resolved.tokenizer_dir,
            resolved.model.config.vocab_size,
            fix=f"evaluate on shards preprocessed with the checkpoint's tokenizer (bertflow preprocess "
            f"--vocab {resolved.tokenizer_dir}), or evaluate the model those shards were made for.",
        )
    return resolved, has_nsp_head


def _check_pretraining_heads(missing: list[str], fresh: list[str], checkpoint: Path) -> bool:
    """A checkpoint without a trained MLM head is refused: its head weights `missing` (not in the
    file), or among `fresh` (also those its _COMPLETE.json lists as freshly initialized by the
    import-hf or export-hf that wrote it, e.g. of MiniLM, which has no heads). Returns whether it
    has its NSP head (a BertForMaskedLM checkpoint has not)."""
    untrained = [n for n in fresh if n.startswith("cls.predictions")]
    if untrained:
        how = (
            "are missing"
            if any(n in missing for n in untrained)
            else f"were freshly initialized, not trained: its {MARKER_NAME} lists them as fresh"
        )
        raise UserError(
            f"{checkpoint} has no pretraining heads ({', '.join(untrained[:3])}… {how}), so it cannot "
            "predict masked tokens.",
            fix="pretrain it first (a pretrain run with pretrain.init_from set to it trains the heads) and "
            "evaluate that run's model/, or evaluate a checkpoint saved with its MLM/NSP heads, e.g. a "
            "bertflow pretrain output.",
        )
    return not any(n.startswith("cls.seq_relationship") for n in fresh)


def _check_examples_fit(
    store: ExampleStore, cfg: BertConfig, checkpoint: Path, shards: Path, split: str
) -> None:
    """Examples longer than the checkpoint's positions, with more segment types or with token ids
    past its vocabulary are refused before any forward pass."""
    longest = int(np.diff(store.offsets).max(initial=0))
    if longest > cfg.max_position_embeddings or int(store.segment_ids.max(initial=0)) >= cfg.type_vocab_size:
        raise UserError(
            f"the {split} shards in {shards} hold {longest}-token examples, but {checkpoint} has "
            f"{cfg.max_position_embeddings} positions (and {cfg.type_vocab_size} segment types).",
            fix="evaluate on shards preprocessed with a max_seq_length the checkpoint was made for.",
        )
    if store.max_token_id >= cfg.vocab_size:
        raise UserError(
            f"the {split} shards in {shards} hold token id {store.max_token_id}, but {checkpoint} has a "
            f"vocabulary of {cfg.vocab_size}.",
            fix="evaluate on shards preprocessed with the checkpoint's own tokenizer.",
        )


def _check_split_has_examples(shards: Path, split: str) -> None:
    """Before the checkpoint is loaded: an empty split (a tiny corpus cut into many shards leaves
    validation without a document) has no figures to print."""
    from preprocessing.shard_format import split_size

    if split_size(shards, split) > 0:
        return
    other = "train" if split == "validation" else "validation"
    raise UserError(
        f"the {split} split of {shards} is empty (0 examples): there is nothing to evaluate.",
        fix=f"use --split {other}, or preprocess again with more documents"
        + (
            " or a larger preprocess.validation_fraction (--set preprocess.validation_fraction=0.05)."
            if split == "validation"
            else "."
        ),
    )


def named_for_split(metrics: dict[str, float], split: str, named_for: str = "validation") -> dict[str, float]:
    """`metrics` of a result, named for `named_for` (`val_mlm_acc`, the pretraining's held-out
    names), renamed for the split they measure: `train_mlm_acc` on train (its inverse with the two
    swapped)."""
    old, new = (f"{'val' if s == 'validation' else s}_" for s in (named_for, split))
    return {new + k.removeprefix(old): v for k, v in metrics.items()}


def format_result(r: dict[str, Any]) -> str:
    from model.model_card import context_shortfall

    m, b = named_for_split(r["metrics"], "validation", named_for=r["split"]), r["baselines"]
    lines = [
        f"{r['checkpoint']}{f' ({kind})' if (kind := r.get('checkpoint_kind')) else ''} on {r['shards']} "
        f"({r['split']}, {_which_examples(r)}, "
        f"{r['masked_tokens']:,} masked tokens):",
        f"  masked LM   accuracy {m['val_mlm_acc']:.4f}   loss {m['val_mlm_loss']:.4f} nats",
        f"  next sent.  accuracy {m['val_nsp_acc']:.4f}   loss {m['val_nsp_loss']:.4f} nats"
        + ("   (chance: within noise of the majority label)" if r.get("nsp_at_chance") else "")
        if "val_nsp_acc" in m
        else "  next sent.  not evaluated: the checkpoint has no NSP head",
        f"  baselines   most frequent token {b['most_frequent_token_acc']:.4f}, unigram entropy "
        f"{b['unigram_entropy']:.4f} nats, NSP majority {b['nsp_majority_acc']:.4f}",
    ]
    if not r.get("vocabulary_checked", True):
        lines.append(
            "  NOTE: the checkpoint has no vocab.txt or tokenizer.json, so its vocabulary could not be "
            "compared with the shards' tokenizer (only that every id fits): make sure they match."
        )
    if not math.isfinite(m["val_mlm_loss"]):
        lines.append("  WARNING: the MLM loss is not finite: the weights are broken.")
    elif not r["beats_unigram"]:
        lines.append(
            f"  WARNING: {context_shortfall(m, b, digits=4)}: this model does no better than predicting "
            "token frequencies without context (chance level)."
        )
    return "\n".join(lines)


def _which_examples(r: dict[str, Any]) -> str:
    """'all 167 examples', or 'the first 128 of 167 examples' (`--max-examples`)."""
    n, total = r["examples"], r.get("split_examples")
    if total is None:
        return f"{n:,} examples"
    return f"all {total:,} examples" if n >= total else f"the first {n:,} of {total:,} examples"


def _finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinite float (e.g. the baselines of a split without masked
    tokens) made None: JSON has no NaN, and json.dumps would write a bare one readers reject."""
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def main(args: argparse.Namespace) -> int:
    if args.json is not None:  # before the evaluation, not after it
        check_output_file(args.json, "--json")
    result = evaluate_checkpoint(args.checkpoint, args.shards, args.split, args.max_examples, args.batch_size)
    print(format_result(result))
    if args.json is not None:
        atomic_write_json(args.json, _finite_or_null(result))
        print(f"wrote {args.json}")
    else:
        print(json.dumps(_finite_or_null({k: result[k] for k in ("metrics", "baselines", "beats_unigram")})))
    return 0
