"""The parts of the GPU check (see gpu_check.py), each a function `(ctx) -> result dict`.

A result holds any of: `env` (versions, ceiling), `device`, `measurements` (rows with at least
gpu_summary.MEASUREMENT_KEYS), `probes` (name -> dict). A probe that fails records its error and
the part goes on; the orchestrator runs every part in its own process with a time limit.
The stage runs (`base`, `large`, `fp16`) are in gpu_stage_parts.py.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_context import ROOT, Context, device_name, guarded, measurement, save_partial
from gpu_stage_parts import part_base, part_fp16, part_large, part_quality, part_variants


def _command_output(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def part_env(ctx: Context) -> dict[str, Any]:
    import torch

    on_gpu = torch.cuda.is_available()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "pydantic": _version("pydantic"),
        "nvcc": ((_command_output(["nvcc", "--version"]) or "").splitlines() or [None])[-1],
        "driver": _command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        "cpu_count": os.cpu_count(),
        "torch_cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
        "varlen_attn": _has_varlen(),
    }
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        env.update(capability=f"{props.major}.{props.minor}", memory_gb=props.total_memory / 2**30,
                   multiprocessors=props.multi_processor_count, bf16=torch.cuda.is_bf16_supported())  # fmt: skip
    env.update(_install_ops())
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    from gpu_kernels import matmul_ceiling

    dtype = torch.bfloat16 if on_gpu else torch.float32
    env.update(guarded(lambda: matmul_ceiling(device, dtype, ctx.plan.matmul_n)))
    return {"env": env, "device": device_name()}


def _install_ops() -> dict[str, Any]:
    """What `make install` does after the wheels: DeepSpeed's JIT ops built once
    (`training/build_ops.py`; FusedAdam on a GPU), so that no stage's start-up pays for them."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "training.build_ops"], capture_output=True, text=True, cwd=ROOT
    )
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith("build_ops:")]
    return {"install_ops_s": time.perf_counter() - t0, "install_ops": said[-1] if said else done.returncode}


def _has_varlen() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def part_ops(ctx: Context) -> dict[str, Any]:
    """DeepSpeed's FusedAdam and FusedLamb JIT-built with the machine's nvcc, then one step each
    compared with a reference optimizer on the same random parameters and gradients."""
    results = {}
    for op in ("FusedAdamBuilder", "FusedLambBuilder"):
        results[op] = guarded(lambda op=op: _build_op(ctx, op))
    return {"probes": {"ops": results}}


def _build_op(ctx: Context, name: str) -> dict[str, Any]:
    from deepspeed.accelerator import get_accelerator

    from training.build_ops import load_fused_op

    builder = get_accelerator().create_op_builder(name)
    if builder is None:
        return {"error": f"no {name} on DeepSpeed's {get_accelerator()._name} accelerator"}
    out: dict[str, Any] = {"compatible": bool(builder.is_compatible(verbose=False))}
    if ctx.plan.dry_run:
        return {**out, "built": False, "note": "dry run: not built on CPU"}
    out.update(built=True, build_or_load_s=load_fused_op(name))  # what `make install` does on a GPU
    out.update(guarded(lambda: _check_fused_step(name)))
    return out


def _check_fused_step(name: str) -> dict[str, Any]:
    import torch

    from training.optim import Lamb

    g = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(n, device="cuda", generator=g) for n in (4096, 1000)]
    grads = [torch.randn_like(p) for p in params]
    mine = [torch.nn.Parameter(p.clone()) for p in params]
    ref = [torch.nn.Parameter(p.clone()) for p in params]
    if name == "FusedAdamBuilder":
        from deepspeed.ops.adam import FusedAdam

        opt = FusedAdam(mine, lr=1e-3, eps=1e-6, weight_decay=0.01, adam_w_mode=True)
        ref_opt = torch.optim.AdamW(ref, lr=1e-3, eps=1e-6, weight_decay=0.01)
    else:
        from deepspeed.ops.lamb import FusedLamb

        opt = FusedLamb(mine, lr=1e-3, eps=1e-6, weight_decay=0.0)
        ref_opt = Lamb(ref, lr=1e-3, eps=1e-6, weight_decay=0.0)
    for _ in range(3):
        for p, q, gr in zip(mine, ref, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ref_opt.step()
    diff = max(float((p - q).norm() / (q - o).norm()) for p, q, o in zip(mine, ref, params))
    return {"reference": type(ref_opt).__name__, "update_rel_diff_vs_reference": diff}


def base_batches(ctx: Context, micro: int, count: int, device: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The base preset's config (tiny in a dry run; the carried vocabulary) and the first `count`
    micro batches of the carried seq-128 shards in the stage's order (seed 42), on `device`."""
    from gpu_kernels import to_device

    from model.config import BertConfig
    from training.data import BatchPlan, collate, load_split

    store = load_split(ctx.shards(128), "train")
    vocab = len((ctx.tokenizer / "vocab.txt").read_text(encoding="utf-8").splitlines())
    config = BertConfig.from_preset(ctx.plan.base_preset, vocab_size=vocab)
    plan = BatchPlan(len(store), micro, 1, 1, 0, seed=42)
    return config, [to_device(collate(store, plan.micro_batch_indices(i, 0)), device) for i in range(count)]


def _kernel_steps(ctx: Context) -> Any:
    """The model in the training dtype and real micro batches on the device, for gpu_kernels."""
    import gpu_kernels as gk
    import torch

    p = ctx.plan
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    config, batches = base_batches(ctx, p.kernel_batch, p.kernel_warmup + p.kernel_steps, device)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    return gk.Steps(config, batches, dtype, device, p.kernel_warmup, p.kernel_steps)


def part_kernels(ctx: Context) -> dict[str, Any]:
    import gpu_kernels as gk

    p = ctx.plan
    run = _kernel_steps(ctx)
    probes: dict[str, Any] = {}
    probes["sdpa_kernels"] = guarded(lambda: gk.sdpa_kernels(run.model(), run.batches[0], run.device))
    save_partial({"probes": probes})
    probes["attention_paths"] = guarded(lambda: gk.attention_paths(run))
    save_partial({"probes": probes})
    probes["compile"] = guarded(lambda: gk.compile_on_off(run, p.compile_backend, p.compile_warmup))
    for probe in probes.values():
        probe.update(preset=p.base_preset, micro_batch=p.kernel_batch, dtype=str(run.dtype)[6:])
    return {"probes": probes}


def part_hf(ctx: Context) -> dict[str, Any]:
    """The same batches (the stage's order, seed 42, its micro batch) through plain loops: around
    transformers.BertForPreTraining and around our model, bf16 autocast + fused AdamW on GPU. The
    batches are collated and on the device before timing (the reference gets its data for free)."""
    import torch

    p = ctx.plan
    stage = next(
        (m for m in ctx.summary.get("measurements", []) if m.get("name") == "pretrain_base_seq128"), {}
    )
    micro = stage.get("micro_batch") or p.kernel_batch
    rows = []
    for name, which in (
        ("hf_plain_loop_base_seq128", "transformers"),
        ("ours_plain_loop_base_seq128", "ours"),
    ):
        fields = guarded(lambda which=which: _plain_loop(ctx, which, micro))
        if "error" in fields and "out of memory" in fields["error"].lower() and micro > 1:
            torch.cuda.empty_cache()
            fields = {**guarded(lambda which=which: _plain_loop(ctx, which, micro // 2)),
                      "note": f"out of memory at micro batch {micro}"}  # fmt: skip
        fields.setdefault("status", "failed" if "error" in fields else "ok")
        precision = "bf16" if torch.cuda.is_available() else "fp32"  # autocast: see `what`
        rows.append(measurement(ctx, name, p.base_preset, 128, precision, **fields))
    return {"measurements": rows}


def _plain_loop(ctx: Context, which: str, micro: int) -> dict[str, Any]:
    import torch
    from gpu_kernels import batch_flops, synchronize
    from hf_reference import hf_inputs, hf_model

    from model.heads import BertForPreTraining

    p = ctx.plan
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    config, batches = base_batches(ctx, micro, p.hf_warmup + p.hf_steps, device)
    if on_gpu:  # after the batches reach the GPU: before CUDA is initialized this call fails
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    model = (hf_model(config) if which == "transformers" else BertForPreTraining(config)).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01, fused=on_gpu)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False)
    )

    def step(b: dict[str, torch.Tensor]) -> None:
        with autocast:
            out = model(**hf_inputs(b)) if which == "transformers" else model(**b)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for b in batches[: p.hf_warmup]:
        step(b)
    synchronize(device)
    t0 = time.perf_counter()
    for b in batches[p.hf_warmup :]:
        step(b)
    synchronize(device)
    seconds = time.perf_counter() - t0
    timed = batches[p.hf_warmup :]
    flops, tokens = zip(*(batch_flops(config, b) for b in timed))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else None
    model_name = (
        "transformers.BertForPreTraining (sdpa)" if which == "transformers" else "our BertForPreTraining"
    )
    recipe = "bf16 autocast, fused AdamW" if on_gpu else "fp32, AdamW"
    return {"micro_batch": micro, "tokens_per_s": sum(tokens) / seconds, "samples_per_s": micro * len(timed) / seconds,
            "tflops": sum(flops) / seconds / 1e12, "timed_steps": len(timed), "peak_memory_gb": peak,
            "what": f"plain loop around {model_name}, {recipe}, clip 1.0"}  # fmt: skip


def part_finetune(ctx: Context) -> dict[str, Any]:
    """One fine-tuning unit (SST-2, lr 5e-5, seed 42, 1 epoch) on the device, from the last
    pretrained model of this call (else random init of the base preset), run twice in one process:
    the second run finds every per-shape cache warm (cuDNN attention plans, allocator blocks), so
    the two throughputs say how much of the first went into warming them up (the first H200 run
    gave only 236 examples/s)."""
    from common.tracking import WandbTarget
    from finetuning.config import FinetuneConfig
    from finetuning.fanout import plan
    from finetuning.units import FinetuneUnit, run_finetune_unit

    p = ctx.plan
    models = [m["model_dir"] for m in ctx.summary.get("measurements", [])
              if m.get("model_dir") and Path(m["model_dir"], "config.json").is_file()]  # fmt: skip
    checkpoint = models[-1] if models else f"random:{p.base_preset}"
    cfg = FinetuneConfig(tasks=["sst2"], baselines=["none"], max_train_examples=p.finetune_train_examples,
                         max_eval_examples=p.finetune_eval_examples, epochs=1.0, batch_size=p.finetune_batch)  # fmt: skip
    data_root = str(ctx.carry / "data")
    runs = []
    for run in ("first", "again"):
        out = ctx.work / f"finetune-sst2-{run}"
        shutil.rmtree(out, ignore_errors=True)
        [job] = plan(cfg, [checkpoint], out, tokenizer_dir=ctx.tokenizer, data_root=data_root,
                     units=[FinetuneUnit("sst2", 5e-5, 42)])  # fmt: skip
        runs.append(run_finetune_unit(cfg, job, data_root, WandbTarget(mode="disabled")))
    keep = ("unit", "device", "checkpoint", "metrics", "n_train", "n_eval", "train_steps", "train_examples_per_s",
            "train_time_s", "eval_time_s", "wall_time_s", "final_train_loss")  # fmt: skip
    again = {k: runs[1].get(k) for k in ("train_examples_per_s", "train_time_s", "eval_time_s", "metrics")}
    return {
        "probes": {"finetune_unit": {**{k: runs[0].get(k) for k in keep}, "again_in_same_process": again}}
    }


# In the order they run by default: the measurements that matter most first, the probes that can
# take long (torch.compile's warm-up) last, so a slow probe never costs a throughput figure.
PARTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "env": part_env,
    "base": part_base,
    "hf": part_hf,
    "ops": part_ops,
    "kernels": part_kernels,
    "large": part_large,
    "fp16": part_fp16,
    "variants": part_variants,
    "finetune": part_finetune,
    "quality": part_quality,
}
