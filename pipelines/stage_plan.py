"""Which stages a flow run executes (`--only`, `--from`, `--force`), and which outputs each reads
(`flow_inputs`): both checked before Prefect starts."""

from __future__ import annotations

from pathlib import Path

from common.errors import UserError
from pipelines.config import PipelineConfig
from pipelines.stage_keys import STAGES, base_stage, complete, phase_names, phase_stage

# Stages that only summarize their inputs (the scorecard reads the units, the report everything):
# their directories are keyed by settings, not by their inputs' contents, so where an input was
# made anew in this flow run (a forced stage upstream, units trained) they are rebuilt (cheap).
SUMMARY_STAGES = ("finetune", "report")


def plan_stages(
    only: str | list[str] | None, from_stage: str | None, force: list[str] | None
) -> tuple[list[str], set[str]]:
    """Which stages run, and which of them recompute even when complete.

    default: all stages, completed ones reused · `--only S` (repeatable): just those stages, in the
    flow's order (the inputs of each must be complete or among them) · `--from S`: everything, S and
    all later stages recomputed · `--force S`: recompute S (repeatable), and the `SUMMARY_STAGES`
    after it, as whenever their inputs are made anew (`FlowRun.stage`). A deployment's `only`
    parameter may be one stage's name.
    """
    only = [only] if isinstance(only, str) else list(only or [])
    for name, value in (
        *(("--only", o) for o in only),
        ("--from", from_stage),
        *(("--force", f) for f in force or []),
    ):
        if value is not None and value not in STAGES:
            raise UserError(f"{name} {value!r}: unknown stage; stages are {', '.join(STAGES)}.")
    if only and from_stage:
        raise UserError("--only and --from exclude each other; use one.")
    forced = set(force or [])
    if only and forced - set(only):
        shown = " ".join(f"--only {o}" for o in only)
        raise UserError(
            f"--force {' '.join(sorted(forced - set(only)))} with {shown}: a forced stage that does "
            "not run recomputes nothing.",
            fix="force only stages that run (--only S --force S), or drop --only.",
        )
    if from_stage:
        forced |= set(STAGES[STAGES.index(from_stage) :])
    selected = [s for s in STAGES if s in only] if only else list(STAGES)
    return selected, forced


def selection_flags(
    only: str | list[str] | None, from_stage: str | None, force: list[str] | None
) -> list[str]:
    """The `bertflow run` flags of a stage selection (`plan_stages`' arguments): --only, --from, --force."""
    only = [only] if isinstance(only, str) else list(only or [])
    pairs = [*(("--only", o) for o in only), ("--from", from_stage), *(("--force", f) for f in force or [])]
    return [word for flag, value in pairs if value is not None for word in (flag, value)]


def flow_inputs(cfg: PipelineConfig) -> dict[str, dict[str, str]]:
    """Each stage of the flow, in its order (a phase's: preprocess@NAME, pretrain@NAME; the
    fine-tuning units: `units`, which the finetune stage runs) → the outputs its task takes:
    parameter → the stage that makes it."""
    inputs: dict[str, dict[str, str]] = {"verify": {}, "tokenizer": {}}
    for phase in phase_names(cfg):
        prep, pre = phase_stage("preprocess", phase), phase_stage("pretrain", phase)
        inputs[prep] = {"tokenizer": "tokenizer"}
        inputs[pre] = {"tokenizer": "tokenizer", "preprocess": prep}
    inputs["units"] = {"pretrain": "pretrain", "tokenizer": "tokenizer"}
    inputs["finetune"] = {"units": "units"}
    inputs["report"] = {"finetune": "finetune"}
    return inputs


def selection_of(stage: str) -> str:
    """The name `--only` selects a flow stage by: pretrain@seq32 -> pretrain, units -> finetune."""
    return "finetune" if stage == "units" else base_stage(stage)


def missing_inputs(cfg: PipelineConfig, selected: list[str], dirs: dict[str, Path]) -> list[str]:
    """The stages whose outputs the `selected` stages read, that do not run and have no complete
    output in `dirs` (`stage_dirs`, as the flow finds them), with those that they need in turn, in
    the flow's order: what `--only` must add to run."""
    inputs, chosen, missing = flow_inputs(cfg), set(selected), set()
    for stage in reversed(inputs):  # an input comes before its reader
        if selection_of(stage) not in chosen:
            continue
        for needed in inputs[stage].values():  # (the units have no output of their own: `finetune` runs them)
            if needed in dirs and selection_of(needed) not in selected and not complete(needed, dirs[needed]):
                missing.add(needed)
                chosen.add(selection_of(needed))
    return [stage for stage in inputs if stage in missing]


def refuse_missing_inputs(cfg: PipelineConfig, selected: list[str], dirs: dict[str, Path]) -> None:
    """A UserError naming every stage `missing_inputs` finds, and the `--only` run that makes them."""
    missing = missing_inputs(cfg, selected, dirs)
    if not missing:
        return
    names = {selection_of(stage) for stage in missing} | set(selected)
    shown = ", ".join(f"{stage} ({dirs[stage]})" for stage in missing)
    them = "them" if len(missing) > 1 else "it"
    raise UserError(
        f"{only_flags(selected)} needs stages that have no complete output for this config: {shown}.",
        fix=f"run {them} in the same command: `{cfg.command_line('run', *only_flags(names).split())}`, or "
        f"the whole flow: `{cfg.command_line('run')}` (it reuses every complete stage).",
    )


def only_flags(stages: list[str] | set[str]) -> str:
    """`--only S` for each of `stages`, in the flow's order."""
    return " ".join(f"--only {stage}" for stage in STAGES if stage in stages)
