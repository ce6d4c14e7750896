"""Shared settings and helpers of the pretrain tests: one small real configuration, a way to run the
CLI as a separate process tree and kill -9 all of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from common.paths import PROJECT_ROOT, torch_extensions_dir
from common.tracking import read_metrics
from pipelines.config import PipelineConfig, load_config

# tiny preset, 2 gloo processes, 12 steps; checkpoints at 4, 8, 12 (all kept)
BASE_SETTINGS = [
    "model.preset=tiny",
    "pretrain.num_processes=2",
    "pretrain.zero_stage=2",
    "pretrain.micro_batch_size=8",
    "pretrain.gradient_accumulation_steps=1",
    "pretrain.max_steps=12",
    "pretrain.lr=0.002",
    "pretrain.warmup_steps=2",
    "pretrain.checkpoint_every=4",
    "pretrain.keep_checkpoints=3",
    "pretrain.eval_every=6",
    "pretrain.eval_batches=4",
    "pretrain.log_every=1",
    "pretrain.seed=5",
]


def settings(*extra: str) -> list[str]:
    return [*BASE_SETTINGS, *extra]


def config(*extra: str) -> PipelineConfig:
    return load_config(None, settings(*extra))


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir())
    env.update(extra)
    return env


def start_cli(
    shards: Path,
    tok: Path,
    out: Path,
    sets: list[str],
    args: tuple[str, ...] = (),
    log: Path | None = None,
    pipe: bool = False,
    **env: str,
) -> subprocess.Popen:
    """`bertflow pretrain` as its own process tree (output to `log`, or to a pipe that the caller
    reads as `proc.stdout`, else discarded)."""
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "pretrain",
        "--shards",
        str(shards),
        "--tokenizer",
        str(tok),
    ]
    cmd += ["--output", str(out), *args] + [x for s in sets for x in ("--set", s)]
    sink = open(log, "wb") if log else subprocess.PIPE if pipe else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            cmd,
            cwd=PROJECT_ROOT,
            env=cli_env(**env),
            stdout=sink,
            stderr=subprocess.STDOUT if log or pipe else subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if log:
            sink.close()


def start_piped_until_step(
    shards: Path, tok: Path, out: Path, sets: list[str], step: int = 3, **env: str
) -> subprocess.Popen:
    """`start_cli` with its output into a pipe (`proc.stdout`) and steps slowed down, returned once
    metrics.jsonl holds step `step`: a run to stop or kill part of while it trains."""
    proc = start_cli(shards, tok, out, sets, pipe=True, BERTFLOW_DEBUG_STEP_DELAY_S="0.3", **env)
    deadline = time.time() + 240
    while max(losses(out), default=0) < step:
        if proc.poll() is not None or time.time() > deadline:
            kill_tree(proc)
            raise AssertionError(f"the run ended (rc {proc.returncode}) or stalled before step {step}")
        time.sleep(0.1)
    return proc


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {path} appeared")
        if time.time() > deadline:
            kill_tree(proc)
            raise AssertionError(f"{path} did not appear in {timeout}s")
        time.sleep(0.2)


def kill_tree(proc: subprocess.Popen) -> None:
    """kill -9 the CLI, the launcher and every rank at once (what a node failure does)."""
    try:
        parent = psutil.Process(proc.pid)
        victims = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        victims = []
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(victims, timeout=30)
