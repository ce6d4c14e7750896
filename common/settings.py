"""The base of every config section: unknown keys refused, every number finite and in range.

Each stage's section (`tokenizer:`, `preprocess:`, `pretrain:`, ...) derives from `Section`, so a
bad value is one message naming `section.key` when the YAML is read, before any process starts:
NaN and infinity are refused everywhere (`allow_inf_nan=False`), and every integer (also inside a
list) must fit a C int, which is what torch, numpy and the Rust tokenizer turn it into. Fields add
their own bounds (`Field(gt=0, le=1)`); seeds use `Seed`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from common.paths import EMPTY_DATA_PATH, is_empty_data_path

INT_MAX = 2**31 - 1
Seed = Annotated[int, Field(ge=0, le=INT_MAX, description="random seed, 0 .. 2**31-1")]


def _not_an_empty_data_path(path: str) -> str:
    if is_empty_data_path(path):
        raise PydanticCustomError("empty_data_path", EMPTY_DATA_PATH)
    return path


# a path that may start with `data:` (relative to the data root), refused when nothing follows it
DataPath = Annotated[str, AfterValidator(_not_an_empty_data_path)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    # settings that say how a stage runs (workers, logging and checkpoint cadence, ports, scratch
    # places), never what it produces: out of the stage's key (pipelines/stage_keys.py), so changing
    # one reuses a finished output or resumes a killed one instead of starting again
    run_only: ClassVar[tuple[str, ...]] = ()
    # settings added after outputs and checkpoints were made without them: left out of keys and
    # resume checks while at their default, so those outputs are found and resumed after an upgrade
    added_later: ClassVar[tuple[str, ...]] = ()

    def output_settings(self) -> dict[str, Any]:
        """This section as JSON without its run-only settings: what decides the stage's output."""
        return self.settings_without(self.run_only)

    def settings_without(self, left_out: Iterable[str]) -> dict[str, Any]:
        """This section as JSON without `left_out`, nor the settings of `added_later` that hold
        their default (so a key or record made before they existed still matches)."""
        fields = type(self).model_fields
        defaulted = {name for name in self.added_later if getattr(self, name) == fields[name].default}
        return self.model_dump(mode="json", exclude=set(left_out) | defaulted)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, bool) for item in items) and _numbers_not_booleans(annotation):
            raise PydanticCustomError(
                "bool_for_number",
                "Input should be a number, not a boolean (YAML reads yes/no, on/off, true/false as booleans)",
            )
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _ints_fit_a_c_int(cls, value: Any) -> Any:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > INT_MAX:
                raise ValueError(f"must be at most {INT_MAX}")
        return value


def _numbers_not_booleans(annotation: Any) -> bool:
    """Whether a field of this type takes numbers (int or float, also in a list or an Optional) and
    no boolean: pydantic's lax mode turns true into 1, so `max_steps: yes` ran one step."""
    leaves = _leaf_types(annotation)
    return bool(leaves & {int, float}) and bool not in leaves


def _leaf_types(annotation: Any) -> set[Any]:
    """The types inside unions, Optionals, lists and Annotated of `annotation`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, typing.Annotated):
        args = typing.get_args(annotation)
        return set().union(*(_leaf_types(a) for a in (args[:1] if origin is typing.Annotated else args)))
    return {annotation}
