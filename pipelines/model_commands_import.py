"""`bertflow import-hf HF_DIR OUT_DIR`: any Hugging Face BERT directory -> our model directory.

Reads config.json + model.safetensors / pytorch_model.bin (with or without the `bert.` prefix,
with or without pretraining heads), and writes our model directory, which is itself a clean HF
directory with the MLM/NSP heads and a tokenizer. Head weights the source did not have are
freshly initialized and listed, so nobody mistakes them for trained ones.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.atomic import read_marker
from common.console import warning_line
from common.dir_lock import exclusive_dir
from common.stage_output import refuse_overlapping_output
from model.hf_io import has_tokenizer, load_checkpoint
from model.model_dir import publish_model_dir, replaced_model_note
from pipelines.model_commands_export import source_card


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("hf_dir", type=Path, help="Hugging Face BERT directory (config.json + weights)")
    p.add_argument("out_dir", type=Path, help="where to write our model directory")
    p.add_argument("--tokenizer", type=Path, help="take vocab.txt/tokenizer.json from here instead of HF_DIR")


def main(args: argparse.Namespace) -> int:
    # through links to the directory itself, as export-hf: `runs/latest/model` lies in the
    # pretraining output it links to (its card and steps), and the import names that output
    args.hf_dir = args.hf_dir.resolve()
    inputs = {"source checkpoint": args.hf_dir, "tokenizer": args.tokenizer}
    refuse_overlapping_output(args.out_dir, inputs, "import-hf")
    with exclusive_dir(args.out_dir, "import-hf"):  # the stages' lock: one writer of OUT_DIR at a time
        return _import(args)


def _import(args: argparse.Namespace) -> int:
    """Read HF_DIR and publish OUT_DIR (under its lock)."""
    loaded = load_checkpoint(args.hf_dir)
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None and has_tokenizer(args.hf_dir):
        tokenizer_dir = args.hf_dir
    previous = read_marker(args.out_dir)
    out = publish_model_dir(
        loaded.model,
        args.out_dir,
        tokenizer_dir,
        info={"source": str(args.hf_dir.absolute()), "command": "import-hf", "fresh": loaded.fresh},
        card=source_card(args.hf_dir, "import-hf", loaded.fresh),
    )
    cfg = loaded.model.config
    print(
        f"imported {args.hf_dir} (L={cfg.num_hidden_layers} H={cfg.hidden_size} "
        f"A={cfg.num_attention_heads} vocab={cfg.vocab_size}) -> {out}"
    )
    if note := replaced_model_note(previous, out):
        print(warning_line(note))
    if loaded.fresh:
        print(f"freshly initialized (not in the source checkpoint): {', '.join(_group(loaded.fresh))}")
    else:
        print("all weights, pretraining heads included, came from the source checkpoint")
    if loaded.ignored:
        print(f"ignored (no place in BertForPreTraining): {', '.join(loaded.ignored)}")
    if tokenizer_dir is None:
        print("no tokenizer in the source: pass --tokenizer DIR to export-hf or import-hf later")
    return 0


def _group(keys: list[str]) -> list[str]:
    """`cls.predictions.transform.dense.weight`, ... -> `cls.predictions.*` style summary."""
    groups: dict[str, int] = {}
    for k in keys:
        parts = k.split(".")
        prefix = ".".join(parts[:2]) if parts[0] in ("cls", "bert") else parts[0]
        groups[prefix] = groups.get(prefix, 0) + 1
    return [f"{g}.* ({n} tensors)" for g, n in groups.items()]
