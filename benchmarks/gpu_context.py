"""What every part of the GPU check shares: the plan (shapes and step counts, GPU or dry run), the
context a part runs in, the measurement row, and running a subprocess with a time limit."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """Shapes and step counts: the GPU plan, or the dry run's tiny CPU one."""

    dry_run: bool = False
    base_preset: str = "base"
    large_preset: str = "large"
    precision: str = "bf16"
    fp16_precision: str = "fp16"
    zero_stage: int = 2
    candidates_128: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)  # 1,024 was still rising on the H200
    candidates_512: tuple[int, ...] = (8, 16, 32, 64, 128)
    probe_large: bool = True  # the dry run probes once (base), then takes candidates_512[0]
    probe_steps: int = 3
    memory_fraction: float = 0.9
    stage_warmup: int = 5
    stage_steps: int = 30
    large_steps: int = 15
    fp16_steps: int = 300
    fp16_micro_batch: int = 128
    variant_steps: int = 10
    variant_micro_batch: int = 128  # fp16's: each variant's samples/s compares with that run's
    variants: tuple[str, ...] = ()  # of gpu_stage_parts.VARIANTS; () = all
    hf_warmup: int = 5
    hf_steps: int = 30
    kernel_batch: int = 128
    kernel_warmup: int = 3
    kernel_steps: int = 10
    compile_warmup: int = 3  # static shapes first, then dynamic after the first recompile
    compile_backend: str = "inductor"
    matmul_n: int = 8192
    finetune_train_examples: int = 4000
    finetune_batch: int = 32
    finetune_eval_examples: int | None = None  # the whole SST-2 dev set
    quality_preset: str = "tiny"  # configs/default.yaml's model
    # configs/cpu-hour.yaml's phases, step for step and batch for batch (12 M + 70 M tokens). At 4x
    # the batch for a third of the steps (1,000 x 512 x 32, 2,500 x 256 x 128) an H200 reached 0.32
    # held-out, not 0.36-0.37, on a carry read ~10 times over (docs/quality.md, "On a GPU, both phases")
    quality_seq32_steps: int = 3000  # 0: no short phase
    quality_seq32_micro_batch: int = 128
    quality_steps: int = 8500
    quality_micro_batch: int = 64
    quality_finetune: tuple[str, ...] = ()  # extra `bertflow finetune` flags; () = configs/default.yaml's


QUALITY_FINETUNE_ENV = "GPU_CHECK_QUALITY_FINETUNE"


def gpu_plan(environ: Mapping[str, str] = os.environ) -> Plan:
    """The GPU plan; GPU_CHECK_QUALITY_FINETUNE adds `bertflow finetune` flags to `quality`'s
    fine-tuning, e.g. the one-hour recipe's budget: "--max-train-examples 4000 --lr 1e-4,3e-4,1e-3"."""
    return Plan(quality_finetune=tuple(shlex.split(environ.get(QUALITY_FINETUNE_ENV, ""))))


GPU_PLAN = gpu_plan()
DRY_PLAN = Plan(
    dry_run=True, base_preset="tiny", large_preset="tiny", precision="fp32", fp16_precision="fp32",
    candidates_128=(2, 4), candidates_512=(2,), probe_large=False, probe_steps=1, stage_warmup=1, stage_steps=2,
    large_steps=1, fp16_steps=3, fp16_micro_batch=4, variant_steps=1, variant_micro_batch=2,
    variants=("pretrain_base_seq128_lamb",), hf_warmup=1, hf_steps=1, kernel_batch=4, kernel_warmup=1,
    kernel_steps=2, compile_warmup=1, compile_backend="eager", matmul_n=256, finetune_train_examples=32,
    finetune_batch=8, finetune_eval_examples=32, quality_seq32_steps=0, quality_steps=3, quality_micro_batch=4,
    quality_finetune=("--tasks", "sst2", "--seed", "1", "--max-train-examples", "16", "--max-eval-examples", "16",
                      "--workers", "1"),
)  # fmt: skip


@dataclass
class Context:
    plan: Plan
    carry: Path  # tokenizer/, shards-128/, shards-512/, data/ (gpu_check_prep.py)
    work: Path  # run directories of this call (large: checkpoints of several GB)
    summary: dict[str, Any]  # what earlier parts of this call recorded
    deadline: float  # time.time() by which this part must be done
    peak_tflops: float | None = None  # MFU denominator override (default: training/flops.py's table)

    @property
    def tokenizer(self) -> Path:
        return self.carry / "tokenizer"

    def shards(self, seq: int) -> Path:
        return self.carry / f"shards-{seq}"

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    @property
    def device(self) -> str:
        """The device's name as the `env` part recorded it (no torch import in the stage parts)."""
        return self.summary.get("device") or device_name()


# --- helpers ------------------------------------------------------------------------------------


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor() or "cpu")  # fmt: skip
    return f"cpu ({cpu})"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one probe; its exception becomes the probe's `error` instead of ending the part."""
    try:
        return fn()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"error": error_text(exc)}


def peak_tflops(ctx: Context, precision: str) -> float | None:
    from training.flops import device_peak_tflops

    return device_peak_tflops(ctx.device, precision, ctx.peak_tflops)


def matmul_tflops(ctx: Context) -> float | None:
    calls = ctx.summary.get("calls") or [{}]
    return (calls[-1].get("env") or {}).get("matmul_tflops")


def measurement(
    ctx: Context, name: str, preset: str, seq: int, precision: str, **fields: Any
) -> dict[str, Any]:
    """A measurement row with the keys the summary requires; MFU from `tflops` when present."""
    row = {"name": name, "device": ctx.device, "preset": preset, "seq": seq, "precision": precision,
           "tokens_per_s": None, "samples_per_s": None, "tflops": None, "mfu_spec": None, "mfu_measured": None,
           **fields}  # fmt: skip
    if row["tflops"]:
        spec, ceiling = peak_tflops(ctx, precision), matmul_tflops(ctx)
        row["mfu_spec"] = row["tflops"] / spec if spec else None
        row["peak_tflops_spec"] = spec
        row["mfu_measured"] = row["tflops"] / ceiling if ceiling else None
    return row


def run_logged(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `cmd` in its own process group, its output streamed to ours; on timeout kill the group.
    Returns (exit code, its last 200 lines); exit code 124 = timed out."""
    import collections
    import signal
    import threading

    print("$ " + " ".join(cmd), flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=200)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True, errors="replace")  # fmt: skip

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = 124
        tail.append(f"(killed after {timeout:.0f} s)")
    reader.join(timeout=10)
    return rc, "\n".join(tail)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


PARTIAL_ENV = "GPU_CHECK_PARTIAL"  # where a part saves what it has so far (read if it is killed)


def save_partial(result: dict[str, Any]) -> None:
    """Keep what a part has so far where the orchestrator looks if the part is killed."""
    path = os.environ.get(PARTIAL_ENV)
    if path:
        Path(path).write_text(json.dumps(result, default=str))
