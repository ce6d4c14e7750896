"""DeepSpeed checkpoints that are complete, verified and few.

`engine.save_checkpoint` writes every rank's files into `checkpoints/global_stepN/`. After all
ranks have written (their DeepSpeed files and their RNG state), rank 0 records the sha256 of every
file in `_VERIFIED.json`, written atomically and last. A tag without that file, or whose files no
longer match it (truncated, bit-flipped), is not a checkpoint: resume takes the newest tag that
verifies and warns about any newer one it skipped. Only the newest `keep` verified tags are kept.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.atomic import atomic_path, atomic_write_json, sha256_file
from common.console import warning_line
from common.stage_output import TAG_RE, VERIFIED_NAME


def tag_for(step: int) -> str:
    return f"global_step{step}"


def step_of(tag_dir: Path) -> int | None:
    m = TAG_RE.match(tag_dir.name)
    return int(m.group(1)) if m else None


def write_verification(tag_dir: Path, payload: dict[str, Any]) -> None:
    """Rank 0, after every rank has finished writing into tag_dir."""
    files = {
        p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(tag_dir.iterdir())
        if p.is_file() and p.name != VERIFIED_NAME and not p.name.startswith(".tmp-")
    }
    atomic_write_json(tag_dir / VERIFIED_NAME, {**payload, "files": files})


def read_verification(tag_dir: Path) -> dict[str, Any] | None:
    import json

    path = tag_dir / VERIFIED_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def verify(tag_dir: Path, deep: bool = True) -> str | None:
    """None if the checkpoint is complete and intact, else the reason it is not."""
    info = read_verification(tag_dir)
    if info is None:
        return "incomplete (no verification file: the run stopped while saving it)"
    for name, meta in info.get("files", {}).items():
        p = tag_dir / name
        if not p.is_file():
            return f"file {name} is missing"
        if p.stat().st_size != meta["bytes"]:
            return f"file {name} has {p.stat().st_size} bytes, {meta['bytes']} were written"
        if deep and sha256_file(p) != meta["sha256"]:
            return f"file {name} is corrupt (checksum differs)"
    return None


def tag_dirs(root: Path) -> list[Path]:
    """Every global_stepN directory, newest first."""
    if not root.is_dir():
        return []
    tags = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(tags, key=lambda p: step_of(p), reverse=True)


def newest_good(root: Path, warn: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]] | None:
    """The newest verified checkpoint; newer broken ones are skipped with a warning."""
    for tag in tag_dirs(root):
        problem = verify(tag)
        if problem is None:
            return tag, read_verification(tag) or {}
        warn(warning_line(f"checkpoint {tag} is not usable: {problem}; falling back to an older one."))
    return None


def prepare_resume(root: Path, warn: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]] | None:
    """Before a (re)start, on one rank: the newest verified checkpoint to resume from (None: start
    fresh). Verified tags newer than it are broken: renamed `*.corrupt` (kept for inspection, never
    reused); unverified tags (a killed save) are removed."""
    root.mkdir(parents=True, exist_ok=True)
    found = newest_good(root, warn=warn)
    good_step = step_of(found[0]) if found is not None else -1
    for tag in tag_dirs(root):
        if step_of(tag) > good_step and read_verification(tag) is not None:
            kept = tag.with_name(tag.name + ".corrupt")
            shutil.rmtree(kept, ignore_errors=True)
            tag.rename(kept)
    remove_unverified(root)
    return found


def prune(root: Path, keep: int) -> list[Path]:
    """Keep the newest `keep` verified tags; delete older ones and any unverified tag older than
    the newest verified one. Returns the deleted directories."""
    tags = tag_dirs(root)
    verified = [t for t in tags if read_verification(t) is not None]
    keep_set = set(verified[:keep])
    newest_ok = step_of(verified[0]) if verified else -1
    deleted = []
    for t in tags:
        if t in keep_set:
            continue
        if read_verification(t) is not None or step_of(t) < newest_ok:
            shutil.rmtree(t, ignore_errors=True)
            deleted.append(t)
    return deleted


def remove_unverified(root: Path) -> list[Path]:
    """Before a (re)start: drop tags a killed run left half-written, so a later save to the same
    tag cannot mix old and new files."""
    gone = []
    for t in tag_dirs(root):
        if read_verification(t) is None:
            shutil.rmtree(t, ignore_errors=True)
            gone.append(t)
    return gone


def rng_file(tag_dir: Path, rank: int) -> Path:
    return tag_dir / f"rng_state_rank{rank}.pt"


def save_rng_state(tag_dir: Path, rank: int) -> None:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    with atomic_path(rng_file(tag_dir, rank)) as tmp:
        torch.save(state, tmp)


def load_rng_state(tag_dir: Path, rank: int) -> bool:
    path = rng_file(tag_dir, rank)
    if not path.is_file():
        return False
    state = torch.load(path, map_location="cpu", weights_only=False)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return True


def master_weight_names(engine: Any) -> dict[str, Any]:
    """ZeRO 0 with bf16/fp16 keeps the fp32 master weights only in the optimizer's state, as groups
    of tensors without names (DeepSpeed's FP16_Optimizer / FP16_UnfusedOptimizer), while the module
    holds the rounded 16-bit weights: the parameter names of each group, in order, so that the
    export can take the masters (training/consolidate.py). Empty for every other setup."""
    groups = getattr(engine.optimizer, "fp16_groups", None)
    if engine.zero_optimization() or not groups:
        return {}
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return {"fp32_master_groups": [[names[id(p)] for p in group] for group in groups]}
