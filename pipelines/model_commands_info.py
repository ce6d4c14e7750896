"""`bertflow model-info --preset NAME`: the preset's shape and parameter count.
`bertflow model-info PATH`: the same for a model folder (bertflow's, or Hugging Face's with
config.json), read from its config.json and its weights' headers, and the heads it holds."""

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
        help="a model folder (bertflow's or Hugging Face's, with config.json) to describe instead of a preset",
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
    print(describe_model_dir(args.path))
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


def describe_model_dir(path: Path) -> str:
    """The shape (config.json), the parameters saved (weights' headers, tied copies once), and which
    heads the folder holds: the pretraining heads (masked-LM, next-sentence) and any other tensors,
    e.g. a fine-tuned classifier. A file, or a folder without config.json or weights, is refused."""
    import torch

    from common.atomic import MARKER_NAME
    from common.paths import check_checkpoint_dir
    from model.config import preset_of
    from model.hf_io import normalize_keys, read_config, weight_shapes
    from pipelines.model_commands_export import fresh_weights

    check_checkpoint_dir(path, missing_fix="pass a model folder (config.json and weights), or --preset NAME.")
    cfg = read_config(path)
    shapes = weight_shapes(path)
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
    fresh = [w for w in fresh_weights(path, []) if w.startswith("cls.")]
    if fresh and (mlm or nsp):  # an import-hf / export-hf of a model without them added new ones
        heads += (
            f", freshly initialized, not trained ({MARKER_NAME} lists {len(fresh)} head tensors as fresh)"
        )
    preset = preset_of(cfg.to_hf_dict())
    lines = [
        f"{path}: BERT {_shape(cfg)} positions={cfg.max_position_embeddings}"
        + (f" (the shape of preset {preset})" if preset else ""),
        f"parameters: {total:,} saved ({total / 1e6:.1f}M), {encoder:,} in BertModel ({encoder / 1e6:.1f}M)",
        f"vocabulary: {cfg.vocab_size:,} tokens",
        f"pretraining heads: {heads}",
    ]
    if other:
        lines.append(f"other tensors (not BERT pretraining's, e.g. a fine-tuned head): {', '.join(other)}")
    return "\n".join(lines)
