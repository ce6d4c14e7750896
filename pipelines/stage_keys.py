"""Where each stage's output goes for a config: `run_dir/<stage>/<key>/`.

A stage's key is a short hash of everything that determines its output: its own config section
(plus the `model:` section where the model is built), the keys of the stages it reads from, and
fingerprints of the files it reads (corpus files by path, size and sha256, so a corpus copied again
or touched keeps its key; see common/fingerprint.py). Change any of those and the key changes,
so the stage (and only the stages downstream of it) recompute; change nothing and every completed
stage is found again. A stage directory is complete when its `_COMPLETE.json` marker exists (the
marker is written last, so a killed run never looks finished).

The flow AND the single-stage commands (`bertflow pretrain CONFIG`, ...) call `stage_dir` so a stage
run alone writes exactly where the flow would look for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from common.atomic import read_marker
from common.fingerprint import KEY_LENGTH, content_digest, content_stamp, digest, model_dir_stamp
from common.paths import PROJECT_ROOT
from pipelines.config import PipelineConfig
from preprocessing.corpus import match_inputs

STAGES: tuple[str, ...] = ("verify", "tokenizer", "preprocess", "pretrain", "finetune", "report")


def corpus_stamps(cfg: PipelineConfig, patterns: list[str]) -> list[dict[str, Any]]:
    """Stamps of the files the corpus entries name, plus one `missing` entry per entry naming none."""
    files, unmatched = match_inputs(patterns, cfg.data_root)
    return [content_stamp(p) for p in files] + [
        {"path": str(cfg.data_path(p)), "missing": True} for p in unmatched
    ]


def _config_file_digest(path: str | None) -> str | None:
    """Small config files (DeepSpeed JSON, task YAML, hostfile) enter a key by content; a relative
    path that does not exist here is looked up in the project."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = PROJECT_ROOT / p
    return content_digest(p) if p.is_file() else f"missing:{path}"


def stage_key_inputs(cfg: PipelineConfig) -> dict[str, dict[str, Any]]:
    """What each stage's key is a hash of (written next to the outputs as `stage_key.json`)."""
    tok = {
        "stage": "tokenizer",
        "config": cfg.tokenizer.model_dump(mode="json"),
        "inputs": corpus_stamps(cfg, cfg.tokenizer.input),
        "vocab": content_stamp(cfg.data_path(cfg.tokenizer.vocab)) if cfg.tokenizer.vocab else None,
    }
    tok_key = digest(tok, KEY_LENGTH)
    prep = {
        "stage": "preprocess",
        "config": cfg.preprocess.model_dump(mode="json"),
        "inputs": corpus_stamps(cfg, cfg.preprocess.input),
        "tokenizer": tok_key,
    }
    prep_key = digest(prep, KEY_LENGTH)
    pre = {
        "stage": "pretrain",
        "config": cfg.pretrain.model_dump(mode="json"),
        "model": cfg.model.model_dump(mode="json"),
        "deepspeed_config": _config_file_digest(cfg.pretrain.deepspeed_config),
        "hostfile": _config_file_digest(cfg.pretrain.hostfile),
        "init_from": model_dir_stamp(cfg.pretrain.init_from) if cfg.pretrain.init_from else None,
        "preprocess": prep_key,
        "tokenizer": tok_key,
    }
    pre_key = digest(pre, KEY_LENGTH)
    fin = {
        "stage": "finetune",
        "config": cfg.finetune.model_dump(mode="json"),
        "task_config": _config_file_digest(cfg.finetune.task_config),
        "model": cfg.model.model_dump(mode="json"),
        "data_root": str(cfg.resolved_data_root()),
        "pretrain": pre_key,
        "tokenizer": tok_key,
    }
    fin_key = digest(fin, KEY_LENGTH)
    rep = {
        "stage": "report",
        "config": cfg.report.model_dump(mode="json"),
        "pretrain": pre_key,
        "finetune": fin_key,
    }
    verify = {
        "stage": "verify",
        "config": cfg.verify.model_dump(mode="json"),
        "tokenizer": tok["inputs"],
        "preprocess": prep["inputs"],
        "tasks": cfg.finetune.tasks,
        "task_config": fin["task_config"],
        "data_root": str(cfg.resolved_data_root()),
    }
    return {
        "verify": verify,
        "tokenizer": tok,
        "preprocess": prep,
        "pretrain": pre,
        "finetune": fin,
        "report": rep,
    }


def stage_keys(cfg: PipelineConfig) -> dict[str, str]:
    """stage name → key, for every stage in `STAGES`."""
    return {stage: digest(inputs, KEY_LENGTH) for stage, inputs in stage_key_inputs(cfg).items()}


def run_root(cfg: PipelineConfig) -> Path:
    """The run directory (relative paths are relative to the current directory)."""
    return Path(cfg.run_dir).expanduser().resolve()


def stage_dir(cfg: PipelineConfig, stage: str) -> Path:
    """THE output directory of `stage` for this config: `run_dir/<stage>/<key>/`."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return run_root(cfg) / stage / stage_keys(cfg)[stage]


def stage_dirs(cfg: PipelineConfig) -> dict[str, Path]:
    keys = stage_keys(cfg)
    root = run_root(cfg)
    return {stage: root / stage / key for stage, key in keys.items()}


def is_complete(directory: str | os.PathLike) -> bool:
    return read_marker(directory) is not None
