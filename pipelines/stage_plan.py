"""Which stages a flow run executes (`--only`, `--from`, `--force`), checked before Prefect starts."""

from __future__ import annotations

from common.errors import UserError
from pipelines.stage_keys import STAGES

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
