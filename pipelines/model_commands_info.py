"""`bertflow model-info --preset NAME`: the preset's shape and parameter count."""

from __future__ import annotations

import argparse

from model.config import PRESETS, BertConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="base", help=f"one of: {', '.join(PRESETS)}")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=30522,
        help="vocabulary size (embedding rows; default: 30522, BERT's)",
    )


def main(args: argparse.Namespace) -> int:
    from model.heads import BertForPreTraining, count_parameters

    cfg = BertConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    with __import__("torch").device("meta"):
        model = BertForPreTraining(cfg)
    total = count_parameters(model)
    encoder = count_parameters(model.bert)
    print(
        f"preset {args.preset}: L={cfg.num_hidden_layers} H={cfg.hidden_size} A={cfg.num_attention_heads} "
        f"I={cfg.intermediate_size} vocab={cfg.vocab_size}\n"
        f"parameters: {total:,} total ({total / 1e6:.1f}M), {encoder:,} in BertModel ({encoder / 1e6:.1f}M)"
    )
    return 0
