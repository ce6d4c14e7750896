"""docs/config.md, every key of a pipeline config with its default and meaning, written from the
schema itself (`PipelineConfig` and its sections' `Field` descriptions), so it cannot drift from
what the YAML accepts: `python -m pipelines.config_reference > docs/config.md`
(`tests/test_config.py` checks that the file is current)."""

from __future__ import annotations

import json
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipelines.config import PipelineConfig

HEADER = """# Config keys

Every key a pipeline YAML (`configs/*.yaml`) takes, with its default when the key is left out (the
shipped configs set many of them) and what it means. `--set section.key=value` changes any of them
from the command line. *run-only* keys say how a stage runs, not what it produces: they are not in
the stage's key, so changing one reuses a finished output or resumes a killed one (README, "Running
the flow"). Written from the schema by `python -m pipelines.config_reference`; do not edit by hand.
"""


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return "`" + json.dumps(value) + "`"


def _choices(kind: Any) -> list[Any]:
    """The values a `Literal[...]` setting allows (none for other types)."""
    return list(get_args(kind)) if get_origin(kind) is Literal else []


def _rows(section: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    run_only = set(getattr(section, "run_only", ()))
    for name, field in section.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            continue
        note = " *run-only*" if name in run_only else ""
        choices = " / ".join(f"`{c}`" for c in _choices(kind))
        text = "; ".join(t for t in (choices and f"one of {choices}", field.description) if t)
        text = text.replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_default(field)} | {text}{note} |")
    return rows


def reference() -> str:
    """The whole of docs/config.md."""
    parts = [HEADER, "## Top level\n", "| key | default | meaning |", "|---|---|---|"]
    parts += _rows(PipelineConfig, "")
    for name, field in PipelineConfig.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            doc = (kind.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            parts += ["", f"## `{name}:`\n"] + ([doc, ""] if doc else [])
            parts += ["| key | default | meaning |", "|---|---|---|"] + _rows(kind, f"{name}.")
    phase = PipelineConfig.model_fields["phases"].annotation.__args__[0]  # list[PhaseSection]
    parts += ["", "## `phases:` (a list; each item)\n", "| key | default | meaning |", "|---|---|---|"]
    parts += _rows(phase, "phases[].")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
