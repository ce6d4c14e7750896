"""The GPU check's stage runs: `bertflow pretrain` in a subprocess, as a user runs it, one metrics
row per step, the figures over the steps after warm-up. `base` and `large` first probe the largest
micro batch that fits (gpu_batch_probe.py, its own process); `fp16` logs the loss-scale trajectory;
`quality` pretrains the default's model and fine-tunes it as `make run` does, against random init."""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpu_context import HERE, ROOT, Context, child_env, measurement, run_logged


def stage_rows(run_dir: Path, warmup: int) -> list[dict[str, Any]]:
    from common.tracking import read_metrics

    return [r for r in read_metrics(run_dir) if "tokens_per_s" in r and r["step"] > warmup]


def window_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput over the timed steps (one metrics row per step): sums of work over sums of time."""
    seconds = sum(r["step_time_s"] for r in rows)
    if not rows or seconds <= 0:
        return {}
    return {
        "tokens_per_s": sum(r["tokens_per_s"] * r["step_time_s"] for r in rows) / seconds,
        "samples_per_s": sum(r["samples_per_s"] * r["step_time_s"] for r in rows) / seconds,
        "tflops": sum(r["tflops"] * r["step_time_s"] for r in rows) / seconds,
        "timed_steps": len(rows),
        "median_step_s": sorted(r["step_time_s"] for r in rows)[len(rows) // 2],
        "peak_memory_gb": max(r.get("memory_mb", 0.0) for r in rows) / 1024,
        **{
            key: sum(r.get(key, 0.0) * r["step_time_s"] for r in rows) / seconds
            for key in ("data_wait_fraction", "loader_busy_fraction")
        },
    }


def run_stage(
    ctx: Context,
    name: str,
    preset: str,
    seq: int,
    precision: str,
    micro: int,
    steps: int,
    *extra: str,
    zero_stage: int | None = None,
    what: str = "bertflow pretrain (DeepSpeed, 1 process)",
) -> dict[str, Any]:
    """`bertflow pretrain` on one process, one metrics row per step; the figures over the steps
    after `stage_warmup`. An out-of-memory failure is retried once at half the micro batch.
    `zero_stage`: the plan's unless given."""
    warmup = ctx.plan.stage_warmup
    zero_stage = ctx.plan.zero_stage if zero_stage is None else zero_stage
    while True:
        out = ctx.work / name
        shutil.rmtree(out, ignore_errors=True)
        sets = [f"model.preset={preset}", "pretrain.num_processes=1", f"pretrain.zero_stage={zero_stage}",
                f"pretrain.micro_batch_size={micro}", f"pretrain.max_steps={warmup + steps}", "pretrain.log_every=1",
                f"pretrain.checkpoint_every={warmup + steps}", f"pretrain.eval_every={10 * (warmup + steps)}",
                "pretrain.eval_batches=2", f"pretrain.precision={precision}", "wandb.mode=disabled", *extra]  # fmt: skip
        cmd = [sys.executable, "-m", "pipelines.cli", "pretrain", "--shards", str(ctx.shards(seq)),
               "--tokenizer", str(ctx.tokenizer), "--output", str(out)] + [a for s in sets for a in ("--set", s)]  # fmt: skip
        t0 = time.time()
        rc, tail = run_logged(cmd, timeout=max(10.0, ctx.seconds_left() - 5), env=child_env())
        wall = time.time() - t0
        oom = rc not in (0, 124) and "out of memory" in tail.lower()
        if oom and micro > 1 and ctx.seconds_left() > wall + 30:
            print(f"{name}: out of memory at micro batch {micro}; retrying at {micro // 2}", flush=True)
            micro //= 2
            continue
        break
    fields: dict[str, Any] = {"micro_batch": micro, "zero_stage": zero_stage, "stage_wall_s": wall,
                              "what": what, "run_dir": str(out),
                              "model_dir": str(out / "model") if rc == 0 else None}  # fmt: skip
    fields.update(window_figures(stage_rows(out, warmup)))
    if rc == 0:
        fields["status"] = "ok"
    else:
        fields.update(status="failed" if rc != 124 else "timeout", error=f"exit code {rc}: {tail[-1500:]}")
    return measurement(ctx, name, preset, seq, precision, **fields)


def batch_probe(ctx: Context, preset: str, seq: int, candidates: tuple[int, ...]) -> dict[str, Any]:
    result = ctx.work / f"probe-{preset}-{seq}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(HERE / "gpu_batch_probe.py"), "--shards", str(ctx.shards(seq)),
           "--tokenizer", str(ctx.tokenizer), "--preset", preset, "--precision", ctx.plan.precision,
           "--zero-stage", str(ctx.plan.zero_stage), "--candidates", ",".join(map(str, candidates)),
           "--steps", str(ctx.plan.probe_steps), "--memory-fraction", str(ctx.plan.memory_fraction),
           "--result", str(result)]  # fmt: skip
    rc, tail = run_logged(cmd, timeout=max(10.0, ctx.seconds_left() - 60), env=child_env())
    if rc != 0 or not result.is_file():
        return {"error": f"exit code {rc}: {tail[-1500:]}", "chosen": None}
    return json.loads(result.read_text())


def _stage_with_probe(
    ctx: Context,
    name: str,
    preset: str,
    seq: int,
    candidates: tuple[int, ...],
    steps: int,
    probe_first: bool = True,
) -> dict[str, Any]:
    if probe_first:
        probe = batch_probe(ctx, preset, seq, candidates)
    else:
        probe = {"chosen": None, "note": "not probed (dry run): the smallest candidate is used"}
    micro = probe.get("chosen") or candidates[0]
    row = run_stage(ctx, name, preset, seq, ctx.plan.precision, micro, steps)
    return {"measurements": [row], "probes": {f"micro_batch_{preset}_seq{seq}": probe}}


def part_base(ctx: Context) -> dict[str, Any]:
    p = ctx.plan
    return _stage_with_probe(ctx, "pretrain_base_seq128", p.base_preset, 128, p.candidates_128, p.stage_steps)


def part_large(ctx: Context) -> dict[str, Any]:
    p = ctx.plan
    return _stage_with_probe(
        ctx, "pretrain_large_seq512", p.large_preset, 512, p.candidates_512, p.large_steps, p.probe_large
    )


def part_fp16(ctx: Context) -> dict[str, Any]:
    """fp16 with dynamic loss scaling (DeepSpeed's, from the ZeRO template), every step logged."""
    p = ctx.plan
    row = run_stage(ctx, "pretrain_base_seq128_fp16", p.base_preset, 128, p.fp16_precision, p.fp16_micro_batch,
                    p.fp16_steps - p.stage_warmup, f"pretrain.warmup_steps={min(30, max(1, p.fp16_steps // 10))}")  # fmt: skip
    from common.tracking import read_metrics

    rows = [r for r in read_metrics(row["run_dir"]) if "loss" in r]
    scales = [(r["step"], r.get("loss_scale")) for r in rows]
    changes = [[s, v] for i, (s, v) in enumerate(scales) if i == 0 or v != scales[i - 1][1]]
    losses = [r["loss"] for r in rows]
    probe = {
        "steps_logged": len(rows),
        "steps_asked": p.fp16_steps,
        "non_finite_losses": sum(1 for x in losses if not _finite(x)),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_scale_changes": changes,
        "loss_scale_final": scales[-1][1] if scales else None,
        "status": row.get("status"),
    }
    return {"measurements": [row], "probes": {"fp16_loss_scale": probe}}


# The stage's other GPU paths, none of which had run on a GPU by 2026-11-26: name -> (ZeRO stage, --set
# overrides, what it exercises). The dry run runs LAMB's only: Muon and the ZeRO stages run on CPU in
# tests/test_pretrain.py, and offload is refused on CPU (training/ds_config.py).
VARIANTS: dict[str, tuple[int, tuple[str, ...], str]] = {
    "pretrain_base_seq128_lamb": (2, ("pretrain.optimizer=lamb",), "LAMB: DeepSpeed's FusedLamb in the engine"),
    "pretrain_base_seq128_muon": (0, ("pretrain.optimizer=muon",),
                                  "Muon: MuonWithAuxAdam with FusedAdam as its AdamW, bf16 optimizer, ZeRO 0"),
    "pretrain_base_seq128_zero3": (3, (), "ZeRO-3: parameters partitioned"),
    "pretrain_base_seq128_offload": (2, ("pretrain.deepspeed_config=infra/deepspeed/zero2_offload.json",),
                                     "ZeRO-Offload: the optimizer on CPU, DeepSpeedCPUAdam JIT-built"),
}  # fmt: skip


def part_variants(ctx: Context) -> dict[str, Any]:
    """A short `bertflow pretrain` (the base preset, seq 128, micro batch `variant_micro_batch`) for each
    of VARIANTS (the plan's `variants`, else all): each says whether that path runs, and how fast."""
    p = ctx.plan
    rows = []
    for name in p.variants or VARIANTS:
        stage, sets, what = VARIANTS[name]
        rows.append(run_stage(ctx, name, p.base_preset, 128, p.precision, p.variant_micro_batch, p.variant_steps,
                              *sets, zero_stage=stage, what=f"bertflow pretrain, {what}"))  # fmt: skip
    return {"measurements": rows}


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


# configs/cpu-hour.yaml's recipe for the tiny model (docs/quality.md), dynamic masks because the
# carried shards are read several times over
QUALITY_RECIPE = ("pretrain.lr=2e-3", "pretrain.dropout=0.0", "pretrain.dynamic_masking=true")
QUALITY_WARMUP = 300  # the recipe's warm-up steps in each phase (10 % of a phase, where that is fewer)


def part_quality(ctx: Context) -> dict[str, Any]:
    """Does pretraining pay when a GPU does it? The default's model (`quality_preset`) pretrained
    with the one-hour CPU recipe on the carried Wikipedia shards, in its two phases: 32-token
    examples first (`quality_seq32_steps` of `quality_seq32_micro_batch`), then 128-token ones from
    that model (`quality_steps` of `quality_micro_batch`); then fine-tuned as `make run` fine-tunes
    it (`bertflow finetune configs/default.yaml`: five GLUE tasks, three seeds, against random init
    of the same shape) on the carried GLUE files. Records each phase's held-out MLM curve and the
    scorecard's headline."""
    p = ctx.plan
    rows, probe, init = [], {}, ()
    if p.quality_seq32_steps:  # the dry run leaves it out (suite time); test_gpu_check checks the chaining
        short = quality_phase(ctx, 32, p.quality_seq32_micro_batch, p.quality_seq32_steps)
        rows.append(short["row"])
        probe["seq32"] = short["probe"]
        init = (f"pretrain.init_from={short['row']['model_dir']}",)
    if not rows or rows[-1]["status"] == "ok":
        main = quality_phase(ctx, 128, p.quality_micro_batch, p.quality_steps, *init)
        rows.append(main["row"])
        probe["seq128"] = main["probe"]
    if rows[-1]["status"] == "ok" and "seq128" in probe:
        probe.update(finetune_scorecard(ctx, rows[-1]["model_dir"]))
    else:
        probe["error"] = rows[-1].get("error")
    return {"measurements": rows, "probes": {"quality": probe}}


def quality_phase(ctx: Context, seq: int, micro: int, steps: int, *extra: str) -> dict[str, Any]:
    """One pretraining phase of `part_quality`: its measurement row and its held-out MLM curve."""
    p = ctx.plan
    sets = (*QUALITY_RECIPE, f"pretrain.warmup_steps={max(1, min(QUALITY_WARMUP, steps // 10))}", f"pretrain.log_every={max(1, steps // 80)}",
            f"pretrain.eval_every={max(1, steps // 4)}", f"pretrain.eval_batches={max(1, 2048 // micro)}",
            *extra)  # fmt: skip
    # ZeRO 0, as `make run` resolves it on one GPU: ZeRO 2 at one rank only adds host work per step,
    # which bounds this small model's step (docs/benchmarks.md §7)
    row = run_stage(ctx, f"pretrain_{p.quality_preset}_seq{seq}_quality", p.quality_preset, seq, p.precision, micro,
                    steps - p.stage_warmup, *sets, zero_stage=0,
                    what=f"bertflow pretrain, the one-hour CPU recipe's {seq}-token phase")  # fmt: skip
    from common.tracking import read_metrics

    curve = [[r["step"], r["val_mlm_acc"]] for r in read_metrics(row["run_dir"]) if "val_mlm_acc" in r]
    probe = {"steps": steps, "micro_batch": row["micro_batch"], "wall_s": row["stage_wall_s"],
             "tokens": steps * row["micro_batch"] * seq, "held_out_mlm_acc": curve}  # fmt: skip
    return {"row": row, "probe": probe}


def finetune_scorecard(ctx: Context, model_dir: str) -> dict[str, Any]:
    """`bertflow finetune configs/default.yaml` on `model_dir` and its random-init baseline: the
    GLUE-style averages and the scorecard's headline. When the command fails or runs out of the
    part's time, the scorecard of the units it finished, beside the error."""
    out = ctx.work / "quality-finetune"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines.cli", "finetune", str(ROOT / "configs" / "default.yaml"),
           "--checkpoint", model_dir, "--output", str(out), "--set", "wandb.mode=disabled",
           "--set", f"data_root={ctx.carry / 'data'}", *ctx.plan.quality_finetune]  # fmt: skip
    t0 = time.time()
    rc, tail = run_logged(cmd, timeout=max(10.0, ctx.seconds_left() - 5), env=child_env())
    done = finished_units(out)
    # the units' own wall times over the command's: how many ran at once (finetune.units_per_gpu)
    found: dict[str, Any] = {"finetune_flags": list(ctx.plan.quality_finetune), "finetune_wall_s": time.time() - t0,
                             "units_wall_s": sum(r.get("wall_time_s", 0.0) for r in done)}  # fmt: skip
    if rc == 0 and (out / "scorecard.json").is_file():
        card = json.loads((out / "scorecard.json").read_text())
    else:
        found["error"] = f"exit code {rc}: {tail[-1500:]}"
        card = finished_units_scorecard(out, done)
        if card is None:
            return found
        found["units_finished"] = card["units_finished"]
    return {**found, "glue_average": {r["checkpoint"]: r["glue_average"] for r in card["rows"]},
            "headline": card["headline"]}  # fmt: skip


def finished_units_scorecard(out: Path, done: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The scorecard (written to `out`) of the units under `out/units/` that finished (`done`, when
    the caller has read them already), with `units_finished`; None when none did."""
    from finetuning.scorecard import build_scorecard

    done = finished_units(out) if done is None else done
    if not done:
        return None
    card = build_scorecard(done, out)
    return {**card, "units_finished": len(done)}


def finished_units(out: Path) -> list[dict[str, Any]]:
    """The results of the units under `out/units/` that finished."""
    from finetuning.units import finished_results

    return finished_results(sorted((out / "units").glob("*")))
