"""How many ranks a pretraining run has and how each step's batch is split among them.

`pretrain.num_processes: auto` is one rank per visible GPU, or `CPU_RANKS` on a machine without
one, so one config runs on a laptop, a one-GPU workstation and an eight-GPU node. What must not
change with the machine is the recipe: `pretrain.global_batch_size` fixes the examples per
optimizer step, and the accumulation steps and per-rank micro batch follow from the world size.
Every split of the same global batch trains on the same examples in the same order
(`training/data.py` BatchPlan), so it computes the same update up to float summation order.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import UserError
from training.config import PretrainConfig
from training.launch import world_size

CPU_RANKS = 2  # `auto` without a GPU: the CPU configs' two data-parallel ranks


def has_gpu_device() -> bool:
    """Whether the machine has a GPU device node (NVIDIA's, or ROCm's /dev/kfd), without torch."""
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


def visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applies); 0 without CUDA, and 0 without
    importing torch where the machine has no GPU device node (`has_gpu_device`)."""
    if not has_gpu_device():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_ranks(pretrain: PretrainConfig, gpus: int) -> PretrainConfig:
    """`pretrain` with concrete ranks and batch split: `num_processes: auto` becomes `gpus` (or
    `CPU_RANKS` when 0); with `global_batch_size`, the fewest accumulation steps whose micro batch
    is at most `micro_batch_size` and splits each rank's share exactly. Refuses more ranks than
    `gpus` on one node, a global batch the ranks cannot share evenly, and a global batch given
    together with accumulation steps."""
    p = pretrain
    if p.num_processes == "auto":
        p = p.model_copy(update={"num_processes": gpus or CPU_RANKS})
    elif gpus and p.num_processes > gpus and not p.hostfile:
        raise UserError(
            f"pretrain.num_processes {p.num_processes} > {gpus} visible GPUs.",
            fix="set pretrain.num_processes: auto (one rank per GPU), lower --num-processes, or use a hostfile "
            "for several nodes.",
        )
    if p.global_batch_size is None:
        return p
    if p.gradient_accumulation_steps != 1:
        raise UserError(
            f"pretrain.global_batch_size {p.global_batch_size} and pretrain.gradient_accumulation_steps "
            f"{p.gradient_accumulation_steps} both set the batch split.",
            fix="set one of them: with global_batch_size the accumulation steps follow from the ranks.",
        )
    world = world_size(p)
    if p.global_batch_size % world:
        layout = "the hostfile's slots" if p.hostfile else f"pretrain.num_processes {p.num_processes}"
        layout += " (auto)" if pretrain.num_processes == "auto" else ""
        raise UserError(
            f"pretrain.global_batch_size {p.global_batch_size} cannot be shared evenly by {world} ranks "
            f"({layout} x pretrain.nnodes {p.nnodes}).",
            fix="use a global batch that is a multiple of the ranks, or set pretrain.num_processes to a "
            "divisor of it.",
        )
    per_rank = p.global_batch_size // world
    accumulation = -(-per_rank // p.micro_batch_size)  # ceil: micro batches no larger than configured
    while per_rank % accumulation:
        accumulation += 1
    return p.model_copy(
        update={"micro_batch_size": per_rank // accumulation, "gradient_accumulation_steps": accumulation}
    )


def split_text(pretrain: PretrainConfig) -> str:
    """How a resolved `pretrain` splits each step, for the log."""
    p = pretrain
    world = world_size(p)
    return (
        f"{world} rank(s) x micro batch {p.micro_batch_size} x {p.gradient_accumulation_steps} "
        f"accumulation step(s) = {world * p.micro_batch_size * p.gradient_accumulation_steps} examples a step"
    )
