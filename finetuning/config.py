"""Settings of the finetune stage (section `finetune:`)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from common.settings import Section, Seed

LearningRate = Annotated[float, Field(gt=0, le=1)]

# The code that determines a unit's result and the scorecard (recorded in their markers; see
# pipelines/stage_keys.py, STAGE_CODE).
UNIT_CODE: tuple[str, ...] = ("finetuning/*.py", "model/*.py")


class FinetuneConfig(Section):
    # scheduling, not a unit's result
    run_only: ClassVar[tuple[str, ...]] = ("concurrency", "units_per_gpu", "threads")

    tasks: list[str] = Field(default_factory=lambda: ["sst2", "mrpc", "rte", "cola", "stsb"])
    task_config: str | None = Field(None, description="YAML with extra task definitions")
    baselines: list[str] = Field(
        default_factory=lambda: ["random"], description="other checkpoints to score: 'random' or an HF dir"
    )
    max_train_examples: int | None = Field(2000, ge=1)
    max_eval_examples: int | None = Field(None, ge=1)
    epochs: float = Field(3.0, gt=0, le=1000)
    lrs: list[LearningRate] = Field(default_factory=lambda: [5e-5], min_length=1)
    seeds: list[Seed] = Field(default_factory=lambda: [42], min_length=1)
    batch_size: int = Field(32, ge=1)
    max_seq_length: int = Field(128, gt=8)
    warmup_proportion: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0, le=1)
    concurrency: int = Field(2, ge=1, description="fine-tuning units at a time on a machine without GPUs")
    units_per_gpu: int = Field(
        1,
        ge=1,
        description="on a GPU machine, units that share one GPU at a time (each its own process); "
        "this, times the GPUs, is the concurrency there",
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="hidden and attention dropout while fine-tuning")
    threads: int | None = Field(
        None, ge=1, description="torch threads per worker (default: CPU cores // workers)"
    )
    group_by_length: bool = Field(True, description="batch examples of similar length together")
