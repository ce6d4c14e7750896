"""What a fine-tuning checkpoint is: a model directory (ours or any Hugging Face BERT), `random:PRESET`
or `random:DIR` (random weights of DIR's architecture); its label in the scorecard; the baselines
added to it; the tokenizer it is read with.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import UserError
from common.paths import check_checkpoint_dir, resolve_data_path

GENERIC_DIR_NAMES = {"model", "hf", "final", "export", "checkpoint", "hf_model"}


def is_random(checkpoint: str) -> bool:
    return checkpoint.startswith("random:")


def checkpoint_target(checkpoint: str) -> str:
    """The model directory or preset a checkpoint names: DIR for DIR and for random:DIR (its
    architecture), PRESET for random:PRESET."""
    return checkpoint.split(":", 1)[1] if is_random(checkpoint) else checkpoint


def normalize_checkpoint(checkpoint: str) -> str:
    """`random:PRESET`, `random:DIR` or a model directory, with directories made absolute so a
    result names exactly what was scored."""
    from model.config import PRESETS

    checkpoint = str(checkpoint)
    if is_random(checkpoint):
        target = checkpoint.split(":", 1)[1]
        if target in PRESETS:
            return checkpoint
        if not Path(target).expanduser().is_dir():
            raise UserError(
                f"checkpoint {checkpoint!r}: {target!r} is neither a preset nor a directory.",
                fix=f"use random:PRESET ({', '.join(PRESETS)}) or random:MODEL_DIR.",
            )
        return "random:" + str(Path(target).expanduser().resolve())
    check_checkpoint_dir(checkpoint, missing_fix="pass a model directory or random:PRESET.")
    return str(Path(checkpoint).expanduser().resolve())


def with_baselines(checkpoints: list[str], baselines: list[str], data_root: str | None = None) -> list[str]:
    """The checkpoints to score: the given ones plus baselines (`random` = random init of the first
    checkpoint's shape, `none` = nothing, anything else = another checkpoint, `data:` paths
    allowed), without duplicates."""
    out = list(checkpoints)
    for b in baselines:
        if b == "random":
            first = checkpoints[0]
            out.append(first if is_random(first) else "random:" + first)
        elif is_random(b):
            out.append(b)
        elif b not in ("none", ""):
            out.append(str(resolve_data_path(b, data_root)))
    return list(dict.fromkeys(out))


def checkpoint_label(checkpoint: str) -> str:
    """The checkpoint's name in the scorecard: the folder name (with its parent for generic names
    such as `model`), `random:PRESET`, or `random:` + the label of DIR."""
    if is_random(checkpoint):
        target = checkpoint.split(":", 1)[1]
        return "random:" + (checkpoint_label(target) if "/" in target else target)
    path = Path(checkpoint).expanduser().resolve()
    return f"{path.parent.name}/{path.name}" if path.name in GENERIC_DIR_NAMES else path.name


def tokenizer_dir_for(checkpoint: str, tokenizer_dir: Path | None) -> Path:
    """The given tokenizer, else the checkpoint's own (`random:PRESET` has none: an error). A
    model directory with a tokenizer of its own is read with it: a given one that tokenizes
    differently is refused (random weights, `random:DIR`, have no vocabulary to contradict)."""
    from model.hf_io import has_tokenizer
    from preprocessing.wordpiece import refuse_other_tokenizer

    if tokenizer_dir is not None:
        given = Path(tokenizer_dir).expanduser().resolve()
        if not is_random(checkpoint) and has_tokenizer(Path(checkpoint)):
            refuse_other_tokenizer(checkpoint, Path(checkpoint), given)
        return given
    if is_random(checkpoint) and "/" in checkpoint:
        return Path(checkpoint.split(":", 1)[1])
    if is_random(checkpoint):
        raise UserError(
            f"checkpoint {checkpoint} has no vocabulary.",
            fix="pass --tokenizer DIR (a directory with vocab.txt or tokenizer.json).",
        )
    return Path(checkpoint)
