"""Why a stage computes again: the settings that changed its key since the last flow run of the same
config, and what that run's output under the old key still holds (a complete output, or a killed
pretraining's checkpoints, which only the old settings resume). Without it a changed setting, one a
phase inherits from the main `pretrain:` section included, started hours of work from scratch
unsaid, next to the progress it left behind.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from common.atomic import progress_state
from common.errors import UserError
from common.stage_output import newest_verified_step
from pipelines.run_history import flow_runs, runs_cli
from pipelines.stage_keys import base_stage

# the ones that take long (fine-tuning: every unit trains again); the report follows them
NOTED_STAGES = ("tokenizer", "preprocess", "pretrain", "finetune")
SHOWN_CHANGES = 4


def flat(inputs: dict[str, Any], section: str) -> dict[str, Any]:
    """A stage's key inputs by setting name: the stage's own section as `section.key`, the rest as
    their top-level name (an upstream stage's key, the corpus files, the model section)."""
    out: dict[str, Any] = {}
    for name, value in inputs.items():
        if name == "config" and isinstance(value, dict):
            out.update({f"{section}.{key}": v for key, v in value.items()})
        elif name == "model" and isinstance(value, dict):
            out.update({f"model.{key}": v for key, v in value.items()})
        else:
            out[name] = value
    return out


def describe(name: str, old: Any, new: Any) -> str:
    if name in ("inputs", "preprocess") or isinstance(old, list | dict) or isinstance(new, list | dict):
        return {"inputs": "the corpus files", "preprocess": "its shards (the preprocess output)"}.get(
            name, name
        )
    if name in ("tokenizer", "init_from", "pretrain", "finetune"):
        return f"its input {name}"
    return f"{name} {json.dumps(old)} -> {json.dumps(new)}"


def shown(changes: list[str]) -> str:
    """The first `SHOWN_CHANGES` changes, then how many more."""
    more = len(changes) - SHOWN_CHANGES
    return "; ".join(changes[:SHOWN_CHANGES]) + (f" and {more} more" if more > 0 else "")


def refuse_replacing(out_dir: str | Path, stage: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """A finished output in a folder the user named (`--output`) made from other settings or
    inputs (`old`, `new`: what made it and what would, as `changed_settings` reads them) is refused,
    not replaced: hours of preprocessing were lost to a flag left out. The flow's folders are keyed
    by their inputs, so another output never lands in one of them."""
    if changes := changed_settings(old, new, stage):
        raise UserError(
            f"{out_dir} holds a finished {stage} output made with other settings or inputs "
            f"({shown(changes)}); bertflow {stage} would replace it.",
            fix=f"choose another --output for these settings (the old ones find {out_dir} again as it "
            f"is), or delete {out_dir} first to replace it.",
        )


def changed_settings(
    old: dict[str, Any], new: dict[str, Any], stage: str, phase_own: set[str] | None = None
) -> list[str]:
    """The key inputs that differ, described, the stage's own settings first. `phase_own`: for a
    phase's stage, the settings its `phases:` entry sets; the others come from the main section."""
    section = base_stage(stage)
    before, after = flat(old, section), flat(new, section)
    names = sorted(set(before) | set(after), key=lambda n: (not n.startswith(f"{section}."), n))
    said = []
    for name in (n for n in names if before.get(n) != after.get(n)):
        inherited = phase_own is not None and name.startswith(f"{section}.")
        inherited = inherited and name.removeprefix(f"{section}.") not in phase_own
        said.append(
            describe(name, before.get(name), after.get(name))
            + (f" (from the main {section}: section)" if inherited else "")
        )
    return said


def left_behind(old: Path, root: Path) -> tuple[str, bool]:
    """What the old output (in the run directory `root`) holds, said so that the user can get it
    back ('' when nothing), and whether it is progress that only the old settings resume."""
    state = progress_state(old)
    if state == "complete":
        return (
            f"Its output under the old key, {old}, is complete and stays: the old settings find it again.",
            False,
        )
    step = newest_verified_step(old)
    if step is None or state == "running":
        return "", False
    return (
        f"Its output under the old key, {old}, was {state} at step {step:,} and stays: only the old "
        f"settings resume it (`{runs_cli(root, f'clean {shlex.quote(str(old))} --yes')}` deletes it).",
        True,
    )


def key_change_note(
    root: Path,
    config_name: str,
    stage: str,
    out: Path,
    inputs: dict[str, Any],
    phase_own: set[str] | None = None,
) -> tuple[str, bool]:
    """('', False) unless `stage` is one of `NOTED_STAGES` and the newest earlier flow run of
    `config_name` in `root` that ran it used another output: then which key inputs changed and
    what that output holds, and whether it holds progress left behind (`left_behind`). `inputs`:
    this run's key inputs of the stage (`stage_key_inputs`); `phase_own`: `changed_settings`."""
    if base_stage(stage) not in NOTED_STAGES:
        return "", False
    for record in flow_runs(root):
        group = str(record.data.get("wandb_group", ""))
        if group != f"{config_name}-{record.name}" or (old := record.output(stage)) is None:
            continue
        if old.name == out.name:
            return "", False
        try:
            old_inputs = json.loads((old / "stage_key.json").read_text())
        except (OSError, ValueError):
            return "", False
        changes = changed_settings(old_inputs, inputs, stage, phase_own)
        if not changes:
            return "", False
        said = (
            f"{stage}: computes under a new key; since flow run {record.name} "
            f"({record.data.get('started_utc', '?')} UTC) of config {config_name!r}: {shown(changes)}."
        )
        kept, lost = left_behind(old, root)
        return f"{said} {kept}".strip(), lost
    return "", False
