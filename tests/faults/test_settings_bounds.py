"""Every numeric setting of every stage section is checked when the config is read (issue 14,
item 9): NaN, infinity, a negative value and an integer no C type holds are each one UserError
naming `section.key`, before any process starts. The test walks the sections' fields, so a
setting added later is covered without touching it."""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import BaseModel

from common.errors import UserError
from pipelines.config import PipelineConfig, load_config


def _numeric_kinds(annotation: object) -> set[type]:
    """int/float inside an annotation (Optional, list[...], Annotated[...])."""
    if annotation in (int, float):
        return {annotation}
    kinds: set[type] = set()
    for arg in typing.get_args(annotation):
        kinds |= _numeric_kinds(arg)
    return kinds


def _numeric_settings() -> list[tuple[str, str, set[type], bool]]:
    found = []
    for section, field in PipelineConfig.model_fields.items():
        cls = field.annotation
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            for name, info in cls.model_fields.items():
                kinds = _numeric_kinds(info.annotation)
                if kinds:
                    found.append((section, name, kinds, typing.get_origin(info.annotation) is list))
    return found


SETTINGS = _numeric_settings()


def test_the_walk_finds_every_stage_section() -> None:
    sections = {s for s, *_ in SETTINGS}
    assert {"flow", "tokenizer", "preprocess", "model", "pretrain", "finetune"} <= sections
    assert ("finetune", "lrs") in {(s, n) for s, n, *_ in SETTINGS}  # list elements too


@pytest.mark.parametrize(
    ("section", "name", "kinds", "is_list"), SETTINGS, ids=[f"{s}.{n}" for s, n, *_ in SETTINGS]
)
def test_bad_numbers_are_refused_naming_the_key(
    section: str, name: str, kinds: set[type], is_list: bool
) -> None:
    bad = ["-1"]
    if float in kinds:
        bad += [".nan", ".inf", "-.inf"]
    if int in kinds and float not in kinds:
        bad += [str(2**63)]
    for value in bad:
        text = f"[{value}]" if is_list else value
        with pytest.raises(UserError) as exc:
            load_config(None, [f"{section}.{name}={text}"])
        assert f"{section}.{name}" in str(exc.value), (value, str(exc.value))


@pytest.mark.parametrize(
    ("section", "name", "kinds", "is_list"), SETTINGS, ids=[f"{s}.{n}" for s, n, *_ in SETTINGS]
)
def test_a_boolean_is_not_a_number(section: str, name: str, kinds: set[type], is_list: bool) -> None:
    """pydantic's lax mode read true as 1: `--set pretrain.max_steps=yes` trained one step."""
    for value in ("yes", "true", "off"):
        text = f"[{value}]" if is_list else value
        with pytest.raises(UserError) as exc:
            load_config(None, [f"{section}.{name}={text}"])
        assert f"{section}.{name}" in str(exc.value), (value, str(exc.value))


def test_numbers_of_the_other_kind_still_load() -> None:
    """An int where a float is expected stays a float; booleans stay booleans where they belong."""
    cfg = load_config(
        None, ["finetune.epochs=3", "pretrain.lr=1", "finetune.lrs=[1]", "verify.checksums=yes"]
    )
    assert cfg.finetune.epochs == 3.0 and cfg.pretrain.lr == 1.0 and cfg.finetune.lrs == [1.0]
    assert cfg.verify.checksums is True


def test_finetune_flags_are_checked_the_same_way() -> None:
    """A negative fine-tuning lr used to fail inside every unit with a traceback."""
    import argparse

    from pipelines.stage_finetune import add_arguments, apply_flags

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = load_config(None).finetune
    refused = [
        (["--lr=-1e-5"], "--lr -1e-5: finetune.lrs"),
        (["--lr", "nan"], "--lr nan: finetune.lrs"),
        (["--seed=-1"], "--seed -1: finetune.seeds"),
        (["--epochs", "inf"], "--epochs inf: finetune.epochs"),
        (["--workers", "0"], "--workers 0: finetune.concurrency"),
        (["--epochs", "0", "--batch-size", "0"], "--epochs 0.0: finetune.epochs"),
    ]
    for flag, named in refused:
        with pytest.raises(UserError, match=f"bad flag value {named}"):
            apply_flags(cfg, parser.parse_args(flag))
    # a value that is no number at all is named by its flag alone
    for flag, named in [
        (["--lr", "1e-3,fast"], "--lr: could not convert"),
        (["--seed", "1,x"], "--seed: invalid"),
    ]:
        with pytest.raises(UserError, match=named):
            apply_flags(cfg, parser.parse_args(flag))


@pytest.mark.parametrize(
    "command, flags, named",
    [
        ("preprocess", ["--dupe-factor", "0"], "bad flag value --dupe-factor 0: preprocess.dupe_factor"),
        ("preprocess", ["--workers", "0"], "bad flag value --workers 0: preprocess.workers"),
        ("tokenizer", ["--vocab-size", "0"], "bad flag value --vocab-size 0: tokenizer.vocab_size"),
    ],
)
def test_preprocess_and_tokenizer_flags_are_named_as_pretrains_are(command, flags, named) -> None:
    """`bertflow preprocess --dupe-factor 0` said 'invalid preprocess settings: preprocess.dupe_factor:
    ...' with no flag and no fix, where `bertflow pretrain --max-steps -1` names the flag and the fix."""
    import argparse
    import importlib

    module = importlib.import_module(f"pipelines.stage_{command}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with pytest.raises(UserError, match=re.escape(named)) as exc:
        module.main(parser.parse_args(flags))
    assert f"Fix: give {flags[0]} a value" in str(exc.value)
