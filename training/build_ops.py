"""Compile DeepSpeed's JIT ops once, at install time (`make install`), not in the first run; and
leave out the one a CPU run does not use.

On a GPU machine: FusedAdam, the pretraining optimizer there (`pretrain.optimizer: adamw`, and the
AdamW half of `muon`), which DeepSpeed otherwise JIT-builds before the first step (38 s on the
GPU check's 16-core H200 machine, docs/gpu/2026-11-26-nvidia-h200.md). FusedLamb (31 s) builds on
first use of `optimizer: lamb`. Built into `common.paths.torch_extensions_dir()` (one per Python
environment, outside the checkout), the launcher's ranks load them in under a second.
On CPU: nothing (`leave_out_cpu_inference_op`).
"""

from __future__ import annotations

import os
import sys
import time

from common.paths import torch_extensions_dir

GPU_OPS = ("FusedAdamBuilder",)
CPU_INFERENCE_OP = "deepspeed_shm_comm"  # DeepSpeed's ShareMemCommBuilder.NAME


def leave_out_cpu_inference_op() -> None:
    """Keep DeepSpeed from building and loading its CPU shared-memory all-reduce op in this process.

    DeepSpeed's torch backend builds that op (a C++ JIT build: 54 CPU-s, 2-3 min on 2 cores, the
    first time) in every process that initializes `deepspeed.comm`, and each rank then maps a 67 MB
    buffer in /dev/shm that only a clean exit removes; but it calls the op only from
    `inference_all_reduce` (tensor-parallel inference, DeepSpeed PR 5391). Training's all-reduce,
    reduce-scatter and all-gather go through torch.distributed (gloo) with or without it. Marked
    incompatible, DeepSpeed's `build_shm_op` returns None and the backend goes on without it.
    Call before `deepspeed.init_distributed` (or `deepspeed.initialize`); on a GPU it does nothing
    (the CUDA accelerator has no such op, and reading the table would probe every op's compiler)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__[CPU_INFERENCE_OP] = False


def load_fused_op(name: str) -> float:
    """Build (first time) or load DeepSpeed's op `name` for this GPU; the seconds it took. The GPU
    check's `ops` part calls this too, so the install step runs on every GPU check."""
    from deepspeed.accelerator import get_accelerator

    from training.optim import prepare_fused_build

    prepare_fused_build()  # the arch-list fix the stage's optimizer applies
    builder = get_accelerator().create_op_builder(name)
    if builder is None:
        raise RuntimeError(f"no {name} on DeepSpeed's {get_accelerator()._name} accelerator")
    t0 = time.perf_counter()
    builder.load(verbose=False)
    return time.perf_counter() - t0


def main() -> int:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    from deepspeed.accelerator import get_accelerator

    where = os.environ["TORCH_EXTENSIONS_DIR"]
    if get_accelerator().device_name() == "cpu":
        print("build_ops: nothing to build without a GPU (training on CPU uses no DeepSpeed JIT op)")
        return 0
    for name in GPU_OPS:
        op = name.removesuffix("Builder")
        print(f"build_ops: DeepSpeed's {op} for this GPU in {where} (~40 s once)")
        try:
            print(f"build_ops: {op} ready after {load_fused_op(name):.1f} s")
        except Exception as exc:  # no nvcc or ninja: say so here; GPU pretraining needs it later
            print(
                f"build_ops: WARNING: DeepSpeed could not build {op} ({exc}). GPU "
                "pretraining uses it: install the CUDA toolkit (nvcc) and ninja, then `make install` again. "
                "Fine-tuning does not need it.",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
