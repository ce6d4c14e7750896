"""Settings of the finetune stage (section `finetune:`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FinetuneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(default_factory=lambda: ["sst2", "mrpc", "rte", "cola", "stsb"])
    task_config: str | None = Field(None, description="YAML with extra task definitions")
    baselines: list[str] = Field(
        default_factory=lambda: ["random"], description="other checkpoints to score: 'random' or an HF dir"
    )
    max_train_examples: int | None = Field(2000, ge=1)
    max_eval_examples: int | None = Field(None, ge=1)
    epochs: float = Field(3.0, gt=0)
    lrs: list[float] = Field(default_factory=lambda: [5e-5])
    seeds: list[int] = Field(default_factory=lambda: [42])
    batch_size: int = Field(32, ge=1)
    max_seq_length: int = Field(128, gt=8)
    warmup_proportion: float = Field(0.1, ge=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    concurrency: int = Field(2, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1, description="hidden and attention dropout while fine-tuning")
    group_by_length: bool = Field(True, description="batch examples of similar length together")
