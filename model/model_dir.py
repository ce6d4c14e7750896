"""Publish a model directory atomically: build it next to the target, verify it, then rename.

A model directory is a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt,
tokenizer.json, tokenizer_config.json) with its model card (README.md, `model/model_card.py`)
plus our completion marker `_COMPLETE.json`, written last.
It is assembled under a `.tmp-` sibling name, read back and compared with the model in memory,
and only then renamed onto OUT_DIR, so a run killed at any point leaves either no OUT_DIR or the
previous complete one, and a rerun produces the same files.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from common.atomic import MARKER_NAME, TMP_PREFIX, read_marker, sha256_file, temp_target, write_marker
from common.errors import UserError
from common.jsonfile import read_json_object
from common.stage_output import stage_of
from model.heads import BertForPreTraining
from model.hf_io import load_checkpoint, saved_parameter_count, write_hf_dir
from model.model_card import CardFacts, facts_of_record, facts_record, write_model_card


def first_nonfinite(weights: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first floating-point weight holding NaN or Inf, else None."""
    for name, tensor in weights:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def check_finite(
    model: torch.nn.Module,
    source: str,
    refusal: str = "refusing to write a broken model",
    fix: str = "from a pretraining run, export an earlier checkpoint (training diverged after it); a "
    "downloaded model's file is damaged: download it again.",
) -> None:
    """Refuse weights holding NaN or Inf (e.g. from an fp16 overflow), naming the first one: to
    publish them by default; `refusal` and `fix` say it for another use (evaluating them)."""
    if (name := first_nonfinite(model.state_dict().items())) is not None:
        raise UserError(f"{source}: weight {name!r} contains NaN or Inf; {refusal}.", fix=fix)


def prepare_target(out: Path) -> None:
    """OUT_DIR may be absent, empty, or a finished model directory (replaced); anything else is
    the user's data and is left alone: a folder without our marker, and a stage's output (its
    marker names the stage). Leftovers of killed runs are removed: the folders `publish_model_dir`
    builds in (`.tmp-NAME.` and mkdtemp's 8 characters, `common.atomic.temp_target`) and an earlier
    version's `.tmp-NAME.old` (`_earlier_old_model`), not a user's `.tmp-NAME.notes`, nor those of
    another OUT_DIR (`.tmp-NAME.v1.<random>` is out of NAME.v1)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"output {out} exists and is a file.", fix="choose another output directory.")
    if out.is_dir() and (stage := stage_of(out)) is not None:
        raise UserError(
            f"output directory {out} holds a bertflow {stage} output, not a model directory; writing the "
            "model there would replace the folder as a whole, and everything in it.",
            fix="choose a new output directory.",
        )
    if out.is_dir() and any(out.iterdir()) and not is_finished_model_dir(out):
        holds_model = (out / "config.json").is_file()  # e.g. a pretraining's model/: never to be removed
        why = (
            f"its {MARKER_NAME} is none export-hf or import-hf writes"
            if (out / MARKER_NAME).is_file()
            else f"no {MARKER_NAME}"
        )
        raise UserError(
            f"output directory {out} already exists and is not a finished bertflow model directory "
            f"({why}{'; it holds a model' if holds_model else ''}); not overwriting it.",
            fix="choose a new output directory" + ("." if holds_model else " or remove this one."),
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f"{TMP_PREFIX}{out.name}.*"):
        if stale.is_dir() and (temp_target(stale.name) == out.name or _earlier_old_model(stale, out)):
            shutil.rmtree(stale, ignore_errors=True)


def _earlier_old_model(path: Path, out: Path) -> bool:
    """`.tmp-OUT.old` as versions before 2026-11-28 left it when killed while replacing OUT: the
    previous model moved aside (a finished model directory; a user's folder of that name is kept)."""
    return path.name == f"{TMP_PREFIX}{out.name}.old" and is_finished_model_dir(path)


def is_finished_model_dir(out: Path) -> bool:
    """A folder `publish_model_dir` finished: its marker records the sha256 of model.safetensors, as
    every export's and import's has; a user's `{}` marker is none (the folder would be replaced)."""
    marker = read_marker(out)
    return marker is not None and isinstance(marker.get("model.safetensors"), str)


def publish_model_dir(
    model: BertForPreTraining,
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None,
    info: dict[str, Any] | None = None,
    encoder_only: bool = False,
    card: CardFacts | None = None,
) -> Path:
    """Write `model` (+ tokenizer files and a model card) as a finished model directory at
    `out_dir`. Without `card`, the card says what `info` knows (source, command, fresh weights).
    The caller holds OUT_DIR's lock (`common.dir_lock.exclusive_dir`, as export-hf and import-hf
    do): two writers at once would each sweep the other's build folder as a killed run's."""
    out = Path(out_dir).absolute()
    check_finite(model, str(info.get("source", "model")) if info else "model")
    prepare_target(out)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out.name}.", dir=out.parent))
    try:
        model_max_length = card.model_max_length if card else None
        write_hf_dir(model, tmp, tokenizer_dir, encoder_only=encoder_only, model_max_length=model_max_length)
        facts = described_as_written(card or basic_card(model, tmp, info or {}), tmp, encoder_only)
        write_model_card(tmp, facts, final_dir=out)
        reloaded = load_checkpoint(tmp).model.state_dict()
        for name, tensor in model.state_dict().items():
            if encoder_only and not name.startswith("bert."):
                continue
            if not torch.equal(reloaded[name], tensor.detach().cpu()):
                raise RuntimeError(f"written {tmp / 'model.safetensors'} differs from the model at {name}")
        payload = {
            "model.safetensors": sha256_file(tmp / "model.safetensors"),
            **(info or {}),
            **(card_record(facts) if card else {}),
        }
        if isinstance(payload.get("fresh"), list):  # those the directory holds (encoder-only: no heads)
            payload["fresh"] = held_weights(payload["fresh"], encoder_only)
        write_marker(tmp, payload)
        _make_readable(tmp)
        if out.exists():
            # a name of the same shape, so a kill before the rmtree leaves what a rerun removes
            old = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{out.name}.", dir=out.parent))
            os.replace(out, old)  # onto the empty folder mkdtemp made
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def card_record(facts: CardFacts) -> dict[str, Any]:
    """What a model directory's marker keeps of its card: the facts (`carried_card` writes them again
    for an import-hf or export-hf of the directory) and, for a bertflow pretraining's model, the
    steps of each phase (the scorecard names and advises on it as the model bertflow pretrained,
    `finetuning.scorecard.pretraining_steps`, wherever the directory is copied)."""
    steps = {"pretraining_steps": [*facts.steps_before, facts.training.steps]} if facts.training else {}
    return {"card": facts_record(facts), **steps}


def came_from(command: str) -> str:
    """The Provenance line naming the directory `command` read: "imported from", "exported from"."""
    return {"import-hf": "imported from", "export-hf": "exported from"}.get(command, "source")


def carried_card(source: Path, command: str, fresh: list[str]) -> CardFacts | None:
    """The card facts an earlier export-hf or import-hf kept in the model directory `source`'s
    marker (`card_record`), for `command` writing the same weights elsewhere: its provenance names
    `source` first, `fresh` the weights not from it. None where the marker keeps none."""
    from common.version import package_version

    facts = facts_of_record((read_marker(source) or {}).get("card")) if source.is_dir() else None
    if facts is None:
        return None
    provenance = {came_from(command): f"`{source.absolute()}`"}
    for key, value in facts.provenance.items():  # the chain so far, newest first
        if key != "written by":
            provenance[_unused_label(key, provenance)] = value
    facts.provenance = {**provenance, "written by": f"bertflow {package_version()} {command}"}
    facts.fresh_weights = list(fresh)
    return facts


def _unused_label(label: str, taken: dict[str, str]) -> str:
    """`label`, or where a later step of the chain took it (an export of an import of an export:
    two "exported from"), "LABEL (earlier)", "LABEL (earlier 2)", ..."""
    base = label.split(" (earlier")[0]
    if label not in taken and label == base:
        return label
    candidates = (f"{base} (earlier{f' {n}' if n > 1 else ''})" for n in range(1, len(taken) + 2))
    return next(c for c in candidates if c not in taken)


def described_as_written(facts: CardFacts, model_dir: Path, encoder_only: bool) -> CardFacts:
    """The card facts of the directory as written: its saved parameters (an encoder-only export
    holds no pretraining heads, so their weights are neither counted nor listed as untrained)."""
    return dataclasses.replace(
        facts,
        encoder_only=encoder_only,
        parameters=saved_parameter_count(model_dir),
        fresh_weights=held_weights(facts.fresh_weights, encoder_only),
    )


def held_weights(names: list[str], encoder_only: bool) -> list[str]:
    """Those of the weights `names` that a directory written with(out) `encoder_only` holds."""
    return [name for name in names if not encoder_only or name.startswith("bert.")]


def replaced_model_note(previous: dict[str, Any] | None, out: Path) -> str | None:
    """What a finished model directory held before `publish_model_dir` replaced it (`previous`: its
    marker, read before), when that was another model (other weights); None for a rerun that wrote
    the same weights, or when nothing was there."""
    now = read_marker(out) or {}
    if not previous or previous.get("model.safetensors") == now.get("model.safetensors"):
        return None
    made = " ".join(str(previous[k]) for k in ("command",) if previous.get(k)) or "bertflow"
    source = f" from {previous['source']}" if previous.get("source") else ""
    return f"{out} held another model ({made}{source}, other weights); it is replaced by this one."


def basic_card(model: BertForPreTraining, model_dir: Path, info: dict[str, Any]) -> CardFacts:
    """What is known of a converted checkpoint: its shape, where it came from, which weights are new."""
    from common.version import package_version
    from model.heads import count_parameters

    source = info.get("source")
    command = info.get("command", "bertflow")
    max_len = trained_length(model_dir)
    name = f"BERT from {Path(source).name}" if source else "BERT"
    provenance = {"source": f"`{source}`"} if source else {}
    return CardFacts(
        name=f"{name} ({command})",
        model_config=model.config.to_hf_dict(),
        parameters=count_parameters(model),
        model_max_length=max_len,
        fresh_weights=list(info.get("fresh") or []),
        provenance={**provenance, "written by": f"bertflow {package_version()} {command}"},
    )


def trained_length(model_dir: Path) -> int | None:
    """The sequence length a model directory's model was trained at: `model_max_length` in its
    tokenizer_config.json (`bertflow pretrain` sets it; Hugging Face's "no limit" placeholder and
    a missing file give None, a corrupt one a UserError naming it)."""
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    length = read_json_object(path, "tokenizer config").get("model_max_length")
    return length if isinstance(length, int) and 0 < length < 10**9 else None


def _make_readable(directory: Path) -> None:
    """Temp files are created 0600; give the published directory the usual umask permissions."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(directory, 0o777 & ~mask)
    for path in directory.iterdir():
        os.chmod(path, 0o666 & ~mask)
