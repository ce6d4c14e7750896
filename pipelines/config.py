"""The pipeline configuration: one YAML file, validated into typed sections.

Unknown keys and wrong types are errors that name the key; any value can be overridden from
the command line with `--set section.key=value` (YAML syntax for the value).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import UserError
from common.paths import data_root, resolve_data_path
from common.tracking import WandbTarget
from finetuning.config import FinetuneConfig
from model.config import PRESETS
from preprocessing.config import PreprocessConfig, TokenizerConfig
from training.config import PretrainConfig


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: str = "tiny"
    hidden_dropout_prob: float = Field(0.1, ge=0, lt=1)
    attention_probs_dropout_prob: float = Field(0.1, ge=0, lt=1)
    max_position_embeddings: int = Field(512, gt=0)


class WandbSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = "bertflow"
    mode: str = Field("offline", description="offline | online | disabled; WANDB_MODE wins")
    entity: str | None = None

    def target(self, group: str | None) -> WandbTarget:
        """Where the runs of one flow run (or one stage command) go: this section plus a group."""
        return WandbTarget(project=self.project, entity=self.entity, group=group, mode=self.mode)


class ReportSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = "BERT pipeline report"


class VerifySection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checksums: bool = Field(False, description="also compare sha256 of every input with the checksum file")
    checksum_file: str = Field("data:SHA256SUMS", description="`sha256sum` format, paths relative to it")


class FlowSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retries: int = Field(1, ge=0, description="retries of a stage task after a transient failure")
    retry_delay_seconds: float = Field(10.0, ge=0)


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "default"
    run_dir: str = "runs"
    data_root: str | None = None
    wandb: WandbSection = Field(default_factory=WandbSection)
    flow: FlowSection = Field(default_factory=FlowSection)
    verify: VerifySection = Field(default_factory=VerifySection)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    model: ModelSection = Field(default_factory=ModelSection)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig)
    report: ReportSection = Field(default_factory=ReportSection)

    def data_path(self, path: str) -> Path:
        return resolve_data_path(path, self.data_root)

    def resolved_data_root(self) -> Path:
        return data_root(self.data_root)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"--set {dotted}: {key!r} is not a section.")
    node[keys[-1]] = value


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set pretrain.max_steps=100.")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw))
    return tree


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validation_message(exc: ValidationError, section: str | None = None) -> str:
    """A pydantic error as one line per key: `section.key: reason (got value)`, joined by '; '."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(x) for x in ([section] if section else []) + list(err["loc"]))
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{key}: {msg} (got {err.get('input')!r})")
    return "; ".join(lines)


def load_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read, merge overrides into, and validate a pipeline YAML. Errors name the file and key."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(
                f"config file {p} does not exist.", fix="pass an existing YAML, e.g. configs/default.yaml."
            )
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as exc:
            raise UserError(f"config file {p} is not UTF-8 text: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).replace("\n", " ")
            raise UserError(f"config file {p} is not valid YAML{at}: {problem}.") from None
        if not isinstance(raw, dict):
            raise UserError(f"config file {p} must hold a mapping of sections, got {type(raw).__name__}.")
    raw = _merge(raw, parse_overrides(overrides))
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        where = f"config file {path}" if path else "config"
        raise UserError(f"{where} is invalid: {validation_message(exc)}") from None
    if cfg.model.preset not in PRESETS:
        raise UserError(
            f"{path or 'config'}: model.preset {cfg.model.preset!r} is unknown; use one of {', '.join(PRESETS)}."
        )
    return cfg
