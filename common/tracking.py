"""The one logging wrapper every stage uses: W&B (offline by default) plus a local JSONL copy.

W&B's offline `.wandb` file has no Python reader, so every logged row is also appended to
`metrics.jsonl` in the run directory; the report and the tests read that file. All W&B
directories live under the run directory. Where a run goes (project, entity, group, mode) is a
`WandbTarget` that the caller passes explicitly: the flow gives every run of one flow run the
same project, entity and group. `WANDB_MODE` in the environment wins over the configured mode,
and a `WANDB_API_KEY` turns the default offline mode online; mode `disabled` writes `metrics.jsonl`
alone and never imports wandb.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

METRICS_FILE = "metrics.jsonl"


def first_attempt_group_file(out_dir: Path) -> Path:
    """Where a pretraining output records the W&B group of its first attempt, which every later
    attempt (a resume) logs into (`training.train.first_attempts_target`)."""
    return out_dir / "wandb_files" / "group"


class WandbTarget(BaseModel):
    """Where W&B runs go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = "bertflow"
    entity: str | None = None
    group: str | None = None
    mode: str = "offline"

    def resolved_mode(self) -> str:
        """WANDB_MODE wins; else a WANDB_API_KEY turns the default offline mode online."""
        if os.environ.get("WANDB_MODE"):
            return os.environ["WANDB_MODE"]
        if os.environ.get("WANDB_API_KEY") and self.mode == "offline":
            return "online"
        return self.mode


class Tracker:
    def __init__(
        self,
        run_dir: str | os.PathLike,
        target: WandbTarget,
        *,
        name: str | None = None,
        job_type: str | None = None,
        config: dict[str, Any] | None = None,
        enabled: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._run = None
        if not enabled:
            return
        mode = target.resolved_mode()
        if mode == "disabled":
            return  # metrics.jsonl only; wandb is not imported (a GPU image may lack it)
        wandb_dir = self.run_dir / "wandb_files"
        wandb_dir.mkdir(exist_ok=True)
        for var, sub in (
            ("WANDB_DIR", ""),
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_CONFIG_DIR", "config"),
            ("WANDB_DATA_DIR", "data"),
            ("WANDB_ARTIFACT_DIR", "artifacts"),
        ):
            os.environ[var] = str(wandb_dir / sub) if sub else str(wandb_dir)
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._run = wandb.init(
            project=target.project,
            entity=target.entity,
            name=name,
            group=target.group,
            job_type=job_type,
            config=config or {},
            mode=mode,
            dir=str(wandb_dir),
            reinit="finish_previous",
        )

    @property
    def wandb_run_dir(self) -> Path | None:
        return Path(self._run.dir).parent if self._run is not None else None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if not self.enabled:
            return
        # the wall time (unix seconds) under W&B's own name for it, the same in both
        row = {"step": step, "_timestamp": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        if self._run is not None:
            self._run.log({"_timestamp": row["_timestamp"], **metrics}, step=step)

    def replay(self, rows: list[dict[str, Any]]) -> None:
        """`metrics.jsonl` rows logged before (a resumed run's steps up to its checkpoint) into the
        W&B run only, so the W&B run that ends a pretraining holds its whole curve (a killed run's
        W&B files may hold fewer steps: what W&B had not written when it was killed is lost). Each
        row keeps its own `_timestamp` (W&B honours it; its `_runtime` is this run's own clock)."""
        if self._run is None:
            return
        for row in rows:
            self._run.log({k: v for k, v in row.items() if k != "step"}, step=row.get("step"))

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self._run is None:
            return
        import wandb

        self._run.log({key: wandb.Table(columns=columns, data=rows)})

    def summary(self, values: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.summary.update(values)

    def finish(self, exit_code: int = 0) -> None:
        """End the W&B run: finished, or with `exit_code` != 0 failed."""
        if self._run is not None:
            run_dir = self.wandb_run_dir
            self._run.finish(exit_code=exit_code)
            self._run = None
            _keep_own_core_log(run_dir)


def _keep_own_core_log(run_dir: Path | None) -> None:
    """W&B links a run's logs/debug-core.log to the log of its process's service, kept under the W&B
    cache folder of the first run that process made: another output's folder, which may be moved or
    deleted since. A copy of it (or nothing, if it is gone) keeps the run folder whole by itself: a
    run directory copied with `cp -r` or `shutil.copytree` failed on that dangling link."""
    link = run_dir / "logs" / "debug-core.log" if run_dir is not None else None
    if link is None or not link.is_symlink():
        return
    target = link.resolve()
    link.unlink()
    if target.is_file():
        shutil.copyfile(target, link)


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
