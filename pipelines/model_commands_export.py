"""`bertflow export-hf CKPT OUT_DIR`: a checkpoint -> a clean Hugging Face BERT directory.

OUT_DIR gets config.json, model.safetensors (no tied duplicates), vocab.txt, tokenizer.json and
tokenizer_config.json. `transformers.BertForPreTraining` and `AutoTokenizer` load it with no missing
or unexpected keys; `AutoModel` (BertModel) with no missing keys, and it lists the `cls.*` heads as
unexpected unless `--encoder-only` drops them. `resolve_model` turns CKPT into a model; it reads our
model directories and any HF BERT directory, and is the one place to teach new checkpoint kinds
(e.g. a DeepSpeed checkpoint directory whose ZeRO partitions are consolidated first).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from common.atomic import read_marker
from common.console import warning_line
from common.dir_lock import exclusive_dir
from common.errors import UserError
from common.stage_output import TAG_RE, model_dir_hint, refuse_overlapping_output
from model.heads import BertForPreTraining
from model.hf_io import has_tokenizer, load_checkpoint, tokenizer_fit_problem, tokenizer_size
from model.model_card import CardFacts
from model.model_dir import came_from, carried_card, publish_model_dir, replaced_model_note
from preprocessing.wordpiece import refuse_other_tokenizer


@dataclass
class ResolvedModel:
    model: BertForPreTraining
    tokenizer_dir: Path | None  # where the checkpoint's own tokenizer files are, if it has them
    fresh: list[str]  # parameters not in the checkpoint (freshly initialized)
    kind: str
    tag: Path | None = None  # the DeepSpeed checkpoint tag read (checkpoints/global_stepN), if one
    left_out: list[str] = field(default_factory=list)  # tensors BertForPreTraining has no place for


def resolve_model(ckpt: Path) -> ResolvedModel:
    """Load whatever CKPT is into our BertForPreTraining. New checkpoint kinds add a branch here,
    e.g. `if is_deepspeed_checkpoint(ckpt): return ResolvedModel(consolidate(ckpt), ...)`."""
    if is_model_dir(ckpt):
        loaded = load_checkpoint(ckpt)  # our model dir or any HF BERT dir; errors name the file
        tokenizer = ckpt if has_tokenizer(ckpt) else None
        return ResolvedModel(
            loaded.model, tokenizer, loaded.fresh, "model directory", left_out=loaded.ignored
        )
    if _looks_like_deepspeed(ckpt):
        from training.consolidate import load_model_from_tag, resolve_tag_dir

        tag = resolve_tag_dir(ckpt)  # the newest verified one, or the one named
        model = load_model_from_tag(tag)  # ZeRO partitions merged to fp32
        return ResolvedModel(model, _run_tokenizer(ckpt), [], f"DeepSpeed checkpoint {tag.name}", tag)
    hint = model_dir_hint(ckpt)  # runs/latest: its model/ is the one to pass
    raise UserError(
        f"{ckpt} is not a BERT checkpoint: it has no config.json and no DeepSpeed checkpoint{hint}.",
        fix=f"pass {ckpt / 'model'}."
        if hint
        else "pass a model directory (config.json + model.safetensors) written by bertflow or transformers, "
        "or a pretrain output / checkpoints / global_stepN directory.",
    )


def is_model_dir(ckpt: Path) -> bool:
    """Whether `resolve_model` reads CKPT as a model directory (its config.json and weights, or the
    error that names what is missing: a file, a path that does not exist), not as a checkpoint of a
    pretraining run to consolidate."""
    return (ckpt / "config.json").is_file() or not ckpt.is_dir()


def _run_tokenizer(ckpt: Path) -> Path | None:
    """The tokenizer of the pretrain run that CKPT (the run dir, its checkpoints/ or one
    global_stepN) belongs to: its final model/ dir, else the tokenizer its run_spec.json names
    (a run still under way has no model/ yet)."""
    from training.run_spec import RunSpec

    runs = _run_dirs(ckpt)
    for run in runs:
        if has_tokenizer(run / "model"):
            return run / "model"
    for run in runs:
        tok = Path(RunSpec.read(run / "run_spec.json").tokenizer_dir)
        if has_tokenizer(tok):
            return tok
    return None


def _run_dirs(ckpt: Path) -> list[Path]:
    """The pretraining output CKPT is or lies in (as the run dir, its model/, its checkpoints/ or
    one global_stepN): the folders among CKPT and its next two parents holding a run_spec.json."""
    return [d for d in (ckpt, ckpt.parent, ckpt.parent.parent) if (d / "run_spec.json").is_file()]


def refuse_own_model_dir(ckpt: Path, out: Path) -> None:
    """OUT must be neither CKPT itself nor the model/ of the pretraining output CKPT belongs to:
    that model already is a Hugging Face directory, and writing onto it replaces a run's result
    (its files have no export marker, so the export's own check advised removing them); nor any
    other folder inside that pretraining output (`RUN/checkpoints/global_stepM`, `RUN/hf`)."""
    target = out.resolve()
    run = next((r for r in _run_dirs(ckpt) if (r / "model").resolve() == target), None)
    if run is not None and ckpt.resolve() in (run.resolve(), target):
        itself = "itself" if ckpt.resolve() == run.resolve() else f"(the checkpoint {ckpt} itself)"
        raise UserError(
            f"{out} is the model directory of the pretraining output {run} {itself}; nothing to export: "
            "it already is a Hugging Face model directory.",
            fix=f"use {out} as it is (transformers loads it), or give export-hf another OUT_DIR.",
        )
    if run is not None:
        raise UserError(
            f"{out} is the model directory of the pretraining output {run}, which {ckpt} belongs to; "
            "exporting onto it would replace that run's model.",
            fix="give export-hf another OUT_DIR.",
        )
    if target == ckpt.resolve():
        raise UserError(
            f"{out} is the checkpoint {ckpt} itself; export-hf writes a new directory and would replace "
            "the checkpoint it reads.",
            fix="give export-hf another OUT_DIR.",
        )
    inside = next((r for r in _run_dirs(ckpt) if r.resolve() in target.parents), None)
    if inside is not None:  # RUN/checkpoints/global_stepM, RUN/hf: the run's files, not a place of its own
        raise UserError(
            f"{out} lies inside the pretraining output {inside}, which {ckpt} belongs to; export-hf would "
            f"write into that run's files ({_harm_inside(inside, target)}).",
            fix=f"give export-hf an OUT_DIR outside {inside}.",
        )


def _harm_inside(run: Path, target: Path) -> str:
    """What an export to `target` (resolved), inside the pretraining output `run`, does to the run:
    under checkpoints/global_stepM it also makes a checkpoint folder without a verification file."""
    parts = target.relative_to(run.resolve()).parts
    removed = "cleaning or rerunning the run removes the export with it"
    if len(parts) >= 2 and parts[0] == "checkpoints" and TAG_RE.match(parts[1]):
        return (
            f"its folder {run / parts[0] / parts[1]} reads as a broken checkpoint of the run, and {removed}"
        )
    return removed


def _looks_like_deepspeed(path: Path) -> bool:
    """A pretrain output dir, its checkpoints/ dir, or one checkpoints/global_stepN dir."""
    return any(
        p.is_dir() and (p.name.startswith("global_step") or any(p.glob("global_step*")))
        for p in (path, path / "checkpoints")
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "ckpt",
        type=Path,
        help="checkpoint: our model directory, an HF BERT directory, or a DeepSpeed checkpoint (pretrain output dir)",
    )
    p.add_argument("out_dir", type=Path, help="where to write the Hugging Face directory")
    p.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer dir (vocab.txt or tokenizer.json) if CKPT has none (one differing from CKPT's own is refused)",
    )
    p.add_argument(
        "--encoder-only",
        action="store_true",
        help="drop the MLM/NSP heads: AutoModel (BertModel) then loads it with no unexpected keys",
    )


def main(args: argparse.Namespace) -> int:
    # through links to the directory itself: `runs/latest/model` lies in the pretraining output it
    # links to (its card and steps), and the export names that output, not a link the next run moves
    args.ckpt = args.ckpt.resolve()
    refuse_own_model_dir(args.ckpt, args.out_dir)
    refuse_overlapping_output(
        args.out_dir, {"checkpoint": args.ckpt, "tokenizer": args.tokenizer}, "export-hf"
    )
    with exclusive_dir(args.out_dir, "export-hf"):  # the stages' lock: one writer of OUT_DIR at a time
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    """Read CKPT and publish OUT_DIR (under its lock)."""
    resolved = resolve_model(args.ckpt)
    own = _fitting_own_tokenizer(args, resolved)
    if args.tokenizer is not None and own is not None:
        refuse_other_tokenizer(args.ckpt, own, args.tokenizer)
    tokenizer_dir = args.tokenizer or own
    if tokenizer_dir is None:
        raise UserError(
            f"{args.ckpt} has no tokenizer (vocab.txt or tokenizer.json); a Hugging Face directory needs one.",
            fix="pass --tokenizer DIR, e.g. the tokenizer stage's output directory.",
        )
    fresh = fresh_weights(args.ckpt, resolved.fresh)
    card = source_card(args.ckpt, "export-hf", fresh, resolved.tag)  # its parameters: those written
    previous = read_marker(args.out_dir)
    out = publish_model_dir(
        resolved.model,
        args.out_dir,
        tokenizer_dir,
        info={
            "source": str(args.ckpt.absolute()),
            "command": "export-hf",
            "fresh": fresh,
        },
        encoder_only=args.encoder_only,
        card=card,
    )
    print(f"exported {args.ckpt} ({resolved.kind}) -> {out}")
    if note := replaced_model_note(previous, out):
        print(warning_line(note))
    if resolved.left_out:
        print(warning_line(left_out_note(args.ckpt, resolved.left_out)))
    if args.encoder_only:
        print("encoder only (no pretraining heads): load it with AutoModel / BertModel")
    elif resolved.fresh:
        print(f"warning: not in the checkpoint, freshly initialized: {', '.join(resolved.fresh)}")
    return 0


def left_out_note(ckpt: Path, left_out: list[str]) -> str:
    """What the export did not carry over: a fine-tuned model's task head (`classifier.*`,
    `qa_outputs.*`), which BertForPreTraining, the one architecture export-hf writes, has no place for."""
    from common.jsonfile import read_json_or_empty

    architectures = read_json_or_empty(ckpt / "config.json").get("architectures") or []
    own = f" ({', '.join(map(str, architectures))})" if architectures else ""
    return (
        f"left out of the export, which holds only the encoder and the pretraining heads "
        f"(BertForPreTraining): {', '.join(left_out)}, e.g. a fine-tuned task head. To use the "
        f"fine-tuned model{own}, load {ckpt} itself with transformers: it already is a Hugging Face directory."
    )


def _fitting_own_tokenizer(args: argparse.Namespace, resolved: ResolvedModel) -> Path | None:
    """The checkpoint's own tokenizer, unless it does not fit the model's embeddings
    (`tokenizer_fit_problem`: a run's tokenizer folder written over since, a truncated vocab.txt):
    then `--tokenizer` replaces it, and without one the export is refused naming both sizes."""
    own, rows = resolved.tokenizer_dir, resolved.model.config.vocab_size
    if own is None or not (problem := tokenizer_fit_problem(tokenizer_size(own), rows)):
        return own
    if args.tokenizer is None:
        raise UserError(
            f"{args.ckpt}: its tokenizer {own} is not the one the model was trained with: {problem}.",
            fix="pass that one: --tokenizer DIR (for a pretraining run, the tokenizer that made its shards).",
        )
    print(warning_line(f"{own} does not fit the model ({problem}); using --tokenizer."))
    return None


def fresh_weights(ckpt: Path, fresh: list[str]) -> list[str]:
    """The weights the export initializes, plus those its source directory's marker lists as freshly
    initialized by an earlier import-hf or export-hf: an export of an import without pretraining
    heads still has untrained heads."""
    earlier = (read_marker(ckpt) or {}).get("fresh") if ckpt.is_dir() else None
    return list(dict.fromkeys([*fresh, *(earlier if isinstance(earlier, list) else [])]))


def source_card(ckpt: Path, command: str, fresh: list[str], tag: Path | None = None) -> CardFacts | None:
    """The card `command` (export-hf, import-hf) writes for the model it reads from CKPT: a bertflow
    pretraining's (`pretraining_card_of`), else the one an earlier export or import kept in CKPT's
    marker (`carried_card`); None for any other model (the card then says what the command knows)."""
    return pretraining_card_of(ckpt, tag, command) or carried_card(ckpt, command, fresh)


def pretraining_card_of(ckpt: Path, tag: Path | None = None, command: str = "export-hf") -> CardFacts | None:
    """The model card facts when CKPT is a bertflow pretraining output or lies in one: its model/
    (a finished run), or `tag`, the DeepSpeed checkpoint read from the run dir, its checkpoints/ or
    a global_stepN: then the card says which step, and carries the data, training and held-out
    figures of the run's records up to that step. None otherwise (no run records next to it).
    `command` (export-hf, import-hf) names CKPT first under Provenance (`came_from`)."""
    from pipelines.pretrain_card import checkpoint_provenance, pretraining_card
    from training.checkpoint import step_of

    runs = _run_dirs(ckpt)
    if not runs:
        return None
    run = runs[0]
    if ckpt in (run, run / "model") and read_marker(run) is not None:
        card = pretraining_card(run)  # the finished run's model (its newest checkpoint)
        if tag is not None:  # read from the run dir: which checkpoint that was, after the run's line
            first, *rest = card.provenance.items()
            card.provenance = {**dict([first]), **checkpoint_provenance(step_of(tag)), **dict(rest)}
    elif tag is not None:
        card = pretraining_card(run, step=step_of(tag))
    else:
        return None
    # this directory is `command`'s, as a carried card says (`carried_card`), not the pretraining's
    written_by = f"{card.provenance.pop('written by')} {command}"
    card.provenance = {
        came_from(command): f"`{ckpt.absolute()}`",
        **card.provenance,
        "written by": written_by,
    }
    return card
