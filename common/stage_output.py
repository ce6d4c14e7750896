"""What a bertflow stage directory is, so that an error can say what a path holds and which path
was meant, and so that no stage writes into another stage's output.

A stage's completion marker names the stage (`{"stage": ...}`); outputs written before markers did
are recognized by their files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from common.atomic import read_marker
from common.errors import UserError

# a pretraining checkpoint: OUT/checkpoints/global_stepN/, verified once it holds VERIFIED_NAME
# (`training/checkpoint.py`; here without torch, for the flow's notes)
VERIFIED_NAME = "_VERIFIED.json"
TAG_RE = re.compile(r"^global_step(\d+)$")


def newest_verified_step(out: Path) -> int | None:
    """The step of the newest verified checkpoint of the pretraining output `out`, if any."""
    steps = [
        int(m.group(1))
        for tag in (Path(out) / "checkpoints").glob("global_step*")
        if (m := TAG_RE.match(tag.name)) and (tag / VERIFIED_NAME).is_file()
    ]
    return max(steps, default=None)


# files by which an output is recognized, stage by stage (first match wins)
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("preprocess", ("manifest.json", "stats.json")),
    ("pretrain", ("run_spec.json",)),
    ("pretrain", ("checkpoints",)),
    ("finetune", ("scorecard.json",)),
    ("finetune", ("units",)),
    ("report", ("report.md",)),
    ("tokenizer", ("tokenizer.json", "tokenizer_config.json")),
)


def stage_of(directory: str | os.PathLike) -> str | None:
    """'tokenizer', 'preprocess', 'pretrain', 'finetune', 'report' (or another marked stage) for a
    bertflow stage output, None for anything else (a model directory, a user's folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    marker = read_marker(directory)
    if marker and isinstance(marker.get("stage"), str):
        return marker["stage"]
    if (directory / "config.json").is_file():
        return None  # a model directory (it may hold a tokenizer too)
    for stage, names in _SIGNATURES:
        if all((directory / n).exists() for n in names):
            return stage
    return None


def has_model(pretrain_dir: str | os.PathLike) -> bool:
    """Whether a pretraining output holds its exported model (`model/config.json`)."""
    return (Path(pretrain_dir) / "model" / "config.json").is_file()


def model_dir_hint(directory: str | os.PathLike) -> str:
    """' (DIR is a pretrain output: its model is DIR/model)' where that is so, else ''."""
    directory = Path(directory)
    if stage_of(directory) == "pretrain" or has_model(directory):
        return f" ({directory} is a pretraining output directory: its model is {directory / 'model'})"
    return ""


def check_own_output(out_dir: str | os.PathLike, stage: str, inputs: dict[str, str | os.PathLike]) -> None:
    """Refuse an output directory that is one of the stage's inputs (or lies inside one), a model
    folder, or holds another stage's output: writing there would mix files into it or remove it."""
    out = Path(out_dir).expanduser().resolve()
    for what, path in inputs.items():
        source = Path(path).expanduser().resolve()
        if out == source or source in out.parents:
            where = "is" if out == source else "lies inside"
            raise UserError(
                f"the {stage} output {out} {where} the {what} directory {source}; {stage} would write "
                f"its files into (and clear parts of) the {what}.",
                fix="choose an --output folder of its own.",
            )
    if (out / "config.json").is_file():  # stage_of says None for it: a model is no stage's output
        raise UserError(
            f"the {stage} output {out} is a model folder (it holds config.json); {stage} would write its "
            "files into it, replacing those of the same name (its tokenizer's vocab.txt, _COMPLETE.json).",
            fix="choose an --output folder of its own.",
        )
    other = stage_of(out)
    if other is not None and other != stage:
        raise UserError(
            f"the {stage} output {out} holds a bertflow {other} output; {stage} would overwrite it.",
            fix="choose an --output folder of its own.",
        )
