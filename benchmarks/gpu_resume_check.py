"""Is resume exact on this machine? `bertflow pretrain` (tiny model, 80 steps, dropout on, a checkpoint
every 20) run four ways on the same shards: twice uninterrupted, once stopped by SIGTERM at step 30 and
rerun, once killed -9 as a whole process tree at step 50 and rerun. Writes ROOT/resume_check.json: each
run's exit codes, the checkpoints a stop left, the final weights' hash, and per pair the largest loss
difference over the 80 steps (0.0 = bit for bit).

    python benchmarks/gpu_resume_check.py SHARDS TOKENIZER ROOT        # gpu_flow_check.sh runs it
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.pretrain_runs import kill_tree, losses, start_cli  # noqa: E402

SETTINGS = [
    "model.preset=tiny", "pretrain.num_processes=auto", "pretrain.max_steps=80", "pretrain.warmup_steps=8",
    "pretrain.checkpoint_every=20", "pretrain.keep_checkpoints=5", "pretrain.log_every=1",
    "pretrain.eval_every=40", "pretrain.eval_batches=4", "pretrain.dropout=0.1", "pretrain.seed=5",
    "pretrain.lr=0.002",
]  # fmt: skip
SLOW_STEPS = {"BERTFLOW_DEBUG_STEP_DELAY_S": "0.1"}  # so that a stop lands at the step asked for


def run(shards: Path, tok: Path, out: Path, record: dict, stop: str = "", at: int = 0) -> dict[int, float]:
    """One run into `out`; with `stop` ('term' or 'kill') interrupted once `at` steps are logged, then
    rerun to the end. Returns its losses by step (a resumed step's last logged value)."""
    # the ranks need the carried packages too
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = start_cli(
        shards, tok, out, SETTINGS, log=out.with_suffix(".log"), **env, **(SLOW_STEPS if stop else {})
    )
    if stop:
        while max(losses(out), default=0) < at and proc.poll() is None:
            time.sleep(0.02)
        stopped_at = max(losses(out), default=0)
        if stop == "term":
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=180)
        else:
            kill_tree(proc)
        kept = sorted(p.name for p in (out / "checkpoints").glob("global_step*"))
        record["stopped"] = {"how": stop, "rc": proc.returncode, "at_step": stopped_at, "checkpoints": kept}
        proc = start_cli(shards, tok, out, SETTINGS, log=out.with_suffix(".rerun.log"), **env)
    proc.wait(timeout=600)
    weights = out / "model" / "model.safetensors"
    record.update(rc=proc.returncode, wall_s=round(time.time() - started, 1),
                  weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.exists() else None)  # fmt: skip
    return losses(out)


def compare(a: dict[int, float], b: dict[int, float]) -> dict:
    steps = sorted(set(a) & set(b))
    return {"steps": len(steps), "max_abs_diff": max((abs(a[s] - b[s]) for s in steps), default=None),
            "first_different_step": next((s for s in steps if a[s] != b[s]), None),
            "steps_in_one_only": sorted(set(a) ^ set(b))}  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    shards, tok, root = Path(argv[0]), Path(argv[1]), Path(argv[2])
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict] = {name: {} for name in ("uninterrupted", "again", "sigterm_at_30", "kill9_at_50")}
    curves = {
        "uninterrupted": run(shards, tok, root / "uninterrupted", runs["uninterrupted"]),
        "again": run(shards, tok, root / "again", runs["again"]),
        "sigterm_at_30": run(shards, tok, root / "sigterm", runs["sigterm_at_30"], stop="term", at=30),
        "kill9_at_50": run(shards, tok, root / "kill9", runs["kill9_at_50"], stop="kill", at=50),
    }
    result = {"runs": runs, "against_uninterrupted": {k: compare(curves["uninterrupted"], v)
                                                      for k, v in curves.items() if k != "uninterrupted"}}  # fmt: skip
    (root / "resume_check.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
