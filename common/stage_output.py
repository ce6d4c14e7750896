"""What a bertflow stage directory is, so that an error can say what a path holds and which path
was meant, and so that no stage writes into another stage's output.

A stage's completion marker names the stage (`{"stage": ...}`); outputs written before markers did
are recognized by their files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from common.atomic import IN_PROGRESS_NAME, MARKER_NAME, read_marker, temp_files
from common.errors import UserError

# the flow's stages in order (`bertflow run --only/--from/--force`), each writing run_dir/<stage>/<key>/
STAGES: tuple[str, ...] = ("verify", "tokenizer", "preprocess", "pretrain", "finetune", "report")
PHASE_MARK = "@"  # pretrain@seq32: the pretrain stage of the phase named seq32


def base_stage(name: str) -> str:
    """The stage a flow stage name is of: pretrain@seq32 -> pretrain."""
    return name.partition(PHASE_MARK)[0]


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
    """'tokenizer', 'preprocess', 'pretrain', 'finetune', 'report' (or another of `STAGES`, or a
    phase's, marked) for a bertflow stage output, None for anything else (a model directory, a
    user's folder, one whose _COMPLETE.json names a stage bertflow has not)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    marker = read_marker(directory)
    if marker and isinstance(marker.get("stage"), str) and base_stage(marker["stage"]) in STAGES:
        return marker["stage"]  # a marker naming another stage (`"mine"`) is no bertflow stage's
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
    """' (DIR is a pretraining output directory: its model is DIR/model)', or for another folder
    holding a model/ (a flow run's directory, runs/latest) ' (DIR holds a model directory: its
    model is DIR/model)'; '' for anything else."""
    directory = Path(directory)
    if stage_of(directory) == "pretrain":
        return f" ({directory} is a pretraining output directory: its model is {directory / 'model'})"
    if has_model(directory):
        return f" ({directory} holds a model directory: its model is {directory / 'model'})"
    return ""


def overlap(out: Path, source: Path) -> str | None:
    """How the folder `out` overlaps `source` (both resolved): "is" it, "lies inside" it, or "holds"
    it; None when they are apart."""
    if out == source:
        return "is"
    if source in out.parents:
        return "lies inside"
    return "holds" if out in source.parents else None


def refuse_overlapping_output(out_dir: Path, inputs: dict[str, Path | None], command: str) -> None:
    """A model command's OUT_DIR apart from what it reads (`inputs`: what → path; None skipped),
    before any work: one inside an input wrote into the source's folder, and one holding an input
    is replaced as a whole (`publish_model_dir`), the input with it."""
    out = Path(out_dir).expanduser().resolve()
    for what, path in inputs.items():
        source = Path(path).expanduser().resolve() if path is not None else None
        if source is None or (where := overlap(out, source)) is None:
            continue
        harm = {
            "is": f"would write over the {what} it reads",
            "lies inside": f"would write into the {what}'s folder",
            "holds": f"would replace {out} as a whole, and the {what} in it with it",
        }[where]
        raise UserError(
            f"the {command} output {out} {where} the {what} {source}; {command} {harm}.",
            fix=f"give {command} an OUT_DIR apart from {source} (neither it, nor inside it, nor holding it).",
        )
    if (run := _pretraining_output_holding(out)) is not None:
        raise UserError(
            f"the {command} output {out} lies inside the pretraining output {run}; {command} would write "
            "into that run's files (its model, checkpoints; cleaning or rerunning the run removes the "
            "output with it).",
            fix=f"give {command} an OUT_DIR outside {run}.",
        )


def _pretraining_output_holding(out: Path) -> Path | None:
    """The pretraining output (its run_spec.json, finished or not) among OUT's three nearest parents:
    RUN/model, RUN/hf, RUN/checkpoints/global_stepN or a folder in one of them."""
    return next((d for d in list(out.parents)[:3] if (d / "run_spec.json").is_file()), None)


def check_own_output(out_dir: str | os.PathLike, stage: str, inputs: dict[str, str | os.PathLike]) -> None:
    """Refuse an output directory that is one of the stage's inputs (or lies inside one), a model
    folder, or holds another stage's output: writing there would mix files into it or remove it."""
    out = Path(out_dir).expanduser().resolve()
    for what, path in inputs.items():
        source = Path(path).expanduser().resolve()
        if (where := overlap(out, source)) in ("is", "lies inside"):
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


# the key each stage's marker held before markers named their stage (until 2026-11-22): an output
# of that time is still its stage's own; the finetune and report markers always named theirs
_UNNAMED_MARKER_KEYS = {"tokenizer": "tokenizer_sha256", "preprocess": "examples", "pretrain": "fingerprint"}


def marked_by(directory: str | os.PathLike, stage: str) -> bool:
    """Whether `directory`'s `_COMPLETE.json` is one `stage` wrote: it names the stage, or it names
    none and holds the key that stage's marker held before markers named it. A user's `{}` is none."""
    marker = read_marker(directory)
    if marker is None:
        return False
    if "stage" in marker:
        return marker["stage"] == stage
    return _UNNAMED_MARKER_KEYS.get(stage) in marker


def _written_by_bertflow(out: Path, written: tuple[str, ...]) -> bool:
    """Signs that a stage wrote `out` before (a killed run): its `_IN_PROGRESS.json` beside the lock
    file a stage holds while it writes `out` (`PARENT/.NAME.lock`), or temp files of its writes
    (`.tmp-NAME.<random>` of a name in `written`). Not a user's own `.tmp-*`, nor either of the
    first two alone: the lock file outlives a deleted `out` and so says nothing about a new folder
    of that name, and an `_IN_PROGRESS.json` where no stage held the lock is a stray one (copied in
    with the user's files)."""
    return _killed_run_record(out) or bool(temp_files(out, written))


def _killed_run_record(out: Path) -> bool:
    """`out` holds the `_IN_PROGRESS.json` of a stage run that held its lock."""
    from common.dir_lock import lock_file_of

    return (out / IN_PROGRESS_NAME).is_file() and lock_file_of(out).is_file()


def _holds_a_file(path: Path) -> bool:
    """`path` is a file, or a folder with a file somewhere below it."""
    if path.is_file():
        return True
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def refuse_foreign_files(
    out_dir: str | os.PathLike, stage: str, written: tuple[str, ...], own: tuple[str, ...] = ()
) -> None:
    """An output folder holding files `stage` writes or clears (names in `written`) that is not that
    stage's own output (no `_COMPLETE.json` of that stage, `marked_by`, no sign of a killed run: `_written_by_bertflow`, or a
    file matching a pattern in `own` (a name, or a glob below `out_dir`) that only the stage
    writes, first) holds the user's files: refused before any
    work, naming a few of them. An empty folder, or one holding only other files, is used as it is
    (the stage never touches them), and so is an empty folder of a written name (`checkpoints/`: a
    mount point of its own disk)."""
    out = Path(out_dir)
    if not out.is_dir() or marked_by(out, stage) or _written_by_bertflow(out, written):
        return
    if any(p.is_file() for pattern in own for p in out.glob(pattern)):
        return
    # a _COMPLETE.json here is someone else's (not `marked_by` the stage): the stage writes one over it
    clash = sorted(n for n in (*written, MARKER_NAME) if _holds_a_file(out / n))
    if clash:
        shown = ", ".join(clash[:4]) + (f" and {len(clash) - 4} more" if len(clash) > 4 else "")
        raise UserError(
            f"the {stage} output {out} already holds {shown}, and it is not a bertflow {stage} output "
            f"({_no_sign_of(out, stage)}); {stage} writes files of those names there, so "
            "they would be overwritten or mixed with the run's.",
            fix=f"choose an --output folder of its own (a new or empty one), or move {shown} out of {out}"
            + _earlier_run_note(out),
        )


def _no_sign_of(out: Path, stage: str) -> str:
    """Why `out` is no `stage` output, as it is: a marker of someone else's, or none (never written,
    or deleted by hand: then the files say nothing of whose they are); and no killed run's record,
    or a stray one."""
    from common.dir_lock import lock_file_of

    killed = f"there is no {IN_PROGRESS_NAME} of a killed run"
    if (out / IN_PROGRESS_NAME).is_file():
        killed = (
            f"its {IN_PROGRESS_NAME} is no killed run's: no bertflow stage held the lock beside it "
            f"({lock_file_of(out)}), as every stage does while it writes"
        )
    if (out / MARKER_NAME).is_file():
        return f"its {MARKER_NAME} is none a bertflow {stage} writes, and {killed}"
    return f"no {MARKER_NAME}: never written, or deleted; {killed.replace('there is no', 'no', 1)}"


def _earlier_run_note(out: Path) -> str:
    """When `out` holds no marker, what a run's output whose marker was deleted would do: ' (if these
    are its files, ... delete them to run it again).', naming the lock file beside `out` when there
    is one (a run once wrote a folder of that name; it may have been deleted since, so the files
    may be anyone's); '.' beside a marker of someone else's."""
    from common.dir_lock import lock_file_of

    if (out / MARKER_NAME).is_file():
        return "."
    lock = lock_file_of(out)
    if not lock.is_file():
        return f" (if these are the files of a bertflow run whose {MARKER_NAME} was deleted, delete them to run it again)."
    return (
        f" ({lock} says a bertflow run wrote a folder of this name before: if these are its files, "
        f"their {MARKER_NAME} deleted, delete them to run it again)."
    )
