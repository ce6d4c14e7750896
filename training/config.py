"""Settings of the pretrain stage (section `pretrain:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PretrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deepspeed_config: str = Field("infra/deepspeed/zero2.json", description="DeepSpeed JSON template")
    zero_stage: int | None = Field(None, ge=0, description="overrides the template's ZeRO stage")
    num_processes: int = Field(2, ge=1)
    micro_batch_size: int = Field(16, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_steps: int = Field(200, ge=1)
    optimizer: Literal["adamw", "lamb"] = "adamw"
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(20, ge=0)
    gradient_clipping: float = Field(1.0, ge=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    dynamic_masking: bool = False
    checkpoint_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(50, ge=1)
    log_every: int = Field(10, ge=1)
    seed: int = 42
    compile: bool = False
