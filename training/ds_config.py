"""The DeepSpeed JSON for one run: a template from infra/deepspeed/ plus the run's settings.

The template holds ZeRO and loss-scaling knobs; batch sizes, precision, clipping and the ZeRO
stage override come from the pretrain config / CLI. Anything in the template that contradicts
them is refused here, before a process is launched.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.jsonfile import read_json_object
from common.paths import PROJECT_ROOT
from training.config import PretrainConfig


def resolve_template(path: str) -> Path:
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = PROJECT_ROOT / path
    return p


def load_template(path: str) -> dict[str, Any]:
    return read_json_object(
        resolve_template(path),
        "DeepSpeed config",
        missing=f"DeepSpeed config {path} does not exist.",
        missing_fix="set pretrain.deepspeed_config to one of infra/deepspeed/zero{0,1,2,3}.json.",
        invalid_fix="fix the JSON, or start again from one of infra/deepspeed/zero{0,1,2,3}.json.",
    )


def resolve_precision(requested: str, template: dict[str, Any], on_gpu: bool, bf16_ok: bool) -> str:
    """'auto' → bf16 on a bf16-capable GPU, else fp32 (or what the template enables)."""
    tmpl = [k for k in ("fp16", "bf16") if isinstance(template.get(k), dict) and template[k].get("enabled")]
    if len(tmpl) > 1:
        raise UserError("DeepSpeed config enables both fp16 and bf16; enable at most one.")
    if requested == "auto":
        precision = tmpl[0] if tmpl else ("bf16" if on_gpu and bf16_ok else "fp32")
    else:
        if tmpl and tmpl[0] != requested:
            raise UserError(
                f"DeepSpeed config enables {tmpl[0]} but pretrain.precision is {requested!r}.",
                fix="remove the 'enabled' flag from the JSON or make pretrain.precision match.",
            )
        precision = requested
    if precision == "fp16" and not on_gpu:
        raise UserError(
            "pretrain.precision fp16 needs a GPU: DeepSpeed refuses fp16 on CPU.",
            fix="use precision fp32 or bf16 (or auto) on CPU.",
        )
    return precision


# the Muon refusal's fix, in the config's words (`bertflow pretrain` says it as its flag: name_the_flags)
MUON_ZERO_FIX = "set pretrain.zero_stage: 0, or use optimizer adamw."


def resolve_zero_stage(
    cfg: PretrainConfig, world_size: int, template: dict[str, Any] | None = None, src: str | None = None
) -> int:
    """The run's ZeRO stage: pretrain.zero_stage, else the template's (0 for one process that
    offloads nothing). Refuses a stage that does not exist and Muon at any stage but 0, so the
    flow can check it before any stage runs (pipelines/flow_command.py)."""
    src = src or cfg.deepspeed_config
    template = load_template(src) if template is None else template
    zero = template.get("zero_optimization", {})
    origin = "pretrain.zero_stage" if cfg.zero_stage is not None else src
    stage = cfg.zero_stage if cfg.zero_stage is not None else zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(
            f"ZeRO stage {stage} does not exist (from {origin}).", fix="use a ZeRO stage of 0, 1, 2 or 3."
        )
    offload_asked = any(
        zero.get(key, {}).get("device") in ("cpu", "nvme") for key in ("offload_optimizer", "offload_param")
    )
    if world_size == 1 and cfg.zero_stage is None and stage > 0 and not offload_asked:
        # One process has nothing to partition: ZeRO 1-3 would only add flat-buffer copies and
        # gradient hooks (~13% of a base step on CPU, docs/benchmarks.md §3). A stage given
        # explicitly (pretrain.zero_stage) is kept as given.
        stage = 0
    if cfg.optimizer == "muon" and stage != 0:
        raise UserError(
            f"pretrain.optimizer muon needs ZeRO stage 0; this run's is {stage} (from {origin}). DeepSpeed's "
            "ZeRO 1 and 2 clip Muon's orthogonalized update as if it were the gradient (every Muon step of the "
            "tiny model shrank ~40x), and its ZeRO 3 refuses Muon with reduce-scatter.",
            fix=MUON_ZERO_FIX,
        )
    return stage


def build_ds_config(
    cfg: PretrainConfig, world_size: int, on_gpu: bool, bf16_ok: bool, template_path: str | None = None
) -> dict[str, Any]:
    src = template_path or cfg.deepspeed_config
    template = load_template(src)
    check_run_owned_keys(cfg, template, src)
    ds = copy.deepcopy(template)
    zero = ds.setdefault("zero_optimization", {})
    stage = resolve_zero_stage(cfg, world_size, template, src)
    zero["stage"] = stage
    if stage == 0:
        for key in ("offload_optimizer", "offload_param"):
            zero.pop(key, None)
    elif stage < 3:
        zero.pop("offload_param", None)

    micro, accum = cfg.micro_batch_size, cfg.gradient_accumulation_steps
    train_batch = micro * accum * world_size
    for key, want in (
        ("train_micro_batch_size_per_gpu", micro),
        ("gradient_accumulation_steps", accum),
        ("train_batch_size", train_batch),
    ):
        have = template.get(key)
        if have is not None and have != "auto" and have != want:
            raise UserError(
                f"DeepSpeed config {src}: {key}={have} contradicts the run's batch settings "
                f"(micro batch {micro} x accumulation {accum} x {world_size} processes = {train_batch}).",
                fix=f"remove {key} from the JSON (the run sets it) or change the CLI/config values to match.",
            )
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["gradient_accumulation_steps"] = accum
    ds["train_batch_size"] = train_batch
    ds["gradient_clipping"] = cfg.gradient_clipping
    ds.setdefault("zero_allow_untested_optimizer", True)
    ds.setdefault("steps_per_print", 10**9)

    precision = resolve_precision(cfg.precision, template, on_gpu, bf16_ok)
    if precision == "bf16" and on_gpu and not bf16_ok:
        raise UserError("pretrain.precision bf16: this GPU has no bf16 support.", fix="use fp16 or fp32.")
    ds.setdefault("fp16", {})["enabled"] = precision == "fp16"
    ds.setdefault("bf16", {})["enabled"] = precision == "bf16"
    offload = zero.get("offload_optimizer", {}).get("device") in ("cpu", "nvme")
    if offload and not on_gpu:
        raise UserError(
            f"DeepSpeed config {src} offloads the optimizer to CPU, which only makes sense with a GPU "
            "(and needs DeepSpeed's CPU Adam op).",
            fix="use infra/deepspeed/zero{0,1,2,3}.json on a CPU-only machine.",
        )
    if offload and cfg.optimizer == "lamb":
        raise UserError(
            f"DeepSpeed config {src} offloads the optimizer, which DeepSpeed allows only for its own "
            "CPU Adam, not pretrain.optimizer lamb.",
            fix="use pretrain.optimizer adamw with offload, or a template without offload_optimizer for lamb.",
        )
    return ds


def check_run_owned_keys(cfg: PretrainConfig, template: dict[str, Any], src: str) -> None:
    """The optimizer and lr schedule are the run's (`pretrain.optimizer`, `lr`, `warmup_steps`, ...):
    DeepSpeed silently prefers the ones the run passes over a template's, so a template's would be
    recorded as used but ignored; a different `gradient_clipping` likewise."""
    for key, setting in (
        ("optimizer", "pretrain.optimizer and pretrain.lr"),
        ("scheduler", "pretrain.warmup_steps"),
    ):
        if key in template:
            raise UserError(
                f"DeepSpeed config {src} has an {key!r} section, which the run would ignore: the run "
                f"builds its own from {setting}.",
                fix=f"remove {key!r} from the JSON and set {setting} in the pipeline config.",
            )
    clip = template.get("gradient_clipping")
    if clip is not None and clip != cfg.gradient_clipping:
        raise UserError(
            f"DeepSpeed config {src}: gradient_clipping={clip} contradicts pretrain.gradient_clipping "
            f"{cfg.gradient_clipping}.",
            fix="remove gradient_clipping from the JSON (the run sets it) or set pretrain.gradient_clipping to match.",
        )


def precision_of(ds: dict[str, Any]) -> str:
    if ds.get("bf16", {}).get("enabled"):
        return "bf16"
    if ds.get("fp16", {}).get("enabled"):
        return "fp16"
    return "fp32"


def offloads_optimizer(ds: dict[str, Any]) -> bool:
    return ds.get("zero_optimization", {}).get("offload_optimizer", {}).get("device") in ("cpu", "nvme")
