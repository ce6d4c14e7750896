"""`bertflow model-info --preset NAME`: the preset's shape and parameter count.
`bertflow model-info PATH`: the same for a model folder (bertflow's, or Hugging Face's with
config.json), read from its config.json and its weights' headers, and the heads it holds; or for
anything else `bertflow evaluate` and `export-hf` read (a pretraining output, its checkpoints/ or
one global_stepN: `resolve_model`, the checkpoint they would read, consolidated)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from common.errors import UserError
from model.config import PRESETS, BertConfig

DEFAULT_VOCAB_SIZE = 30522  # BERT's


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        nargs="?",
        type=Path,
        help="a model folder (bertflow's or Hugging Face's, with config.json), or a pretraining output, "
        "its checkpoints/ or one global_stepN, to describe instead of a preset",
    )
    p.add_argument("--preset", help=f"one of: {', '.join(PRESETS)} (default: base)")
    p.add_argument(
        "--vocab-size",
        type=int,
        help=f"vocabulary size of --preset (embedding rows; default: {DEFAULT_VOCAB_SIZE}, BERT's)",
    )


def main(args: argparse.Namespace) -> int:
    if args.path is None:
        return _preset_info(args.preset or "base", args.vocab_size or DEFAULT_VOCAB_SIZE)
    if args.preset or args.vocab_size:
        raise UserError(
            f"model-info {args.path} describes that folder; --preset and --vocab-size describe a preset.",
            fix=f"drop them (bertflow model-info {args.path}), or drop the path (bertflow model-info --preset NAME).",
        )
    print(describe_model(args.path))
    return 0


def _preset_info(preset: str, vocab_size: int) -> int:
    from model.heads import BertForPreTraining, count_parameters

    cfg = BertConfig.from_preset(preset, vocab_size=vocab_size)
    with __import__("torch").device("meta"):
        model = BertForPreTraining(cfg)
    total = count_parameters(model)
    encoder = count_parameters(model.bert)
    print(
        f"preset {preset}: {_shape(cfg)}\n"
        f"parameters: {total:,} total ({total / 1e6:.1f}M), {encoder:,} in BertModel ({encoder / 1e6:.1f}M)"
    )
    return 0


def _shape(cfg: BertConfig) -> str:
    return (
        f"L={cfg.num_hidden_layers} H={cfg.hidden_size} A={cfg.num_attention_heads} "
        f"I={cfg.intermediate_size} vocab={cfg.vocab_size}"
    )


def describe_model(path: Path) -> str:
    """`_describe_model_dir` for a model folder; for what `resolve_model` reads as a pretraining run's
    DeepSpeed checkpoint, the same description of the model it consolidates, naming the tag."""
    from common.paths import check_checkpoint_dir
    from model.hf_io import TIED_KEYS
    from pipelines.model_commands_export import is_model_dir, resolve_model

    check_checkpoint_dir(path, missing_fix="pass a model folder (config.json and weights), or --preset NAME.")
    if is_model_dir(path):
        return _describe_model_dir(path)
    resolved = resolve_model(path)
    state = resolved.model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items() if k not in TIED_KEYS}
    return _describe(f"{path} ({resolved.kind})", resolved.model.config, shapes, fresh=[])


def _describe_model_dir(path: Path) -> str:
    """The shape (config.json), the parameters saved (weights' headers, tied copies once), and which
    heads the folder holds: the pretraining heads (masked-LM, next-sentence) and any other tensors,
    e.g. a fine-tuned classifier. A folder without config.json or weights is refused (`read_config`,
    `weight_shapes`); `describe_model` has checked that the path is a folder."""
    from model.hf_io import read_config, weight_shapes
    from pipelines.model_commands_export import fresh_weights

    return _describe(str(path), read_config(path), weight_shapes(path), fresh_weights(path, []))


def _describe(name: str, cfg: BertConfig, shapes: dict[str, tuple[int, ...]], fresh: list[str]) -> str:
    """The lines of `_describe_model_dir` for the model `name` of config `cfg` whose saved tensors have
    `shapes`; `fresh`: the weights its marker lists as freshly initialized."""
    import torch

    from common.atomic import MARKER_NAME
    from model.config import preset_of
    from model.hf_io import normalize_keys

    state, other = normalize_keys({k: torch.empty(s, device="meta") for k, s in shapes.items()})
    encoder = sum(v.numel() for k, v in state.items() if k.startswith("bert."))
    total = sum(v.numel() for v in state.values()) + sum(math.prod(shapes[k]) for k in other)
    mlm = any(k.startswith("cls.predictions.") for k in state)
    nsp = any(k.startswith("cls.seq_relationship.") for k in state)
    heads = {
        (True, True): "yes: masked-LM and next-sentence (BertForPreTraining)",
        (True, False): "masked-LM only (no next-sentence head)",
        (False, True): "next-sentence only (no masked-LM head)",
        (
            False,
            False,
        ): "no: an encoder only (BertModel); pretraining with pretrain.init_from trains new heads",
    }[(mlm, nsp)]
    fresh = [w for w in fresh if w.startswith("cls.")]
    if fresh and (mlm or nsp):  # an import-hf / export-hf of a model without them added new ones
        heads += (
            f", freshly initialized, not trained ({MARKER_NAME} lists {len(fresh)} head tensors as fresh)"
        )
    preset = preset_of(cfg.to_hf_dict())
    lines = [
        f"{name}: BERT {_shape(cfg)} positions={cfg.max_position_embeddings}"
        + (f" (the shape of preset {preset})" if preset else ""),
        f"parameters: {total:,} saved ({total / 1e6:.1f}M), {encoder:,} in BertModel ({encoder / 1e6:.1f}M)",
        f"vocabulary: {cfg.vocab_size:,} tokens",
        f"pretraining heads: {heads}",
    ]
    if other:
        lines.append(f"other tensors (not BERT pretraining's, e.g. a fine-tuned head): {', '.join(other)}")
    return "\n".join(lines)
