"""argparse types of the benchmarks' options: a bad value is refused at once with one line naming
the option (exit 2), not met as a traceback after minutes of set-up, nor measured as something
else (`bench_flow.py --documents 0` timed the whole corpus and printed "0 documents")."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

from model.config import PRESETS


def positive_int(text: str) -> int:
    return _int_from(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_from(text, 0, "an integer of 0 or more")


def _int_from(text: str, minimum: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not {kind}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def preset(text: str) -> str:
    """A model preset's name (`bertflow model-info --preset NAME`)."""
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a model preset; use one of {', '.join(PRESETS)}")
    return text


def preset_batch(text: str) -> tuple[str, int]:
    """PRESET:BATCH, e.g. mini:32."""
    name, colon, batch = text.partition(":")
    try:
        if not colon:
            raise argparse.ArgumentTypeError("it has no ':'")
        return preset(name), positive_int(batch)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not PRESET:BATCH, e.g. mini:32 ({exc})") from None


def int_list(text: str) -> list[int]:
    """Comma-separated integers, at least one (e.g. seeds 1,2,3)."""
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    return values


def comma_list(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """A comma-separated list of some of `choices`."""
    allowed = list(choices)

    def parse(text: str) -> list[str]:
        items = [item for item in text.split(",") if item]
        unknown = [item for item in items if item not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of {', '.join(allowed)}"
            )
        return items

    return parse
