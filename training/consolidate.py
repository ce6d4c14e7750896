"""A DeepSpeed checkpoint (any ZeRO stage, any number of ranks) → one fp32 BertForPreTraining.

ZeRO 1/2/3 keep the fp32 master weights partitioned across the optimizer files of every rank;
DeepSpeed's `zero_to_fp32` merges them (and restores shared/tied parameters). ZeRO 0 keeps the
full module in `mp_rank_00_model_states.pt`. The model shape comes from the `model_config`
recorded in the checkpoint's `_VERIFIED.json`, so the checkpoint is self-describing.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining
from model.hf_io import TIED_KEYS
from training import checkpoint


def resolve_tag_dir(ckpt_dir: str | os.PathLike) -> Path:
    """Accept a run dir, its checkpoints/ dir, or one global_stepN dir; return a verified tag dir."""
    path = Path(ckpt_dir)
    if checkpoint.step_of(path) is not None:
        problem = checkpoint.verify(path)
        if problem:
            raise UserError(f"checkpoint {path} is not usable: {problem}.", fix="use an older global_stepN.")
        return path
    for root in (path / "checkpoints", path):
        found = checkpoint.newest_good(root) if root.is_dir() else None
        if found is not None:
            return found[0]
    raise UserError(
        f"no complete DeepSpeed checkpoint under {path}.",
        fix="pass a pretrain output dir, its checkpoints/ dir, or a checkpoints/global_stepN dir.",
    )


@contextlib.contextmanager
def deepspeed_quiet() -> Iterator[None]:
    """DeepSpeed's console lines kept off a command's console while it loads and merges a checkpoint:
    its import's "Setting accelerator to CPU" (a WARNING of its logger on a machine without a GPU),
    its progress prints and its tqdm bars ("Loading checkpoint shards"). Its errors still show; the
    command's own warnings are printed outside this block."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        # imported before the redirection: DeepSpeed's logger, made at import, keeps the real stdout
        import deepspeed  # noqa: F401

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


def consolidated_state_dict(
    tag_dir: Path, master_groups: list[list[str]] | None = None
) -> dict[str, torch.Tensor]:
    """The fp32 weights of one checkpoint; `master_groups`: its `_VERIFIED.json`'s `fp32_master_groups`."""
    # ZeRO 1-3 partitions: `zero_pp_rank_*`, `bf16_zero_pp_rank_*` with bf16 (the module file then
    # holds bf16 weights: the fp32 masters are only in the partitions)
    if any(tag_dir.glob("*optim_states.pt")) and any(tag_dir.glob("*zero_pp_rank_*")):
        with deepspeed_quiet():
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            return get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    states = tag_dir / "mp_rank_00_model_states.pt"
    if not states.is_file():
        raise UserError(f"{tag_dir} holds neither ZeRO partitions nor mp_rank_00_model_states.pt.")
    saved = torch.load(states, map_location="cpu", weights_only=False)
    weights = {k: v.float() for k, v in saved["module"].items()}
    if master_groups:  # ZeRO 0 in bf16/fp16: the module is rounded; the optimizer holds the fp32 masters
        weights.update(_fp32_masters(saved["optimizer"], master_groups, weights))
        for tied in TIED_KEYS:  # the rounded copy of a tied weight would overwrite its master
            weights.pop(tied, None)
    return weights


def _fp32_masters(
    optimizer: dict, names: list[list[str]], shapes: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Name -> fp32 master weight from DeepSpeed's FP16_Optimizer state (`fp32_groups_flat`, one
    flat tensor a group) or FP16_UnfusedOptimizer's (`fp32_groups`, a tensor a parameter)."""
    if "fp32_groups_flat" in optimizer:
        groups = [
            flat.split([shapes[n].numel() for n in group])
            for flat, group in zip(optimizer["fp32_groups_flat"], names, strict=True)
        ]
    else:
        groups = optimizer["fp32_groups"]
    return {
        n: t.reshape(shapes[n].shape).float()
        for group, tensors in zip(names, groups, strict=True)
        for n, t in zip(group, tensors, strict=True)
    }


def load_model_from_deepspeed_checkpoint(ckpt_dir: str | os.PathLike) -> BertForPreTraining:
    """The fp32 model of the newest verified checkpoint under `ckpt_dir` (see resolve_tag_dir)."""
    return load_model_from_tag(resolve_tag_dir(ckpt_dir))


def load_model_from_tag(tag_dir: Path) -> BertForPreTraining:
    """The fp32 model of one verified checkpoint tag (`resolve_tag_dir`'s)."""
    info = checkpoint.read_verification(tag_dir) or {}
    if "model_config" not in info:
        raise UserError(f"{tag_dir}/{checkpoint.VERIFIED_NAME} records no model_config.")
    model = BertForPreTraining(BertConfig.from_hf_dict(info["model_config"]))
    state = consolidated_state_dict(tag_dir, info.get("fp32_master_groups"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in TIED_KEYS]
    if missing or unexpected:
        raise UserError(
            f"{tag_dir}: weights do not fit the recorded model config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}."
        )
    model.tie_weights()
    return model
