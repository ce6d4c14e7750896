"""The per-rank pretraining script that the DeepSpeed launcher (or torchrun) starts on every rank.

    python -m training.train --spec OUT/run_spec.json [--local_rank N]

`run_spec.json` is written by `pipelines/stage_pretrain.py` after it has validated everything; it
holds the resolved settings (pipeline config, DeepSpeed JSON, model config, paths). This script
trusts it, trains, checkpoints, and on rank 0 logs metrics and writes the final HF model dir.
Any exception on any rank ends that process non-zero, and the launcher then stops the other ranks;
collectives carry a timeout, so a rank that hangs cannot hold the others forever.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import resource
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining
from preprocessing.masking import MaskingSpec
from preprocessing.wordpiece import SPECIAL_TOKENS
from training import checkpoint, example_cache, preflight
from training.data import BatchPlan, PretrainLoader, eval_batches, mapped_split
from training.ds_config import offloads_optimizer, precision_of
from training.flops import device_peak_tflops, step_flops
from training.optim import build_optimizer, build_scheduler

# Fault-injection hooks for the fault tests (never set in normal runs).
NAN_DEBUG_ENV = "BERTFLOW_DEBUG_NAN_AT_STEP"  # make the loss NaN at this step
DELAY_DEBUG_ENV = "BERTFLOW_DEBUG_STEP_DELAY_S"  # sleep this long per step (gives kill tests a window)
T0 = time.perf_counter()


def log0(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(msg, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(spec: dict[str, Any], resuming: bool) -> BertForPreTraining:
    seed_everything(spec["pretrain"]["seed"])  # same initial weights on every rank
    config = BertConfig.from_hf_dict(spec["model_config"])
    model = BertForPreTraining(config)
    init_from = spec["pretrain"].get("init_from")
    if init_from and not resuming:
        from model.hf_io import load_pretraining_model

        loaded, _missing = load_pretraining_model(init_from)
        model.load_state_dict(loaded.state_dict())
        model.tie_weights()
        log0(f"initialized weights from {init_from}")
    return model


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


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def node_cache_dir(configured: str | None, out_dir: Path, first_rank: int) -> Path:
    """This node's data cache: under `pretrain.data_cache_dir` ($VARS expanded here, so each node
    may name its own local disk) or OUT/data_cache, in a folder named by the host and the global
    rank of the node's first process. Two nodes never build into the same folder, whether they
    share the cache folder (same host, or a shared filesystem) or not."""
    if configured and "$" in os.path.expandvars(configured):
        raise UserError(
            f"pretrain.data_cache_dir {configured!r} names a variable that is not set on {socket.gethostname()}.",
            fix="export it on every node, or give a plain path.",
        )
    root = Path(os.path.expandvars(configured)).expanduser() if configured else out_dir / "data_cache"
    return root / f"{socket.gethostname()}-rank{first_rank}"


def reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate(engine, batches, device) -> dict[str, float]:
    engine.eval()
    sums = [0.0] * 5  # mlm_correct, mlm_count, nsp_correct, nsp_count, mlm_loss_sum
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        out = engine(**batch)
        n = out.mlm_labels.numel()
        sums[0] += (out.mlm_logits.argmax(-1) == out.mlm_labels).sum().item()
        sums[1] += n
        sums[2] += (out.nsp_logits.argmax(-1) == batch["next_sentence_labels"]).sum().item()
        sums[3] += batch["next_sentence_labels"].numel()
        sums[4] += out.mlm_loss.item() * n
    engine.train()
    s = reduce_sum(sums, device)
    if s[1] == 0:
        return {}
    return {
        "val_mlm_acc": s[0] / s[1],
        "val_nsp_acc": s[2] / max(1, s[3]),
        "val_mlm_loss": s[4] / s[1],
    }


def train(spec: dict[str, Any], local_rank: int) -> None:
    import deepspeed

    pcfg = spec["pretrain"]
    on_gpu = spec["on_gpu"]
    deepspeed.init_distributed(
        dist_backend="nccl" if on_gpu else "gloo",
        timeout=datetime.timedelta(seconds=pcfg["dist_timeout_s"]),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    if on_gpu:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    out_dir = Path(spec["out_dir"])
    ckpt_root = out_dir / "checkpoints"
    ds_config = spec["ds_config"]

    # --- which checkpoint to resume from: rank 0 verifies, every rank follows ----------------------
    choice: list[Any] = [None]
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        found = checkpoint.newest_good(ckpt_root, warn=log0)
        good_step = checkpoint.step_of(found[0]) if found is not None else -1
        for tag in checkpoint.tag_dirs(ckpt_root):
            if checkpoint.step_of(tag) > good_step and checkpoint.read_verification(tag) is not None:
                kept = tag.with_name(tag.name + ".corrupt")  # kept for inspection, never reused
                shutil.rmtree(kept, ignore_errors=True)
                tag.rename(kept)
        checkpoint.remove_unverified(ckpt_root)
        choice = [None if found is None else (str(found[0]), found[1])]
    dist.broadcast_object_list(choice, src=0)
    resume = choice[0]

    # --- data: the first rank of each node builds (or verifies) the memory-mapped cache ------------
    cache_root = node_cache_dir(pcfg.get("data_cache_dir"), out_dir, rank - local_rank)
    if local_rank == 0:
        t0 = time.perf_counter()
        example_cache.ensure(spec["shards_dir"], "train", cache_root, log=log0)
        try:
            example_cache.ensure(spec["shards_dir"], "validation", cache_root, log=log0)
        except UserError as exc:
            shutil.rmtree(cache_root / "validation", ignore_errors=True)
            log0(f"warning: no validation split, held-out accuracy will not be logged ({exc})")
        print(f"rank {rank}: data cache ready in {time.perf_counter() - t0:.1f}s: {cache_root}", flush=True)
    dist.barrier()
    store = mapped_split(cache_root / "train")
    vocab_size = spec["model_config"]["vocab_size"]
    if store.max_token_id >= vocab_size:
        raise UserError(
            f"shards in {spec['shards_dir']} hold token id {store.max_token_id}, but the model's "
            f"vocabulary has {vocab_size} entries.",
            fix="preprocess with the same tokenizer that you pass to pretrain.",
        )
    val_cache = cache_root / "validation"
    val_store = mapped_split(val_cache) if (val_cache / example_cache.CACHE_META).is_file() else None
    plan = BatchPlan(
        num_examples=len(store),
        micro_batch_size=pcfg["micro_batch_size"],
        grad_accum=pcfg["gradient_accumulation_steps"],
        world_size=world,
        rank=rank,
        seed=pcfg["seed"],
    )
    masking = None
    if pcfg["dynamic_masking"]:
        vocab = preflight.read_vocab(Path(spec["tokenizer_dir"]))
        m = spec["masking"]
        masking = MaskingSpec.from_vocab(
            vocab, SPECIAL_TOKENS, m["masked_lm_prob"], m["max_predictions_per_seq"], m["whole_word_mask"]
        )

    # --- model, optimizer, engine -----------------------------------------------------------------
    model = build_model(spec, resuming=resume is not None)
    optimizer = build_optimizer(
        model,
        pcfg["optimizer"],
        pcfg["lr"],
        pcfg["weight_decay"],
        on_gpu=on_gpu,
        offload=offloads_optimizer(ds_config),
    )
    scheduler = build_scheduler(optimizer, pcfg["warmup_steps"], pcfg["max_steps"])
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
    )
    if world == 1 and ds_config["zero_optimization"]["stage"] == 0:
        # One rank: the gradient all-reduce would only flatten every gradient into a bucket and
        # copy it back (~6% of a base step on CPU). ZeRO 1-3 keep their own gradient path.
        engine.enable_backward_allreduce = False
    if pcfg["compile"] and on_gpu and hasattr(engine, "compile"):
        engine.compile()

    start_step = 0
    if resume is not None:
        tag_dir, info = Path(resume[0]), resume[1]
        load_path, _ = engine.load_checkpoint(str(ckpt_root), tag=tag_dir.name)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_dir}")
        start_step = int(info["step"])
        if not checkpoint.load_rng_state(tag_dir, rank):
            log0(f"warning: {tag_dir} has no RNG state for rank {rank}; dropout masks will differ")
        log0(f"resumed from {tag_dir} at step {start_step} ({info['consumed_samples']} samples consumed)")
    else:
        seed_everything(pcfg["seed"] + 1000 * rank)  # per-rank dropout streams
    if rank == 0:
        rewrite_metrics_upto(out_dir, start_step)

    tracker = None
    if rank == 0:
        from common.tracking import Tracker

        tracker = Tracker(
            out_dir,
            project=spec["wandb"]["project"],
            name=spec["run_name"],
            group=spec["run_name"],
            job_type="pretrain",
            config={**spec["pipeline_config"], "deepspeed": ds_config, "world_size": world},
            mode=spec["wandb"]["mode"],
        )

    loader = PretrainLoader(
        store,
        plan,
        start_step=start_step,
        masking=masking,
        prefetch=pcfg["prefetch_batches"],
        pin_memory=on_gpu,
    )
    val_batches = (
        eval_batches(val_store, pcfg["micro_batch_size"], world, rank, pcfg["eval_batches"])
        if val_store
        else []
    )
    precision = precision_of(ds_config)
    peak = None
    if on_gpu:
        peak = device_peak_tflops(torch.cuda.get_device_name(device), precision, pcfg.get("peak_tflops"))
    mcfg = BertConfig.from_hf_dict(spec["model_config"])
    nan_step = int(os.environ.get(NAN_DEBUG_ENV, "0") or 0)
    step_delay = float(os.environ.get(DELAY_DEBUG_ENV, "0") or 0)
    log0(
        f"ready to train after {time.perf_counter() - T0:.1f}s: {len(store)} examples, world {world}, "
        f"global batch {plan.global_batch}, {plan.steps_per_epoch} steps/epoch, {precision}, "
        f"ZeRO {ds_config['zero_optimization']['stage']}, start step {start_step}"
    )

    bar = None
    if rank == 0 and sys.stdout.isatty():
        from tqdm import tqdm

        bar = tqdm(total=pcfg["max_steps"], initial=start_step, desc="pretrain", unit="step")

    last_tag: Path | None = Path(resume[0]) if resume else None
    t_window, wait_window, steps_window = time.perf_counter(), loader.data_wait_seconds, 0
    window = [0.0] * 3  # samples, tokens (non-pad), flops, summed over ranks
    engine.train()
    try:
        for step in range(start_step + 1, pcfg["max_steps"] + 1):
            batches = next(loader)
            stats = [0.0] * 12
            for m, batch in enumerate(batches):
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                out = engine(**batch)
                loss = out.loss
                if nan_step and step == nan_step:
                    loss = loss * float("nan")
                engine.backward(loss)
                n = out.mlm_labels.numel()
                stats[0] += loss.item()
                stats[1] += out.mlm_loss.item()
                stats[2] += out.nsp_loss.item()
                stats[3] += (out.mlm_logits.argmax(-1) == out.mlm_labels).sum().item()
                stats[4] += n
                stats[5] += (out.nsp_logits.argmax(-1) == batch["next_sentence_labels"]).sum().item()
                stats[6] += batch["next_sentence_labels"].numel()
                real_tokens = batch["attention_mask"].sum().item()
                stats[7] += real_tokens
                stats[8] += step_flops(mcfg, *batch["input_ids"].shape, n, int(real_tokens))
                stats[9] += 1  # micro batches
                if m < len(batches) - 1:
                    engine.step()
            s = reduce_sum(stats, device)
            mean_loss = s[0] / s[9]
            if not np.isfinite(mean_loss):
                where = f"last good checkpoint: {last_tag}" if last_tag else "no checkpoint was written yet"
                raise FloatingPointError(
                    f"loss is {mean_loss} at step {step}; stopping before the update is applied ({where}). "
                    "Lower pretrain.lr, raise warmup_steps, or use bf16 instead of fp16; rerunning resumes "
                    "from the last good checkpoint."
                )
            lr = engine.get_lr()[0]  # the rate this update uses
            engine.step()  # the accumulation boundary: DeepSpeed clips, steps and advances the LR
            if step_delay:
                time.sleep(step_delay)
            window[0] += s[6]
            window[1] += s[7]
            window[2] += s[8]
            steps_window += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{mean_loss:.3f}")

            if step % pcfg["log_every"] == 0 or step == pcfg["max_steps"]:
                now = time.perf_counter()
                elapsed = max(now - t_window, 1e-9)
                grad_norm = engine.get_global_grad_norm()
                row = {
                    "loss": mean_loss,
                    "mlm_loss": s[1] / s[9],
                    "nsp_loss": s[2] / s[9],
                    "mlm_acc": s[3] / max(1.0, s[4]),
                    "nsp_acc": s[5] / max(1.0, s[6]),
                    "lr": lr,
                    "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
                    "loss_scale": float(getattr(engine.optimizer, "cur_scale", 1.0) or 1.0),
                    "samples_per_s": window[0] / elapsed,
                    "tokens_per_s": window[1] / elapsed,
                    "tflops": window[2] / elapsed / 1e12,
                    "memory_mb": memory_mb(device),
                    "data_wait_fraction": (loader.data_wait_seconds - wait_window) / elapsed,
                    "step_time_s": elapsed / max(1, steps_window),
                    "consumed_samples": step * plan.global_batch,
                }
                if peak:
                    row["mfu"] = row["tflops"] / peak
                if tracker is not None:
                    tracker.log(row, step=step)
                    if bar is None:
                        print(
                            f"step {step}/{pcfg['max_steps']} loss {mean_loss:.4f} mlm_acc {row['mlm_acc']:.3f} "
                            f"lr {row['lr']:.2e} {row['tokens_per_s']:.0f} tok/s "
                            f"data_wait {row['data_wait_fraction']:.1%}",
                            flush=True,
                        )
                t_window, wait_window, steps_window = now, loader.data_wait_seconds, 0
                window = [0.0] * 3

            if val_batches and (step % pcfg["eval_every"] == 0 or step == pcfg["max_steps"]):
                metrics = evaluate(engine, val_batches, device)
                if tracker is not None and metrics:
                    tracker.log(metrics, step=step)
                    log0(f"step {step} validation: " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

            if step % pcfg["checkpoint_every"] == 0 or step == pcfg["max_steps"]:
                last_tag = save(engine, ckpt_root, step, plan, spec, rank)
    finally:
        loader.close()
        if bar is not None:
            bar.close()

    if rank == 0:
        from model.hf_io import write_hf_dir
        from training.consolidate import load_model_from_deepspeed_checkpoint

        final = load_model_from_deepspeed_checkpoint(last_tag)
        write_hf_dir(final, out_dir / "model", spec["tokenizer_dir"])
        log0(f"wrote the final model to {out_dir / 'model'} (from {last_tag.name})")
        if tracker is not None:
            tracker.summary({"final_step": pcfg["max_steps"], "checkpoint": str(last_tag)})
            tracker.finish()
    dist.barrier()
    if local_rank == 0:  # the run is complete: its data cache is not needed again
        shutil.rmtree(cache_root, ignore_errors=True)
        if not pcfg.get("data_cache_dir"):
            try:
                cache_root.parent.rmdir()  # OUT/data_cache, once no other node's cache is left in it
            except OSError:
                pass


def save(engine, ckpt_root: Path, step: int, plan: BatchPlan, spec: dict[str, Any], rank: int) -> Path:
    tag = checkpoint.tag_for(step)
    consumed = step * plan.global_batch
    engine.save_checkpoint(
        str(ckpt_root), tag=tag, client_state={"step": step, "consumed_samples": consumed}, save_latest=False
    )
    tag_dir = ckpt_root / tag
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
                "zero_stage": spec["ds_config"]["zero_optimization"]["stage"],
                "model_config": spec["model_config"],
            },
        )
        for gone in checkpoint.prune(ckpt_root, spec["pretrain"]["keep_checkpoints"]):
            log0(f"removed old checkpoint {gone.name}")
        log0(f"saved checkpoint {tag_dir}")
    dist.barrier()
    return tag_dir


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="run_spec.json written by `bertflow pretrain`")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args(argv)
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    spec = json.loads(Path(args.spec).read_text())
    try:
        train(spec, local_rank)
    except (UserError, FloatingPointError) as exc:
        # No barrier and no process-group teardown: the other ranks may be inside a collective, and
        # a gloo/NCCL group left at interpreter exit can hang until the collective timeout. Leave
        # at once; the launcher stops the other ranks (fail fast, no 10-minute wait).
        print(f"rank {os.environ.get('RANK', local_rank)}: error: {exc}", file=sys.stderr, flush=True)
        _exit_now(2 if isinstance(exc, UserError) else 3)
    except BaseException:
        import traceback

        traceback.print_exc()
        _exit_now(1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
