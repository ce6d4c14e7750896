"""The GPU check: every GPU code path of the pretraining stage, run and measured by one command.

On a GPU machine (the device tool's bare H100/H200; `benchmarks/gpu_check.sh` installs the carried
wheels first, then runs this):
    bash benchmarks/gpu_check.sh [--parts base,hf,ops,kernels]      # = make gpu-check PARTS=...
Here, on CPU, the same script end to end with tiny shapes (fp32, gloo, a few steps):
    python benchmarks/gpu_check.py --dry-run --carry DIR
Join the summaries of several calls into docs/gpu/<date>-<gpu>.json + .md:
    python benchmarks/gpu_check.py --merge call1/gpu_check.json call2/gpu_check.json --out docs/gpu

Parts, in the order they run (`env` always runs first; every part runs in its own process with a
time limit, and its result is appended to OUT/gpu_check.json + OUT/gpu_check.md, rewritten after
each part, so a call cut short still returns what it finished):
  env       device, versions (torch, CUDA, nvcc, DeepSpeed), the bf16 8192³ matmul ceiling
  base      `bertflow pretrain`: BERT-base, seq 128, bf16, ZeRO-2, one GPU, the largest micro batch
            that fits (probed first by gpu_batch_probe.py): tokens/s, samples/s, TFLOP/s, MFU
  hf        the same batches through plain loops around transformers.BertForPreTraining and around
            our model (bf16 autocast, fused AdamW): the stage / transformers ratio
  ops       DeepSpeed FusedAdam / FusedLamb JIT-built with the machine's nvcc, one step each vs a reference
  kernels   SDPA kernels named by torch.profiler; unpadded vs padded vs torch.nn.attention.varlen;
            torch.compile on/off (BERT-base, micro batch 128, forward + backward)
  large     `bertflow pretrain`: BERT-large, seq 512, bf16, ZeRO-2, largest micro batch: samples/s
  fp16      `bertflow pretrain`: BERT-base, seq 128, fp16 with dynamic loss scaling, 300 steps: the
            loss-scale trajectory, non-finite losses
  variants  `bertflow pretrain` for a few steps with LAMB, Muon (ZeRO 0), ZeRO-3 and ZeRO-Offload:
            does each path run, and how fast
  finetune  one fine-tuning unit (SST-2) on the GPU, from the last pretrained model of the call,
            run twice in one process (the second with every per-shape cache warm)
  quality   does pretraining pay on the GPU: the default's tiny model pretrained with the one-hour CPU
            recipe's two phases (3,000 steps of 128 x 32 tokens, then 8,500 of 64 x 128), then
            `bertflow finetune configs/default.yaml` (five GLUE tasks, three seeds, against random
            init): the held-out MLM curves and the scorecard's headline

The device tool runs one command for at most 10 minutes on a machine that starts bare, so the check
is three calls (each at most about 8 minutes of work plus the machine's start; ESTIMATE_S below),
after `make gpu-check-prep` here has filled `.gpu_carry/` (wheels, tokenizer, shards, GLUE files):
  1. run(command="bash benchmarks/gpu_check.sh --parts base,hf,ops,kernels,fp16", carry=[".gpu_carry"], timeout_s=600)
  2. run(command="bash benchmarks/gpu_check.sh --parts large,variants,finetune", carry=[".gpu_carry"], timeout_s=600)
  3. run(command="bash benchmarks/gpu_check.sh --parts quality", carry=[".gpu_carry"], timeout_s=600)
  4. here: python benchmarks/gpu_check.py --merge <files of 1>/gpu_check.json <files of 2>/gpu_check.json ... --out docs/gpu
`quality` fine-tunes as `make run` does; GPU_CHECK_QUALITY_FINETUNE adds `bertflow finetune` flags,
e.g. the one-hour recipe's budget (checked before any part runs, recorded in the probe):
  GPU_CHECK_QUALITY_FINETUNE="--max-train-examples 4000 --set finetune.max_eval_examples=null
  --lr 1e-4,3e-4,1e-3 --workers 6 --set finetune.units_per_gpu=6" bash benchmarks/gpu_check.sh --parts quality
The 30 files' shards at three lengths leave the quality call a corpus it reads several times over;
a quality-only carry (no 512-token shards) holds about twice the files, and can hold the one-hour
recipe's own vocabulary:
  python benchmarks/gpu_check_prep.py --out .gpu_carry/quality --seqs 32,128 --wiki-files 55 --tokenizer cpu-hour
  run(command="GPU_CARRY=.gpu_carry/quality bash benchmarks/gpu_check.sh --parts quality",
      carry=[".gpu_carry/quality"], timeout_s=600)
`quality` leaves its final model in OUT/quality-model.tar.gz (when under 16 MiB) for CPU fine-tuning later.
A part that would not finish inside the call's budget (`--budget-s`, 540 s) is skipped and says so;
run it in a further call with `--parts NAME`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import gpu_summary  # noqa: E402
from gpu_check_prep import GLUE_TASKS  # noqa: E402
from gpu_context import (  # noqa: E402
    DRY_PLAN,
    GPU_PLAN,
    PARTIAL_ENV,
    QUALITY_FINETUNE_ENV,
    Context,
    child_env,
    run_logged,
)
from gpu_parts import PARTS  # noqa: E402

# Seconds each part is expected to take on an H100/H200, a bare machine's JIT builds included: the
# seconds the GPU runs recorded (docs/gpu/: H200 and H100, 2026-11-26/27) with some margin. `quality`
# is a guess: 242-254 s on an H200 at 3,500 steps of 20 ms; the recipe's 11,500 smaller steps add
# about 3.5 minutes if a step stays ~18 ms. `env` builds DeepSpeed's FusedAdam first, as `make install`
# does (38 s on the H200 machine; before 2026-11-27 a call's first stage paid it: `large`'s 120 s on
# the H100 among them), so `ops` builds only FusedLamb (31 s) and `large` needs less. A part is
# skipped when less than this is left of the call's budget.
ESTIMATE_S = {"env": 55, "base": 110, "hf": 45, "ops": 60, "kernels": 130, "large": 120, "fp16": 70,
              "variants": 270, "finetune": 70, "quality": 460}  # fmt: skip
CALLS = ("base,hf,ops,kernels,fp16", "large,variants,finetune", "quality")  # the device calls above


def required_carry(parts: list[str]) -> list[str]:
    need = ["tokenizer/vocab.txt", "shards-128/manifest.json"]
    if "large" in parts:
        need.append("shards-512/manifest.json")
    if "finetune" in parts:
        need.append("data/glue/SST-2/dev.tsv")
    if "quality" in parts:
        need.append("shards-32/manifest.json")
        need += [f"data/glue/{task}/{split}.tsv" for task in GLUE_TASKS for split in ("train", "dev")]
    return need


def check_carry(carry: Path, parts: list[str]) -> str | None:
    missing = [p for p in required_carry(parts) if not (carry / p).is_file()]
    if missing:
        return (f"{carry} lacks {', '.join(missing)}: run `make gpu-check-prep` here first (it writes "
                f".gpu_carry/), then carry it to the GPU machine (device tool: carry=[\".gpu_carry\"]).")  # fmt: skip
    return None


def check_quality_flags(parts: list[str], flags: tuple[str, ...]) -> str | None:
    """Flags for `quality`'s `bertflow finetune` (GPU_CHECK_QUALITY_FINETUNE) that the command
    would refuse, by name or by value (`--set finetune.lrs=x`, `--tasks sst3`): said before the
    pretraining spends the call's minutes, not after."""
    if "quality" not in parts or not flags:
        return None
    from common.errors import UserError
    from finetuning.units import finetune_units
    from pipelines.cli import build_parser
    from pipelines.config import load_config
    from pipelines.stage_finetune import apply_flags

    config = ROOT / "configs" / "default.yaml"
    where = f"{QUALITY_FINETUNE_ENV}={' '.join(flags)!r}"
    try:
        args, extra = build_parser("finetune").parse_known_args(
            ["finetune", str(config), "--checkpoint", "model", *flags]
        )
    except SystemExit:
        args, extra = None, list(flags)
    if extra:
        return (
            f"{where}: `bertflow finetune` does not take {' '.join(extra)}; see `bertflow finetune --help`."
        )
    try:
        finetune_units(apply_flags(load_config(config, args.set).finetune, args))  # task names too
    except UserError as exc:
        return f"{where}: {exc}"
    return None


def check_gpu() -> str | None:
    probe = [sys.executable, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return "torch sees no CUDA GPU here: on a machine without one, run the CPU dry run (--dry-run)."
    return None


def prepare_environment() -> None:
    """What every part's process needs on a bare machine: no W&B, no hub, JIT builds for this GPU."""
    os.environ["WANDB_MODE"] = "disabled"  # the GPU image has no wandb; metrics.jsonl is kept
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("PYTHONUNBUFFERED", "1"),
                       ("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")),  # a bare machine: nothing to share
                       ("MAX_JOBS", str(os.cpu_count() or 4))):  # fmt: skip
        os.environ.setdefault(key, value)
    if "TORCH_CUDA_ARCH_LIST" not in os.environ and shutil.which("nvidia-smi"):
        try:
            cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.split()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            cap = []
        if cap:
            os.environ["TORCH_CUDA_ARCH_LIST"] = cap[0]  # DeepSpeed's JIT ops: this GPU only (faster build)


def run_part(
    args: argparse.Namespace, part: str, summary_path: Path, deadline: float, work: Path
) -> tuple[dict, dict]:
    """One part in its own process; returns (outcome, result)."""
    result_path, partial_path = work / f"result-{part}.json", work / f"partial-{part}.json"
    for p in (result_path, partial_path):
        p.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", part, "--carry", str(args.carry),
           "--work", str(work), "--summary", str(summary_path), "--result", str(result_path),
           "--deadline", str(deadline)] + (["--dry-run"] if args.dry_run else []) + (
           ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else [])  # fmt: skip
    env = {**child_env(), PARTIAL_ENV: str(partial_path)}
    t0 = time.time()
    rc, tail = run_logged(cmd, timeout=max(5.0, deadline - time.time()), env=env)
    seconds = time.time() - t0
    for path in (result_path, partial_path):
        if path.is_file():
            result = json.loads(path.read_text())
            break
    else:
        result = {}
    if rc == 0 and result_path.is_file():
        return {"status": "ok", "seconds": seconds}, result
    status = "timeout" if rc == 124 else "failed"
    return {"status": status, "seconds": seconds, "error": f"exit code {rc}: {tail[-800:]}"}, result


QUALITY_ARCHIVE = "quality-model.tar.gz"
RETURNED_FILE_LIMIT = 16 * 2**20  # the device tool brings back files of at most 16 MiB from $OUT


def keep_quality_model(result: dict, out: Path) -> None:
    """The quality part's final model as OUT/quality-model.tar.gz (`model/`: its `bertflow export-hf`,
    a Hugging Face directory with the run's card, whose marker keeps the pretraining's steps), so
    that a CPU session can fine-tune or evaluate it after the GPU is gone and its scorecard names it
    as the model bertflow pretrained; the probe says where it is, or why not (a 30 k vocabulary
    makes the tiny model ~18 MB)."""
    probe = result.get("probes", {}).get("quality")
    rows = [r for r in result.get("measurements", []) if r.get("status") == "ok" and r.get("model_dir")]
    if probe is None or "headline" not in probe or not rows:
        return
    target = out / QUALITY_ARCHIVE
    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "model"
        cmd = [sys.executable, "-m", "pipelines.cli", "export-hf", rows[-1]["model_dir"], str(exported)]
        done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
        if done.returncode != 0:
            probe["model_archive"] = f"not kept: export-hf failed: {(done.stderr or done.stdout)[-500:]}"
            return
        with tarfile.open(target, "w:gz") as tar:
            tar.add(exported, arcname="model")
    if target.stat().st_size > RETURNED_FILE_LIMIT:
        probe["model_archive"] = f"not kept: {target.stat().st_size / 2**20:.1f} MiB, over the 16 MiB a file"
        target.unlink()
    else:
        probe["model_archive"] = QUALITY_ARCHIVE


def orchestrate(args: argparse.Namespace) -> int:
    parts = ["env"] + [p for p in dict.fromkeys(args.parts.split(",")) if p and p != "env"]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"gpu_check: unknown part(s) {unknown}; use some of {', '.join(PARTS)}.", file=sys.stderr)
        return 2
    problem = check_carry(args.carry, parts) or (
        None if args.dry_run else check_quality_flags(parts, GPU_PLAN.quality_finetune) or check_gpu()
    )
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prepare_environment()
    if args.dry_run:  # tiny shapes gain nothing from threads; on a busy machine each one waits its turn
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    summary = gpu_summary.new_summary(args.dry_run, parts)
    json_path, _ = gpu_summary.write(summary, args.out)
    deadline = time.time() + args.budget_s
    for part in parts:
        left = deadline - time.time()
        need = 0 if args.dry_run else ESTIMATE_S[part]
        if left < need:
            outcome = {"status": "skipped", "seconds": 0.0,
                       "error": f"not enough time left in this call (needs ~{need} s, {left:.0f} s left): "
                                f"run it in another call with --parts {part}"}  # fmt: skip
            result: dict = {}
        else:
            print(f"\n==== gpu_check part {part} ({left:.0f} s left in this call)", flush=True)
            outcome, result = run_part(args, part, json_path, deadline, work)
            if part == "quality":
                keep_quality_model(result, args.out)
        gpu_summary.add_part(summary, part, outcome, result)
        gpu_summary.write(summary, args.out)
        print(f"==== part {part}: {outcome['status']} in {outcome['seconds']:.0f} s", flush=True)
    summary["calls"][-1]["finished"] = gpu_summary.now_iso()
    json_path, md_path = gpu_summary.write(summary, args.out)
    print("\n" + md_path.read_text(), flush=True)
    print(f"wrote {json_path} and {md_path}")
    return 0 if all(p["status"] == "ok" for p in summary["parts"].values()) else 1


def work_on_part(args: argparse.Namespace) -> int:
    """The worker side: one part, in this process; its result as JSON in --result."""
    ctx = Context(
        plan=DRY_PLAN if args.dry_run else GPU_PLAN,
        carry=args.carry.resolve(),
        work=args.work.resolve(),
        summary=json.loads(args.summary.read_text()) if args.summary and args.summary.is_file() else {},
        deadline=args.deadline or time.time() + 3600,
        peak_tflops=args.peak_tflops,
    )
    result = PARTS[args.worker](ctx)
    args.result.write_text(json.dumps(result, indent=2, default=str))
    return 0


def merge_files(args: argparse.Namespace) -> int:
    merged = gpu_summary.merge([gpu_summary.load(p) for p in args.merge])
    stem = args.name or gpu_summary.default_stem(merged)
    json_path, md_path = gpu_summary.write(merged, args.out, stem)
    print(f"wrote {json_path} and {md_path}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)  # fmt: skip
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, fp32: proves the script works")
    ap.add_argument("--carry", type=Path, default=ROOT / ".gpu_carry", help="what gpu_check_prep.py wrote")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "gpu_check"),
                    help="summary folder (default $OUT, else runs/gpu_check)")  # fmt: skip
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bertflow-gpu-check",
                    help="run directories of this call (emptied first; several GB for BERT-large)")  # fmt: skip
    ap.add_argument(
        "--budget-s", type=float, default=None, help="seconds for this call (default 540; dry run 3600)"
    )
    ap.add_argument("--peak-tflops", type=float, help="MFU denominator override (default: training/flops.py)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="join these summaries into --out")
    ap.add_argument("--name", help="file stem for --merge (default <date>-<gpu>)")
    ap.add_argument("--worker", choices=list(PARTS), help=argparse.SUPPRESS)
    ap.add_argument("--summary", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 3600.0 if args.dry_run else 540.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge_files(args)
    if args.worker:
        return work_on_part(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
