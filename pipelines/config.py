"""The pipeline configuration: one YAML file, validated into typed sections.

Unknown keys and wrong types are errors that name the key (with the closest known key when one is
near); any value can be overridden from the command line with `--set section.key=value` (YAML
syntax for the value; a list setting also takes comma-separated values: `finetune.tasks=sst2,mrpc`;
a pretraining phase's setting by the phase's name: `phases.seq32.pretrain.max_steps=100`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from common.errors import UserError, did_you_mean
from common.paths import check_input_file, data_root, resolve_data_path
from common.settings import DataPath, Section
from common.tracking import WandbTarget
from common.yamlfile import read_user_yaml
from finetuning.config import FinetuneConfig
from model.config import PRESETS
from preprocessing.config import PreprocessConfig, TokenizerConfig
from training.config import PretrainConfig


class ModelSection(Section):
    preset: str | None = Field(
        "tiny", description="null (or unset, with pretrain.init_from): init_from's shape"
    )
    hidden_dropout_prob: float = Field(
        0.1, ge=0, lt=1, description="written into config.json; pretraining uses pretrain.dropout if set"
    )
    attention_probs_dropout_prob: float = Field(0.1, ge=0, lt=1, description="as hidden_dropout_prob")
    max_position_embeddings: int = Field(
        512, gt=0, description="position table size: the longest sequence the model can read"
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str | None) -> str | None:
        if preset is not None and preset not in PRESETS:
            raise PydanticCustomError(
                "unknown_preset",
                "'{preset}' is unknown{hint}; use one of {names}",
                {"preset": preset, "hint": did_you_mean(preset, PRESETS), "names": ", ".join(PRESETS)},
            )
        return preset


class WandbSection(Section):
    project: str = Field("bertflow", description="W&B project of every run")
    mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="WANDB_MODE wins; WANDB_API_KEY turns offline into online"
    )
    entity: str | None = Field(None, description="W&B team or user (null: the API key's default)")

    def target(self, group: str | None) -> WandbTarget:
        """Where the runs of one flow run (or one stage command) go: this section plus a group."""
        return WandbTarget(project=self.project, entity=self.entity, group=group, mode=self.mode)


class ReportSection(Section):
    title: str = Field("BERT pipeline report", description="the report page's heading")


class VerifySection(Section):
    checksums: bool = Field(False, description="also compare sha256 of every input with the checksum file")
    checksum_file: DataPath = Field("data:SHA256SUMS", description="`sha256sum` format, paths relative to it")


class FlowSection(Section):
    retries: int = Field(1, ge=0, description="retries of a stage task after a transient failure")
    retry_delay_seconds: float = Field(10.0, ge=0, le=86400, description="wait before such a retry")


class PhaseSection(Section):
    """A pretraining phase before the main one (BERT's 128 tokens before 512; our 32 before 128):
    the config's own `preprocess:` and `pretrain:` sections with these settings changed. Each phase
    starts from the model of the phase before it, the first from `pretrain.init_from` (or random
    init); the main phase (the sections themselves) starts from the last one's."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="names its stages: pretrain@NAME")
    preprocess: dict[str, Any] = Field(default_factory=dict, description="preprocess settings changed")
    pretrain: dict[str, Any] = Field(default_factory=dict, description="pretrain settings changed")


class PipelineConfig(Section):
    name: str = Field(
        "default", description="names the W&B groups (NAME-<flow run>) and the report's config line"
    )
    run_dir: str = Field(
        "runs", description="every stage writes run_dir/<stage>/<key>/ (relative: to the current directory)"
    )
    data_root: str | None = Field(
        None, description="where data: paths point; null: $BERTFLOW_DATA or ../shared/data"
    )
    wandb: WandbSection = Field(default_factory=WandbSection)
    flow: FlowSection = Field(default_factory=FlowSection)
    verify: VerifySection = Field(default_factory=VerifySection)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    phases: list[PhaseSection] = Field(
        default_factory=list, description="pretraining phases before the main one"
    )
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    report: ReportSection = Field(default_factory=ReportSection)
    # what `load_config` read: the config file (None: none, the built-in defaults) and the --set items
    _source: tuple[str | None, tuple[str, ...]] | None = PrivateAttr(None)
    # the pretraining phase a `phase_config` is of (None: the main one, or the whole config)
    _phase: str | None = PrivateAttr(None)

    def command_line(self, command: str, *args: str) -> str:
        """`bertflow COMMAND CONFIG ARGS --set ITEMS` for this config, quoted for a shell: the config
        file and `--set` items `load_config` was given, so that a hint pasted runs this config (its
        stage keys, its run directory); CONFIG where there was no file (a config built in code)."""
        path, overrides = self._source or (None, ())
        words = ["bertflow", command, path or "CONFIG", *args]
        return shlex.join(words + (["--set", *overrides] if overrides else []))

    def with_section(self, name: Literal["tokenizer", "preprocess"], section: Section) -> PipelineConfig:
        """This config with its section `name` replaced by `section` (a stage command's flags), its
        changed keys added to the `--set` items it was loaded with (a phase's as `phases.NAME.KEY`):
        `command_line` then names a flow command of these settings, which writes the same folder."""
        before = getattr(self, name).model_dump()
        changed = {f"{name}.{k}": v for k, v in section.model_dump().items() if before.get(k) != v}
        items = flag_items(changed, self._phase)
        cfg = self.model_copy(update={name: section})
        path, overrides = self._source or (None, ())
        cfg._source = (path, (*overrides, *items))
        return cfg

    def phase_flag(self) -> tuple[str, ...]:
        """`--phase NAME` for the config of a phase (`phase_config`), which a hint's stage command
        needs to preprocess or pretrain that phase (without it: the main one); () for the main one."""
        return ("--phase", self._phase) if self._phase else ()

    def data_path(self, path: str) -> Path:
        return resolve_data_path(path, self.data_root)

    def resolved_data_root(self) -> Path:
        return data_root(self.data_root)

    def phase_error(self, index: int, err: UserError) -> UserError:
        """`err`, raised checking phase `index` of `phase_config`, said of that phase: `phase NAME: `
        first, and each setting the phase itself changes named as its own (`phases.NAME.pretrain.KEY`,
        as its validation errors and `--set` name it: the main section's key is not the one to fix
        there). The main phase's (`index == len(phases)`) as it is."""
        if index == len(self.phases):
            return err
        phase, text = self.phases[index], str(err)
        for section in ("preprocess", "pretrain"):
            for key in getattr(phase, section):
                own = f"phases.{phase.name}.{section}.{key}"
                text = re.sub(rf"(?<![\w.]){section}\.{re.escape(key)}\b", own, text)
        return UserError(f"phase {phase.name}: {text}")

    def phase_config(self, index: int) -> PipelineConfig:
        """Pretraining phase `index` (0 = the first of `phases`; `len(phases)` = the main one) as a
        config of its own: the phases before it, and its own preprocess and pretrain settings. Its
        stage keys and directories are the ones this config's flow uses for that phase."""
        if index == len(self.phases):
            return self
        # the phases before it as whole sections: as changes, they would apply to this phase's
        # sections, not to the main ones they were written against
        earlier = [
            phase.model_copy(
                update={s: self.phase_section(j, s).model_dump() for s in ("preprocess", "pretrain")}
            )
            for j, phase in enumerate(self.phases[:index])
        ]
        phase = self.model_copy(
            update={
                "phases": earlier,
                "preprocess": self.phase_section(index, "preprocess"),
                "pretrain": self.phase_section(index, "pretrain"),
            }
        )
        phase._phase = self.phases[index].name
        return phase

    def phase_section(self, index: int, section: Literal["preprocess", "pretrain"]) -> Section:
        """Phase `index`'s `preprocess` or `pretrain` section: this config's with the phase's changes."""
        base = getattr(self, section)
        return type(base).model_validate({**base.model_dump(), **getattr(self.phases[index], section)})

    def phase_index(self, name: str | None) -> int:
        """The index of the phase named `name` (None: the main one, after every phase)."""
        names = [phase.name for phase in self.phases]
        if name is None:
            return len(names)
        if name not in names:
            known = ", ".join(names) if names else "none (the config has no phases: section)"
            raise UserError(
                f"--phase {name!r}: no such pretraining phase{did_you_mean(name, names)}; phases: {known}."
            )
        return names.index(name)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {dotted}: {key!r} is not a section.")
    node[keys[-1]] = value


SET_HELP = (
    "override config values, e.g. --set pretrain.max_steps=500 pretrain.lr=1e-3 or --set "
    "finetune.tasks=sst2,mrpc (YAML value; lists also as a,b,c); repeatable"
)


def add_set_argument(parser: Any, dest: str = "overrides") -> None:
    """The `--set SECTION.KEY=VALUE ...` option every command that reads a pipeline YAML takes:
    one or more settings after each `--set`, and `--set` as often as wanted."""
    parser.add_argument(
        "--set", dest=dest, action="extend", nargs="+", default=[], metavar="SECTION.KEY=VALUE", help=SET_HELP
    )


def _field_annotation(keys: list[str]) -> Any:
    """The type annotation of the config field at `keys` (None when there is no such field)."""
    model: Any = PipelineConfig
    annotation: Any = None
    for key in keys:
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields:
            return None
        annotation = fields[key].annotation
        model = annotation
    return annotation


def _is_list_type(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_list_type(a) for a in typing.get_args(annotation))
    return annotation is list or typing.get_origin(annotation) is list


def _override_value(key: str, raw: str) -> Any:
    """YAML for the value; for a list setting, a bare `a,b` or `a` is the list [a, b] / [a]."""
    try:
        value = yaml.safe_load(raw)
        if isinstance(value, str | int | float) and _is_list_type(_field_annotation(key.split("."))):
            return [yaml.safe_load(part.strip()) for part in raw.split(",") if part.strip()]
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise UserError(
            f"--set {key}={raw}: the value is not valid YAML ({problem}).",
            fix=f"quote strings inside brackets (--set '{key}=[\"a*.gz\"]'), or give a list setting "
            f"as a,b without brackets (--set {key}=a*.gz,b.txt).",
        ) from None
    return value


def flag_items(settings: dict[str, Any], phase: str | None = None) -> list[str]:
    """A stage command's flags as `--set` items of its flow command: `KEY=VALUE` for each setting
    (dotted key → value), the value as typed when `--set` reads it back as it (`model.preset=mini`),
    else as JSON (`tokenizer.input=["a.txt"]`); with `phase`, a preprocess or pretrain setting as
    that phase's (`phases.NAME.pretrain.max_steps=100`). Used by every stage command's hints."""
    own = set(PhaseSection.model_fields) - {"name"}  # the sections a phase changes
    items = []
    for key, value in settings.items():
        prefix = f"phases.{phase}." if phase and key.split(".")[0] in own else ""
        items.append(f"{prefix}{key}={_item_value(key, value)}")
    return items


def _item_value(key: str, value: Any) -> str:
    if isinstance(value, str):
        try:
            if _override_value(key, value) == value:
                return value
        except UserError:  # not valid YAML as it is
            pass
    return json.dumps(value)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(
                f"--set {item!r}: expected KEY=VALUE, e.g. --set pretrain.max_steps=100.",
                fix="a config file goes before --set (`bertflow run CONFIG --set KEY=VALUE ...`).",
            )
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), _override_value(key.strip(), raw))
    return tree


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _known_keys(keys: list[str]) -> list[str]:
    """The field names of the config section at `keys` ([] = the top level)."""
    model = PipelineConfig if not keys else _field_annotation(keys)
    return list(getattr(model, "model_fields", {}) or {})


def bad_flag_value(flag: str, value: Any, exc: ValidationError, key: str, kept: Any) -> UserError:
    """The one message for a command-line flag whose value its setting `key` (section.name)
    refuses; `kept`: the setting's value without the flag."""
    return UserError(
        f"bad flag value {flag} {value}: {validation_message(exc, key.split('.')[0])}.",
        fix=f"give {flag} a value {key} accepts, or leave it out to keep {kept!r}.",
    )


def section_flag_error(
    exc: ValidationError, section: str, flagged: dict[str, Any], kept: dict[str, Any]
) -> UserError:
    """A stage command's settings refused by `section`'s schema: said as the flag's (`bad_flag_value`,
    `--key-name`) where a flag gave the refused value (`flagged`: key → the flag's value; `kept`: the
    section's values without the flags), else as the section's."""
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else ""
        if key in flagged and not isinstance(flagged[key], list):  # (a list's own message names its entry)
            return bad_flag_value(
                f"--{key.replace('_', '-')}", flagged[key], exc, f"{section}.{key}", kept.get(key)
            )
    return UserError(f"invalid {section} settings: {validation_message(exc, section)}")


def validation_message(exc: ValidationError, section: str | None = None) -> str:
    """A pydantic error as one line per key: `section.key: reason (got value)`, joined by '; '.
    An unknown key names the closest known key of its section when one is near."""
    lines = []
    for err in exc.errors():
        loc = [str(x) for x in ([section] if section else []) + list(err["loc"])]
        key = ".".join(loc)
        if err["type"] == "extra_forbidden":
            parent = "".join(f"{k}." for k in loc[:-1])
            msg = "unknown key" + did_you_mean(loc[-1], _known_keys(loc[:-1]), prefix=parent)
        else:
            msg = err["msg"]
        lines.append(f"{key}: {msg} (got {err.get('input')!r})")
    return "; ".join(lines)


def _merge_phases(phases: Any, changes: dict[str, Any]) -> list[Any]:
    """`--set phases.NAME.SECTION.KEY=VALUE` overrides merged into the phase of that name."""
    merged = list(phases) if isinstance(phases, list) else []
    names = [phase.get("name") if isinstance(phase, dict) else None for phase in merged]
    for name, change in changes.items():
        if name not in names:
            raise UserError(
                f"--set phases.{name}...: the config has no pretraining phase named {name!r}"
                f"{did_you_mean(name, [n for n in names if n])}.",
                fix="name one of its phases: " + (", ".join(n for n in names if n) or "it has none") + ".",
            )
        index = names.index(name)
        merged[index] = _merge(merged[index], change if isinstance(change, dict) else {})
    return merged


def _check_phases(cfg: PipelineConfig, where: str, overrides: list[str] | None = None) -> None:
    """Each phase's settings valid as a section of their own, its name unique, no init_from of its own."""
    names = [phase.name for phase in cfg.phases]
    for index, phase in enumerate(cfg.phases):
        if names.count(phase.name) > 1:
            raise UserError(
                f"{_blamed([f'phases.{phase.name}.name'], where, overrides)}: two pretraining phases are "
                f"named {phase.name!r}.",
                fix="name each phase once.",
            )
        if "init_from" in phase.pretrain:
            blamed = _blamed([f"phases.{phase.name}.pretrain.init_from"], where, overrides)
            raise UserError(
                f"{blamed}: phases.{phase.name}.pretrain.init_from: a phase starts from the phase before it.",
                fix="remove it; pretrain.init_from (the main section's) is where the first phase starts.",
            )
        for section in ("preprocess", "pretrain"):
            try:
                cfg.phase_section(index, section)
            except ValidationError as exc:
                message = validation_message(exc, section).replace(
                    f"{section}.", f"phases.{phase.name}.{section}."
                )
                changed = getattr(phase, section)  # a key the phase leaves alone is the section's
                failed = [
                    (f"phases.{phase.name}.{section}." if key[0] in changed else f"{section}.")
                    + ".".join(key)
                    for err in exc.errors()
                    for key in _error_keys(err)
                ]
                raise UserError(f"{_blamed(failed, where, overrides)} is invalid: {message}") from None


def _error_keys(err: Any) -> list[tuple[str, ...]]:
    """The settings one validation error is about: its own, and for a rule between settings of a
    section (its `with` context, e.g. warmup_steps with max_steps) the others."""
    loc = tuple(str(x) for x in err["loc"])
    return [loc, *(loc[:-1] + (other,) for other in (err.get("ctx") or {}).get("with", ()))]


def _failed_keys(exc: ValidationError, raw: dict[str, Any]) -> list[str]:
    """The dotted keys a validation error is about (`_error_keys`), a phase by its name as `--set` names it
    (`phases.seq32.pretrain.lr`, not `phases.0...`)."""
    return [_by_phase_name(".".join(key), raw) for err in exc.errors() for key in _error_keys(err)]


def _by_phase_name(text: str, raw: dict[str, Any]) -> str:
    """`text` (a key, a message) with each phase of the config `raw` named as `--set` and every other
    message name it, `phases.seq32.pretrain.lr`, not by its index (pydantic's `phases.0.pretrain.lr`)."""
    phases = raw.get("phases") if isinstance(raw.get("phases"), list) else []
    for index, phase in enumerate(phases):
        if isinstance(phase, dict) and isinstance(phase.get("name"), str) and phase["name"]:
            text = text.replace(f"phases.{index}.", f"phases.{phase['name']}.")
    return text


def _blamed(failed: list[str], where: str, overrides: list[str] | None) -> str:
    """What a validation error about the `failed` keys is about: the `--set` items when they set
    every one of them, else `where` (the config file), with the `--set` items among them if any."""

    def sets(item: str, key: str) -> bool:  # the item sets the key, below it, or a section it made
        name = item.split("=", 1)[0].strip()
        return key == name or key.startswith(name + ".") or name.startswith(key + ".")

    blamed = [item for item in overrides or [] if any(sets(item, key) for key in failed)]
    if not blamed:
        return where
    items = " ".join(f"--set {item}" for item in blamed)
    return (
        items if all(any(sets(item, key) for item in blamed) for key in failed) else f"{where} with {items}"
    )


def load_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read, merge overrides into, and validate a pipeline YAML. Errors name the file and key."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        check_input_file(p, "config file", fix="pass an existing YAML, e.g. configs/default.yaml.")
        raw = read_user_yaml(p, "config file")
        if raw is None or raw == {}:  # every default would run: a 6-minute flow into ./runs
            what = "it is empty or only comments" if raw is None else f"it holds only {raw!r}"
            raise UserError(
                f"config file {p} holds no settings ({what}); it would run every "
                "built-in default, as config 'default' into ./runs.",
                fix="write your settings into it (docs/config.md lists every key), or pass "
                "configs/default.yaml to run the default.",
            )
        if not isinstance(raw, dict):
            raise UserError(f"config file {p} must hold a mapping of sections, got {type(raw).__name__}.")
    over = parse_overrides(overrides)
    if isinstance(over.get("phases"), dict):  # --set phases.NAME.pretrain.max_steps=50
        raw["phases"] = _merge_phases(raw.get("phases"), over.pop("phases"))
    raw = _merge(raw, over)
    where = f"config file {path}" if path else "config"
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        blamed = _blamed(_failed_keys(exc, raw), where, overrides)
        raise UserError(f"{blamed} is invalid: {_by_phase_name(validation_message(exc), raw)}") from None
    _check_phases(cfg, where, overrides)
    # an unknown task is found where units are planned (finetuning.units): it names this source
    tasks_where = f"finetune.tasks in {where}" if path else "finetune.tasks"
    cfg.finetune.tasks_from = _blamed(["finetune.tasks"], tasks_where, overrides)
    if cfg.pretrain.init_from and "preset" not in cfg.model.model_fields_set:
        cfg.model.preset = None  # the model is init_from's; the record must not name a default preset
    if cfg.model.preset is None and not cfg.pretrain.init_from:
        blamed = _blamed(["model.preset", "pretrain.init_from"], where, overrides)
        raise UserError(
            f"{blamed}: model.preset is null, which means pretrain.init_from's shape, but "
            "pretrain.init_from is not set.",
            fix="name a preset (tiny, mini, small, medium, base, large) or set pretrain.init_from.",
        )
    cfg._source = (None if path is None else str(path), tuple(overrides or ()))
    return cfg
