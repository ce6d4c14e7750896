"""One pretraining step (forward + backward + AdamW step), fp32 on CPU: ours vs transformers.

Both models start from the same weights (ours, exported and reloaded by
`transformers.BertForPreTraining` with `attn_implementation="sdpa"`), both run in train mode with
the same dropout, on the same batch (seq 128, 15% of positions labelled, NSP labels), each with its
own `torch.optim.AdamW` built with identical settings. Steps alternate ours / reference in the same
process; after warm-up the median of several repetitions is reported as tokens/s and the ratio.

    python benchmarks/bench_model_step.py            # mini @ batch 32 and base @ batch 8
    python benchmarks/bench_model_step.py --quick    # fewer repetitions
    python benchmarks/bench_model_step.py --optimizer fused   # both sides use AdamW(fused=True)

Goal (foundation issue): ours >= 2x on mini, >= 1.3x on base.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from model.config import BertConfig  # noqa: E402
from model.heads import BertForPreTraining  # noqa: E402
from model.hf_io import write_hf_dir  # noqa: E402

SEQ = 128
MASK_FRACTION = 0.15
CASES = (("mini", 32), ("base", 8))


def make_batch(cfg: BertConfig, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (batch, SEQ), generator=g)
    segments = torch.zeros_like(ids)
    segments[:, SEQ // 2 :] = 1
    n_pred = round(SEQ * MASK_FRACTION)  # 19 of 128 positions per sequence
    positions = torch.stack([torch.randperm(SEQ - 2, generator=g)[:n_pred] + 1 for _ in range(batch)])
    positions = positions.sort(dim=1).values
    labels = torch.gather(ids, 1, positions)
    ids = ids.scatter(1, positions, 103)  # [MASK]
    hf_labels = torch.full_like(ids, -100).scatter(1, positions, labels)
    return dict(
        input_ids=ids,
        token_type_ids=segments,
        attention_mask=torch.ones_like(ids),
        positions=positions,
        labels=labels,
        hf_labels=hf_labels,
        nsp=torch.randint(0, 2, (batch,), generator=g),
    )


def adamw(model: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    flags = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[kind]
    return torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, **flags
    )


def step_ours(model, opt, b) -> float:
    out = model(
        b["input_ids"],
        b["token_type_ids"],
        b["attention_mask"],
        masked_lm_positions=b["positions"],
        masked_lm_labels=b["labels"],
        next_sentence_labels=b["nsp"],
    )
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def step_ours_full_last_layer(model, opt, b) -> float:
    """Ablation: our model with the MLM head at the masked positions, but the last encoder layer
    run on every token (i.e. without the `output_rows` shortcut)."""
    import torch.nn.functional as F

    from model.bert import gather_rows

    seq, pooled = model.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
    selected = gather_rows(seq, b["positions"]).reshape(-1, seq.shape[-1])
    labels = b["labels"].reshape(-1)
    keep = labels != -100
    loss = model.cls.predictions(selected[keep], labels[keep]).loss + F.cross_entropy(
        model.cls.seq_relationship(pooled), b["nsp"]
    )
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def step_hf(model, opt, b) -> float:
    out = model(
        input_ids=b["input_ids"],
        token_type_ids=b["token_type_ids"],
        attention_mask=b["attention_mask"],
        labels=b["hf_labels"],
        next_sentence_label=b["nsp"],
    )
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


CLOCK = time.perf_counter


def timed(fn) -> float:
    t0 = CLOCK()
    fn()
    return CLOCK() - t0


def run_case(
    preset: str, batch: int, reps: int, warmup: int, optimizer: str, ablation: bool = False
) -> dict[str, float]:
    import transformers
    from transformers import BertForPreTraining as HFBertForPreTraining

    transformers.utils.logging.disable_progress_bar()

    torch.manual_seed(0)
    cfg = BertConfig.from_preset(preset)
    ours = BertForPreTraining(cfg).train()
    with tempfile.TemporaryDirectory() as tmp:
        write_hf_dir(ours, tmp)
        ref = HFBertForPreTraining.from_pretrained(tmp, attn_implementation="sdpa").train()
    b = make_batch(cfg, batch)
    opt_ours, opt_ref = adamw(ours, optimizer), adamw(ref, optimizer)
    if ablation:
        import copy

        ours_full = copy.deepcopy(ours)
        ours_full.tie_weights()
        opt_full = adamw(ours_full, optimizer)

    # Same weights and same batch: the first losses agree up to dropout noise, checked in eval mode.
    ours.eval(), ref.eval()
    with torch.no_grad():
        lo = ours(
            b["input_ids"], b["token_type_ids"], b["attention_mask"], b["positions"], b["labels"], b["nsp"]
        ).loss
        lr = ref(
            input_ids=b["input_ids"],
            token_type_ids=b["token_type_ids"],
            attention_mask=b["attention_mask"],
            labels=b["hf_labels"],
            next_sentence_label=b["nsp"],
        ).loss
    assert abs(float(lo) - float(lr)) < 1e-4, (float(lo), float(lr))
    ours.train(), ref.train()

    t_ours: list[float] = []
    t_ref: list[float] = []
    t_full: list[float] = []
    for i in range(warmup + reps):
        a = timed(lambda: step_ours(ours, opt_ours, b))
        r = timed(lambda: step_hf(ref, opt_ref, b))
        f = timed(lambda: step_ours_full_last_layer(ours_full, opt_full, b)) if ablation else 0.0
        if i >= warmup:
            t_ours.append(a)
            t_ref.append(r)
            t_full.append(f)
    tokens = batch * SEQ
    med_ours, med_ref = statistics.median(t_ours), statistics.median(t_ref)
    extra = {}
    if ablation:
        med_full = statistics.median(t_full)
        extra = {"tok_s_full_last_layer": tokens / med_full, "ratio_full_last_layer": med_ref / med_full}
    return {
        **extra,
        "tok_s_ours": tokens / med_ours,
        "tok_s_ref": tokens / med_ref,
        "ratio": med_ref / med_ours,
        "ms_ours": 1000 * med_ours,
        "ms_ref": 1000 * med_ref,
    }


def parser() -> argparse.ArgumentParser:
    from bench_args import non_negative_int, positive_int, preset_batch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 warm-up + 3 timed steps per side")
    p.add_argument("--reps", type=positive_int, default=7)
    p.add_argument("--warmup", type=non_negative_int, default=2)
    p.add_argument(
        "--optimizer",
        choices=("loop", "foreach", "fused"),
        default="loop",
        help="AdamW implementation, the same on both sides (default: torch's CPU default)",
    )
    p.add_argument(
        "--case", action="append", type=preset_batch, help="PRESET:BATCH, repeatable (default mini:32 base:8)"
    )
    p.add_argument(
        "--ablation",
        action="store_true",
        help="also time ours without the sparse last layer (3-way alternation)",
    )
    p.add_argument("--threads", type=positive_int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time (the goal's measure); cpu: this process's CPU time, steadier on a busy machine",
    )
    return p


def main() -> int:
    args = parser().parse_args()
    global CLOCK
    CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = 3 if args.quick else args.reps
    cases = args.case or CASES

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, seq {SEQ}, "
        f"{MASK_FRACTION:.0%} positions labelled, AdamW={args.optimizer}, {args.clock} clock, "
        f"{args.warmup} warm-up + {reps} timed steps per side, alternating"
    )
    print(f"{'case':<12}{'ours tok/s':>12}{'hf tok/s':>12}{'ours ms':>10}{'hf ms':>10}{'ratio':>8}")
    for preset, batch in cases:
        r = run_case(preset, batch, reps, args.warmup, args.optimizer, args.ablation)
        print(
            f"{preset + '@' + str(batch):<12}{r['tok_s_ours']:>12.0f}{r['tok_s_ref']:>12.0f}"
            f"{r['ms_ours']:>10.0f}{r['ms_ref']:>10.0f}{r['ratio']:>7.2f}x",
            flush=True,
        )
        if args.ablation:
            print(
                f"{'  ablation':<12}{r['tok_s_full_last_layer']:>12.0f}  ours with the last layer on every token: "
                f"{r['ratio_full_last_layer']:.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
