"""The per-rank pretraining script that the DeepSpeed launcher (or torchrun) starts on every rank.

    python -m training.train --spec OUT/run_spec.json [--local_rank N]

`run_spec.json` (`training/run_spec.py`) is written by `pipelines/stage_pretrain.py` after it has
validated everything; this script trusts it. `train` composes named steps: join the process group,
choose the checkpoint to resume from, prepare the data, build the engine, run the step loop
(checkpointing, logging, evaluating), and export the final model on rank 0. Any exception on any
rank ends that process non-zero, and the launcher then stops the other ranks; collectives carry a
timeout, so a rank that hangs cannot hold the others forever.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import resource
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.child_process import survive_a_lost_reader
from common.console import warning_line
from common.disk_space import disk_full_error, free_bytes, full_disk_path
from common.errors import UserError, go_on_after_a_stop
from common.fingerprint import digest
from common.progress import duration_text
from common.tracking import Tracker, WandbTarget, first_attempt_group_file, read_metrics
from model.config import BertConfig
from model.heads import BertForPreTraining, count_parameters
from preprocessing import shard_format
from preprocessing.masking import MaskingSpec
from preprocessing.wordpiece import SPECIAL_TOKENS
from training import checkpoint, example_cache, preflight
from training.build_ops import leave_out_cpu_inference_op
from training.config import PretrainConfig
from training.data import (
    BatchPlan,
    ExampleStore,
    PretrainLoader,
    eval_batches,
    eval_example_count,
    mapped_split,
)
from training.ds_config import offloads_optimizer, precision_of
from training.evaluate import PretrainEval, evaluate_pretraining, target_counts
from training.flops import device_peak_tflops
from training.lost_ranks import lost_ranks_message, peer_failure
from training.optim import build_optimizer, build_scheduler
from training.run_spec import RunSpec
from training.step_stats import StepStats, all_reduce_sums
from training.stop_request import (
    PretrainingStopped,
    StopRequest,
    launcher_died,
    stop_error,
    stop_when_launcher_dies,
)

# Fault-injection hooks for the fault tests (never set in normal runs).
NAN_DEBUG_ENV = "BERTFLOW_DEBUG_NAN_AT_STEP"  # make the loss NaN at this step
DELAY_DEBUG_ENV = "BERTFLOW_DEBUG_STEP_DELAY_S"  # sleep this long per step (gives kill tests a window)
# a DeepSpeed checkpoint of an Adam run: fp32 weights, two moments and (mixed precision) fp32 master
# weights: at most 16 bytes per parameter (the estimate the disk-full message gives)
CHECKPOINT_BYTES_PER_PARAM = 16
# how long a failing rank 0 waits for W&B to end its run (offline: well under a second) before leaving
TRACKER_FINISH_TIMEOUT_S = 30.0
T0 = time.perf_counter()


def log0(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(msg, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def node_cache_dir(configured: str | None, out_dir: Path, first_rank: int) -> Path:
    """This node's data cache: under `pretrain.data_cache_dir` ($VARS expanded here, so each node
    may name its own local disk) or OUT/data_cache, in a folder named by the host and the global
    rank of the node's first process, and under `data_cache_dir` by the run's output directory too.
    Two nodes never build into the same folder, whether they share the cache folder (same host, or a
    shared filesystem) or not, nor two runs that share `data_cache_dir` (one rebuilt the other's
    cache from its own shards, or deleted it at its end)."""
    if configured and "$" in os.path.expandvars(configured):
        raise UserError(
            f"pretrain.data_cache_dir {configured!r} names a variable that is not set on {socket.gethostname()}.",
            fix="export it on every node, or give a plain path.",
        )
    node = f"{socket.gethostname()}-rank{first_rank}"
    if not configured:
        return out_dir / "data_cache" / node
    run = digest(str(Path(out_dir).resolve()), 12)
    return Path(os.path.expandvars(configured)).expanduser() / f"{node}-run{run}"


# ----------------------------------------------------------------------------- process group


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int
    device: torch.device


def init_distributed(spec: RunSpec, local_rank: int) -> Ranks:
    import deepspeed

    leave_out_cpu_inference_op()
    deepspeed.init_distributed(
        dist_backend="nccl" if spec.on_gpu else "gloo",
        timeout=datetime.timedelta(seconds=spec.pretrain.dist_timeout_s),
    )
    if spec.on_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Ranks(dist.get_rank(), dist.get_world_size(), local_rank, device)


def time_out_every_group(seconds: float) -> None:
    """Every process group of this rank waits at most `seconds` in a collective. DeepSpeed makes its
    ZeRO and data-parallel groups with `new_group(ranks)`, which takes torch's default (30 min for
    gloo), not the timeout `init_distributed` was given: a stopped rank on another node held the
    others in the gradient all-reduce for as long, past pretrain.dist_timeout_s."""
    from torch.distributed import distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=seconds)
    try:  # torch's private API (2.11 on the GPU image, 2.13 here): a torch without it keeps the default
        for group in list(c10d._world.pg_map):
            if not c10d._rank_not_in_group(group):
                c10d._set_pg_timeout(timeout, group)
    except (AttributeError, RuntimeError, ValueError) as exc:
        log0(
            warning_line(
                f"could not give DeepSpeed's process groups pretrain.dist_timeout_s ({exc}): a hung rank may "
                "hold the others in a collective for torch's default timeout (30 min on CPU, 10 min with NCCL)."
            )
        )


# ----------------------------------------------------------------------------- resume selection


@dataclass(frozen=True)
class Resume:
    tag_dir: Path
    step: int
    consumed_samples: int


def select_resume(spec: RunSpec, ranks: Ranks) -> Resume | None:
    """Rank 0 verifies the checkpoints and chooses; every rank follows its choice."""
    choice: list[Any] = [None]
    if ranks.rank == 0:
        found = checkpoint.prepare_resume(spec.checkpoints_dir, warn=log0)
        choice = [None if found is None else (str(found[0]), found[1])]
    dist.broadcast_object_list(choice, src=0)
    if choice[0] is None:
        return None
    tag_dir, info = choice[0]
    return Resume(Path(tag_dir), int(info["step"]), int(info["consumed_samples"]))


# ----------------------------------------------------------------------------- data


@dataclass
class TrainData:
    store: ExampleStore
    val_store: ExampleStore | None
    plan: BatchPlan
    masking: MaskingSpec | None
    cache_root: Path  # this node's memory-mapped copy of the shards


def prepare_data(spec: RunSpec, ranks: Ranks) -> TrainData:
    """The first rank of each node builds (or verifies) the memory-mapped cache; all ranks map it."""
    cache_root = node_cache_dir(spec.pretrain.data_cache_dir, spec.out_dir, ranks.rank - ranks.local_rank)
    if ranks.local_rank == 0:
        t0 = time.perf_counter()
        example_cache.ensure(spec.shards_dir, "train", cache_root, log=log0)
        # no validation split is a warning; a damaged one is an error like a damaged train shard
        if shard_format.read_manifest(spec.shards_dir).get("splits", {}).get("validation"):
            example_cache.ensure(spec.shards_dir, "validation", cache_root, log=log0)
        else:
            shutil.rmtree(cache_root / "validation", ignore_errors=True)
            log0(
                warning_line(
                    f"{spec.shards_dir} has no validation shards; held-out accuracy will not be logged"
                )
            )
        print(
            f"rank {ranks.rank}: data cache ready in {time.perf_counter() - t0:.1f}s: {cache_root}",
            flush=True,
        )
    dist.barrier()
    store = mapped_split(cache_root / "train")
    vocab_size = spec.model["vocab_size"]
    if store.max_token_id >= vocab_size:
        raise UserError(
            f"shards in {spec.shards_dir} hold token id {store.max_token_id}, but the model's "
            f"vocabulary has {vocab_size} entries.",
            fix="preprocess with the same tokenizer that you pass to pretrain.",
        )
    val_cache = cache_root / "validation"
    val_store = mapped_split(val_cache) if (val_cache / example_cache.CACHE_META).is_file() else None
    p = spec.pretrain
    if val_store is not None and (note := small_held_out_note(len(val_store), p, ranks.world)):
        log0(warning_line(note))
    plan = BatchPlan(
        len(store), p.micro_batch_size, p.gradient_accumulation_steps, ranks.world, ranks.rank, p.seed
    )
    return TrainData(store, val_store, plan, dynamic_masking(spec), cache_root)


def small_held_out_note(n_examples: int, p: PretrainConfig, world: int) -> str | None:
    """What a validation split smaller than one step means for the held-out figures (they are
    few, or none), said before training; None for a split of at least one step."""
    step = p.micro_batch_size * p.gradient_accumulation_steps * world
    if n_examples >= step:
        return None
    used = eval_example_count(
        n_examples, p.micro_batch_size, world, p.eval_batches, p.gradient_accumulation_steps
    )
    fix = "a larger preprocess.validation_fraction (or more text) gives more held-out examples"
    if not used:
        return f"the validation split has {n_examples} example(s) for {world} ranks; held-out accuracy will not be logged ({fix})"
    return (
        f"the validation split has {n_examples} examples, fewer than one step's {step}; held-out figures "
        f"come from {used} of them and are noisy ({fix})"
    )


def dynamic_masking(spec: RunSpec) -> MaskingSpec | None:
    """With `pretrain.dynamic_masking`: the shards' own masking rules, re-drawn every epoch."""
    if not spec.pretrain.dynamic_masking:
        return None
    m = spec.masking
    vocab = preflight.read_vocab(spec.tokenizer_dir)
    return MaskingSpec.from_vocab(
        vocab, SPECIAL_TOKENS, m.masked_lm_prob, m.max_predictions_per_seq, m.whole_word_mask
    )


# ----------------------------------------------------------------------------- model and engine


def build_model(
    model_cfg: BertConfig,
    p: PretrainConfig,
    resuming: bool,
    store: ExampleStore | None = None,
    init_trained_length: int | None = None,
) -> BertForPreTraining:
    """The model to train. `pretrain.dropout` applies here only: checkpoints and the export record
    the model section's config (the dropout fine-tuning starts from). A new model's MLM bias starts
    at the unigram prior of `store`'s masked tokens (`pretrain.mlm_bias_init`). From `init_from`
    trained at `init_trained_length` tokens, the positions past it start as copies of the trained
    ones (docs/quality.md, "Longer sequences from a shorter phase")."""
    seed_everything(p.seed)  # same initial weights on every rank
    if p.dropout is not None:
        model_cfg = dataclasses.replace(
            model_cfg, hidden_dropout_prob=p.dropout, attention_probs_dropout_prob=p.dropout
        )
    model = BertForPreTraining(model_cfg)
    init_from = p.init_from
    if init_from and not resuming:
        from model.hf_io import load_pretraining_model

        loaded, _missing = load_pretraining_model(init_from)
        model.load_state_dict(loaded.state_dict())
        model.tie_weights()
        log0(f"initialized weights from {init_from}")
        if init_trained_length:
            model.bert.embeddings.copy_trained_positions(init_trained_length)
            log0(
                f"positions {init_trained_length}..{model_cfg.max_position_embeddings - 1} start as copies of "
                f"0..{init_trained_length - 1} ({init_from} was trained at {init_trained_length} tokens)"
            )
    elif not resuming and p.mlm_bias_init == "unigram" and store is not None:
        counts = target_counts(store.mlm_ids, model_cfg.vocab_size)
        model.init_mlm_bias(torch.from_numpy(counts))
    return model


def build_engine(spec: RunSpec, ranks: Ranks, resume: Resume | None, data: TrainData) -> Any:
    """The DeepSpeed engine with the model, optimizer and schedule, restored from `resume`."""
    import deepspeed

    p = spec.pretrain
    model = build_model(
        spec.bert_config,
        p,
        resuming=resume is not None,
        store=data.store,
        init_trained_length=spec.init_trained_length,
    )
    offload = offloads_optimizer(spec.ds_config)
    optimizer = build_optimizer(
        model, p.optimizer, p.lr, p.weight_decay, on_gpu=spec.on_gpu, offload=offload, muon_lr=p.muon_lr
    )
    scheduler = build_scheduler(optimizer, p.warmup_steps, p.max_steps)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=spec.ds_config
    )
    time_out_every_group(p.dist_timeout_s)
    if ranks.world == 1 and spec.zero_stage == 0:
        # One rank: the gradient all-reduce would only flatten every gradient into a bucket and
        # copy it back (~6% of a base step on CPU). ZeRO 1-3 keep their own gradient path.
        engine.enable_backward_allreduce = False
    keep_fp32_clip_norm(engine)
    if p.compile and spec.on_gpu and hasattr(engine, "compile"):
        engine.compile()
    if not spec.on_gpu:
        # the CPU path is eager: DeepSpeed's Muon Newton-Schulz is torch.compile'd, and compiling it
        # takes ~30 s on CPU to save ~13 ms a step (docs/benchmarks.md)
        torch.compiler.set_stance("force_eager")
    if resume is None:
        seed_everything(p.seed + 1000 * ranks.rank)  # per-rank dropout streams
        return engine
    load_path, _ = engine.load_checkpoint(str(spec.checkpoints_dir), tag=resume.tag_dir.name)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {resume.tag_dir}")
    if not checkpoint.load_rng_state(resume.tag_dir, ranks.rank):
        log0(
            warning_line(
                f"{resume.tag_dir} has no RNG state for rank {ranks.rank}; dropout masks will differ"
            )
        )
    log0(f"resumed from {resume.tag_dir} at step {resume.step} ({resume.consumed_samples} samples consumed)")
    return engine


def open_tracker(spec: RunSpec, ranks: Ranks, resume: Resume | None) -> Tracker | None:
    """Rank 0's W&B run (+ metrics.jsonl), after dropping rows logged past the resumed step."""
    if ranks.rank != 0:
        return None
    rewrite_metrics_upto(spec.out_dir, resume.step if resume else 0)
    tracker = Tracker(
        spec.out_dir,
        first_attempts_target(spec),
        name=spec.run_name,
        job_type="pretrain",
        config={**spec.pipeline_config, "deepspeed": spec.ds_config, "world_size": ranks.world},
    )
    if resume:
        tracker.replay(read_metrics(spec.out_dir))  # this W&B run then holds the whole curve
    return tracker


def first_attempts_target(spec: RunSpec) -> WandbTarget:
    """`spec.wandb` in the W&B group of this output's first attempt (recorded in
    OUT/wandb_files/group): every attempt of one pretraining (a resume after a failure, a stop or a
    kill -9, from another flow run whose group differs) is one W&B run each, and all in one group."""
    path = first_attempt_group_file(spec.out_dir)
    if path.is_file():
        return spec.wandb.model_copy(update={"group": path.read_text() or None})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec.wandb.group or "")
    return spec.wandb


def rewrite_metrics_upto(run_dir: Path, step: int) -> None:
    """On resume, drop rows logged after the checkpoint (they will be logged again)."""
    from common.atomic import atomic_write_text

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = []
    for ln in lines:
        try:
            row = json.loads(ln)
        except ValueError:
            continue  # a line torn by kill -9
        if row.get("step") is not None and row["step"] <= step:
            kept.append(ln)
    atomic_write_text(path, "".join(x + "\n" for x in kept))


# ----------------------------------------------------------------------------- the step loop


def forward_backward(
    engine: Any,
    batches: list[dict[str, torch.Tensor]],
    device: torch.device,
    model_cfg: BertConfig,
    poison: bool,
) -> StepStats:
    """This rank's micro batches of one step; DeepSpeed accumulates their gradients. The last
    micro batch's `engine.step()` (the update) is left to the caller."""
    stats = StepStats()
    for m, batch in enumerate(batches):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        out = engine(**batch)
        loss = out.loss * float("nan") if poison else out.loss
        engine.backward(loss)
        stats.add(out, batch, loss, model_cfg)
        if m < len(batches) - 1:
            engine.step()
    return stats


def check_finite(mean_loss: float, step: int, last_tag: Path | None, precision: str) -> None:
    if np.isfinite(mean_loss):
        return
    raise FloatingPointError(
        f"loss is {mean_loss} at step {step}; stopping before the update is applied "
        + nonfinite_advice(step, last_tag, precision)
    )


def nonfinite_advice(step: int, last_tag: Path | None, precision: str) -> str:
    """What a non-finite loss at `step` means for a rerun: only a checkpoint is resumed (a resume
    is exact, so the same settings meet the same step again), and the loss of step 1 is computed
    before any update, so no learning rate can have caused it."""
    bf16 = ", or precision bf16 instead of fp16," if precision == "fp16" else ""
    if last_tag is not None:
        return (
            f"(last good checkpoint: {last_tag}). Rerunning with the same settings resumes from that "
            "checkpoint and will most likely diverge at the same step. Rerun with a lower pretrain.lr "
            f"or more pretrain.warmup_steps{bf16} into a new output directory (this one's checkpoints "
            "belong to these settings)."
        )
    if step == 1:
        return (
            "(no checkpoint was written). The loss of the first step is computed before any update, so "
            "the learning rate is not the cause: check the shards (a batch without masked-LM targets, "
            "e.g. a vocabulary that turns the corpus into [UNK]; see the shards' stats.json) and the "
            f"initial weights (pretrain.init_from){bf16.rstrip(',')}."
        )
    return (
        "(no checkpoint was written, so nothing is resumed: a rerun starts again from step 0 and will "
        f"most likely diverge at the same step with the same settings). Rerun with a lower pretrain.lr "
        f"or more pretrain.warmup_steps{bf16.rstrip(',')}."
    )


class ThroughputWindow:
    """Samples, real tokens and FLOPs since the last logged row, over the wall time; the time the
    loop waited for data and the time the loader thread spent collating, as shares of it."""

    def __init__(self, loader: PretrainLoader) -> None:
        self.loader = loader
        self.reset(time.perf_counter())

    def reset(self, now: float) -> None:
        self.start, self.wait_start, self.steps = now, self.loader.data_wait_seconds, 0
        self.collate_start = self.loader.collate_seconds
        self.samples = self.tokens = self.flops = 0.0

    def add(self, stats: StepStats) -> None:
        self.samples += stats.samples
        self.tokens += stats.tokens
        self.flops += stats.flops
        self.steps += 1

    def figures(self, now: float) -> dict[str, float]:
        elapsed = max(now - self.start, 1e-9)
        return {
            "samples_per_s": self.samples / elapsed,
            "tokens_per_s": self.tokens / elapsed,
            "tflops": self.flops / elapsed / 1e12,
            "data_wait_fraction": (self.loader.data_wait_seconds - self.wait_start) / elapsed,
            "loader_busy_fraction": (self.loader.collate_seconds - self.collate_start) / elapsed,
            "step_time_s": elapsed / max(1, self.steps),
        }


def keep_fp32_clip_norm(engine: Any) -> None:
    """DeepSpeed's fp32 path without ZeRO (ZeRO 0 in fp32: one CPU rank, `zero_stage: 0`, Muon on
    CPU) clips the gradients but drops their norm, so `get_global_grad_norm()` was None at every
    step and the metrics logged NaN; keep the norm that the same clipping call returns."""
    if engine.fp16_enabled() or engine.bfloat16_enabled() or engine.zero_optimization():
        return  # their optimizers keep the norm themselves
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_and_keep_norm() -> None:
        norm = clip_grad_norm_(
            parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(), mpu=engine.mpu
        )
        engine._global_grad_norm = float(norm)

    engine.clip_fp32_gradients = clip_and_keep_norm


def metrics_row(
    engine: Any, stats: StepStats, lr: float, window: dict[str, float], device: torch.device
) -> dict:
    grad_norm = engine.get_global_grad_norm()
    row = stats.train_metrics()
    row["lr"] = lr
    row["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    # ZeRO 1-3 keep the fp16 scale in `cur_scale`, ZeRO 0's FP16_(Unfused)Optimizer in `loss_scale`
    scale = getattr(engine.optimizer, "cur_scale", None) or getattr(engine.optimizer, "loss_scale", None)
    row["loss_scale"] = float(scale or 1.0)
    row.update({k: window[k] for k in ("samples_per_s", "tokens_per_s", "tflops")})
    row["memory_mb"] = memory_mb(device)
    row.update({k: window[k] for k in ("data_wait_fraction", "loader_busy_fraction", "step_time_s")})
    return row


def tokens_before(plan: BatchPlan, store: ExampleStore, steps: int) -> int:
    """Real tokens (padding excluded) of the examples of the first `steps` steps, all ranks: where
    a resumed run's `consumed_tokens` starts (each step then adds the tokens it trained on)."""
    if steps == 0:  # a fresh run: no permutation of the whole split to count nothing
        return 0
    lengths = np.diff(store.offsets)
    epochs, rest = divmod(steps, plan.steps_per_epoch)
    total = 0
    for epoch in range(epochs + 1):
        n = (plan.steps_per_epoch if epoch < epochs else rest) * plan.global_batch
        total += int(lengths[plan.permutation(epoch)[:n]].sum())
    return total


def run_steps(
    spec: RunSpec,
    engine: Any,
    data: TrainData,
    ranks: Ranks,
    resume: Resume | None,
    tracker: Tracker | None,
    stop: StopRequest,
) -> Path:
    """Steps `resume.step + 1 .. max_steps`; returns the last checkpoint written. A SIGTERM that
    `stop` noted on any rank ends the loop after the step every rank then learns of it, saved."""
    p = spec.pretrain
    start_step = resume.step if resume else 0
    loader = PretrainLoader(
        data.store, data.plan, start_step, data.masking, p.prefetch_batches, pin_memory=spec.on_gpu
    )
    val_batches = validation_batches(spec, data, ranks)
    precision = precision_of(spec.ds_config)
    peak = None
    if spec.on_gpu:
        peak = device_peak_tflops(torch.cuda.get_device_name(ranks.device), precision, p.peak_tflops)
    model_cfg = spec.bert_config
    nan_step = int(os.environ.get(NAN_DEBUG_ENV, "0") or 0)
    step_delay = float(os.environ.get(DELAY_DEBUG_ENV, "0") or 0)
    ready = (
        f"ready to train after {time.perf_counter() - T0:.1f}s: {len(data.store)} examples, world "
        f"{ranks.world}, global batch {data.plan.global_batch}, {data.plan.steps_per_epoch} steps/epoch, "
        f"{precision}, ZeRO {spec.zero_stage}, start step {start_step}"
    )
    if ranks.rank == 0:
        print(ready, flush=True)
    elif ranks.local_rank == 0:  # another node's command said its ranks would say it (the steps: node 0's)
        print(f"rank {ranks.rank}: {ready}; node 0 prints the steps", flush=True)
    bar = progress_bar(spec, ranks, start_step)
    last_tag = resume.tag_dir if resume else None
    window = ThroughputWindow(loader)
    tokens = tokens_before(data.plan, data.store, start_step)
    engine.train()
    try:
        for step in range(start_step + 1, p.max_steps + 1):
            local = forward_backward(engine, next(loader), ranks.device, model_cfg, poison=step == nan_step)
            local.stop_requests = float(stop.requested)
            local.launcher_deaths = float(launcher_died())
            stats = local.all_reduce(ranks.device)
            check_finite(stats.mean_loss, step, last_tag, precision)
            lr = engine.get_lr()[0]  # the rate this update uses
            engine.step()  # the accumulation boundary: DeepSpeed clips, steps and advances the LR
            if step_delay:
                time.sleep(step_delay)
            window.add(stats)
            tokens += int(stats.tokens)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{stats.mean_loss:.3f}")
            if step % p.log_every == 0 or step == p.max_steps:
                now = time.perf_counter()
                row = metrics_row(engine, stats, lr, window.figures(now), ranks.device)
                row["consumed_samples"] = step * data.plan.global_batch
                row["consumed_tokens"] = tokens
                if peak:
                    row["mfu"] = row["tflops"] / peak
                log_row(tracker, row, step, p.max_steps, printed=bar is None)
                window.reset(now)
            if val_batches and (step % p.eval_every == 0 or step == p.max_steps):
                log_eval(tracker, evaluate(engine, val_batches, ranks.device), step)
            if step % p.checkpoint_every == 0 or step == p.max_steps or stats.stop_requests:
                last_tag = save_checkpoint(engine, spec, step, data.plan, ranks.rank)
            if stats.stop_requests and step < p.max_steps:
                raise stopped_after(p, step, last_tag, stats.launcher_deaths)
    finally:
        loader.close()
        if bar is not None:
            bar.close()
    return last_tag


def validation_batches(spec: RunSpec, data: TrainData, ranks: Ranks) -> list[dict[str, torch.Tensor]]:
    """This rank's share of the held-out batches evaluated every `eval_every` steps (none without
    a held-out split)."""
    if not data.val_store:
        return []
    p = spec.pretrain
    return eval_batches(
        data.val_store,
        p.micro_batch_size,
        ranks.world,
        ranks.rank,
        p.eval_batches,
        p.gradient_accumulation_steps,
    )


def stopped_after(p: PretrainConfig, step: int, last_tag: Path, launcher_deaths: float) -> PretrainingStopped:
    """The error a stop ends the step loop with, once `step`'s checkpoint (`last_tag`) is saved
    (`launcher_deaths`: the ranks whose launcher died, over every rank)."""
    again = go_on_after_a_stop()  # a deployment's flow run has no command of the user's
    every_node = " on every node" if p.nnodes > 1 and again == go_on_after_a_stop(False) else ""
    return stop_error(
        p.nnodes,
        f"after step {step} of {p.max_steps}; its checkpoint is saved ({last_tag.name}). "
        f"{again[0].upper()}{again[1:]}{every_node} to resume from it.",
        launcher_deaths,
    )


def progress_bar(spec: RunSpec, ranks: Ranks, start_step: int) -> Any:
    """A tqdm bar on rank 0 when the output is a terminal (else one printed line per logged step)."""
    if ranks.rank != 0 or not sys.stdout.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=spec.pretrain.max_steps, initial=start_step, desc="pretrain", unit="step")


def log_row(tracker: Tracker | None, row: dict[str, float], step: int, max_steps: int, printed: bool) -> None:
    if tracker is None:
        return
    tracker.log(row, step=step)
    if printed:
        print(
            f"step {step}/{max_steps} loss {row['loss']:.4f} mlm_acc {row['mlm_acc']:.3f} "
            f"lr {row['lr']:.2e} {row['tokens_per_s']:.0f} tok/s "
            f"data_wait {row['data_wait_fraction']:.1%} loader {row['loader_busy_fraction']:.0%} "
            f"ETA {duration_text((max_steps - step) * row['step_time_s'])}",  # at the recent step time
            flush=True,
        )


def evaluate(engine: Any, batches: list[dict[str, torch.Tensor]], device: torch.device) -> dict[str, float]:
    """Held-out MLM/NSP accuracy and loss over every rank's validation batches (a collective)."""
    sums = evaluate_pretraining(engine, batches, device)
    return PretrainEval.from_list(all_reduce_sums(sums.as_list(), device)).metrics(prefix="val_")


def log_eval(tracker: Tracker | None, metrics: dict[str, float], step: int) -> None:
    if tracker is not None and metrics:
        tracker.log(metrics, step=step)
        log0(f"step {step} validation: " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


def save_checkpoint(engine: Any, spec: RunSpec, step: int, plan: BatchPlan, rank: int) -> Path:
    """Every rank writes its part; rank 0 then verifies the tag and prunes old ones. A full disk
    is one UserError naming the checkpoint (torch's writer says only "file write failed")."""
    try:
        return _save_checkpoint(engine, spec, step, plan, rank)
    except Exception as exc:
        needed = CHECKPOINT_BYTES_PER_PARAM * count_parameters(engine.module)
        tag_dir = spec.checkpoints_dir / checkpoint.tag_for(step)
        if full_disk_path(exc) is None and (free_bytes(tag_dir) or 0) >= needed:
            raise
        raise disk_full_error(tag_dir, needed, "one checkpoint") from None


def _save_checkpoint(engine: Any, spec: RunSpec, step: int, plan: BatchPlan, rank: int) -> Path:
    root = spec.checkpoints_dir
    tag = checkpoint.tag_for(step)
    consumed = step * plan.global_batch
    engine.save_checkpoint(
        str(root), tag=tag, client_state={"step": step, "consumed_samples": consumed}, save_latest=False
    )
    tag_dir = root / tag
    checkpoint.save_rng_state(tag_dir, rank)
    dist.barrier()
    if rank == 0:
        checkpoint.write_verification(
            tag_dir,
            {
                "step": step,
                "consumed_samples": consumed,
                "world_size": plan.world_size,
                "global_batch": plan.global_batch,
                "zero_stage": spec.zero_stage,
                # a CPU rank's torch threads: its float sums depend on them (a resume under
                # another count is said, training/preflight.py `resume_threads_note`)
                "cpu_threads": None if spec.on_gpu else torch.get_num_threads(),
                "model_config": spec.model,
                "settings": spec.settings(),  # what a resume must match (training/preflight.py)
                **checkpoint.master_weight_names(engine),
            },
        )
        log0(f"saved checkpoint {tag_dir}")  # verified: only now are older ones removed
        for gone in checkpoint.prune(root, spec.pretrain.keep_checkpoints):
            log0(f"removed old checkpoint {gone.name}")
    dist.barrier()
    return tag_dir


# ----------------------------------------------------------------------------- final export


def export_final_model(spec: RunSpec, last_tag: Path, tracker: Tracker | None) -> None:
    """Rank 0: the last checkpoint (any ZeRO stage) as a Hugging Face directory, OUT/model."""
    from model.hf_io import write_hf_dir
    from training.consolidate import load_model_from_deepspeed_checkpoint

    final = load_model_from_deepspeed_checkpoint(last_tag)
    write_hf_dir(final, spec.out_dir / "model", spec.tokenizer_dir)
    log0(f"wrote the final model to {spec.out_dir / 'model'} (from {last_tag.name})")
    if tracker is not None:
        tracker.summary({"final_step": spec.pretrain.max_steps, "checkpoint": str(last_tag)})
        tracker.finish()


def remove_data_cache(spec: RunSpec, cache_root: Path) -> None:
    """The run is complete: its data cache is not needed again."""
    shutil.rmtree(cache_root, ignore_errors=True)
    if not spec.pretrain.data_cache_dir:
        try:
            cache_root.parent.rmdir()  # OUT/data_cache, once no other node's cache is left in it
        except OSError:
            pass


def train(spec: RunSpec, local_rank: int) -> None:
    ranks = init_distributed(spec, local_rank)
    resume = select_resume(spec, ranks)
    data = prepare_data(spec, ranks)
    engine = build_engine(spec, ranks, resume, data)
    tracker = open_tracker(spec, ranks, resume)
    # from here a SIGTERM saves the step reached (training/stop_request.py)
    with StopRequest() as stop, failure_recorded(tracker):
        last_tag = run_steps(spec, engine, data, ranks, resume, tracker, stop)
    if ranks.rank == 0:
        with failure_recorded(tracker):
            export_final_model(spec, last_tag, tracker)
    dist.barrier()
    if ranks.local_rank == 0:
        remove_data_cache(spec, data.cache_root)


@contextmanager
def failure_recorded(tracker: Tracker | None) -> Iterator[None]:
    """An exception leaving the block first ends rank 0's W&B run (`end_failed_run`)."""
    try:
        yield
    except BaseException as exc:
        end_failed_run(tracker, exc)
        raise


def end_failed_run(tracker: Tracker | None, exc: BaseException) -> None:
    """Rank 0's W&B run, ended before the rank leaves by `_exit_now` (os._exit skips W&B's own exit
    hook, and the launcher then stops W&B's service): it keeps every step logged, is marked failed
    with the code the rank exits with, and says why in its summary (`exit_reason`). Bounded by
    TRACKER_FINISH_TIMEOUT_S: a W&B that does not finish in time is left as it is."""
    if tracker is None:
        return

    def finish() -> None:
        try:
            tracker.summary({"exit_reason": exit_reason(exc), "exit_code": exit_code(exc)})
            tracker.finish(exit_code=exit_code(exc))
        except Exception as err:  # the rank's own error is the one to report
            log0(warning_line(f"the W&B run could not be ended: {err}"))

    worker = threading.Thread(target=finish, name="end-wandb-run", daemon=True)
    worker.start()
    worker.join(TRACKER_FINISH_TIMEOUT_S)


def exit_reason(exc: BaseException) -> str:
    """The first line of the error a rank stops with (a library's own error named by its type)."""
    line = next(iter(str(exc).splitlines()), "")
    if isinstance(exc, UserError | FloatingPointError):
        return line
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def exit_code(exc: BaseException) -> int:
    """The code a rank exits with after `exc`: a UserError's own (PretrainingStopped: 143), 3 for a
    non-finite loss, else 1."""
    if isinstance(exc, UserError):
        return exc.exit_code
    return 3 if isinstance(exc, FloatingPointError) else 1


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _train_or_user_error(spec: RunSpec, local_rank: int) -> None:
    """`train`, with a full disk anywhere (metrics.jsonl, the final model, ...) as a UserError."""
    try:
        train(spec, local_rank)
    except Exception as exc:  # OSError, or a library's own error (safetensors: "os error 28")
        if (where := full_disk_path(exc)) is None:
            raise
        raise disk_full_error(where or spec.out_dir, None, "pretraining") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="run_spec.json written by `bertflow pretrain`")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args(argv)
    survive_a_lost_reader()  # kill -9 of bertflow: the ranks still save the step they reached
    stop_when_launcher_dies()  # and save the step they reached, instead of training on unsupervised
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    spec = RunSpec.read(Path(args.spec))
    try:
        _train_or_user_error(spec, local_rank)
    except (UserError, FloatingPointError) as exc:
        # No barrier and no process-group teardown: the other ranks may be inside a collective, and
        # a gloo/NCCL group left at interpreter exit can hang until the collective timeout. Leave
        # at once; the launcher stops the other ranks (fail fast, no 10-minute wait).
        # a requested stop reads the same on every rank: one line a node
        silent = isinstance(exc, PretrainingStopped) and local_rank != 0
        if not silent:
            print(f"rank {os.environ.get('RANK', local_rank)}: error: {exc}", file=sys.stderr, flush=True)
        _exit_now(exit_code(exc))  # PretrainingStopped: 143
    except BaseException as exc:
        if (what := peer_failure(exc)) is not None:  # one paragraph, the same on every rank
            rank = os.environ.get("RANK", local_rank)
            print(f"rank {rank}: {str(exc).splitlines()[0][:300]}", file=sys.stderr, flush=True)
            lost = lost_ranks_message(
                what, spec.pretrain.dist_timeout_s, spec.pretrain.nnodes, spec.checkpoints_dir
            )
            print(f"rank {rank}: error: {lost}", file=sys.stderr, flush=True)
            _exit_now(1)
        import traceback

        traceback.print_exc()
        _exit_now(1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
