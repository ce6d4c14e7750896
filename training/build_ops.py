"""Compile DeepSpeed's JIT op for CPU communication once, at install time (`make install`).

DeepSpeed builds its shared-memory all-reduce op (`deepspeed_shm_comm`) the first time a CPU run
initializes `deepspeed.comm`: 2-3 minutes of silence in the first `bertflow run`. Built here into
`common.paths.torch_extensions_dir()` (one per Python environment, outside the checkout), the launcher's ranks load it in
under a second. Nothing to build where the accelerator is a GPU.
"""

from __future__ import annotations

import os
import sys

from common.paths import torch_extensions_dir


def main() -> int:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    if get_accelerator().device_name() != "cpu":
        print("build_ops: GPU accelerator, no CPU op to build")
        return 0
    print(
        f"build_ops: DeepSpeed's CPU communication op in {os.environ['TORCH_EXTENSIONS_DIR']} (2-3 min once)"
    )
    build_shm_op()
    return 0


if __name__ == "__main__":
    sys.exit(main())
