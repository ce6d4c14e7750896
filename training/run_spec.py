"""The run spec: everything one pretraining run needs, typed.

`training/preflight.py` builds it after every check has passed and `pipelines/stage_pretrain.py`
writes it to `OUT/run_spec.json`; every rank of `training/train.py` reads it back. Nothing in it
is looked up again by name: a rank trusts the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from common.atomic import atomic_write_json
from common.fingerprint import digest
from common.jsonfile import read_json_object
from common.tracking import WandbTarget
from model.config import BertConfig
from training.config import PretrainConfig

# Settings that change how a run is watched, not what it computes (kept out of the fingerprint).
NOT_IN_FINGERPRINT = ("log_every", "master_port", "master_addr", "data_cache_dir")


class MaskingSettings(BaseModel):
    """How the shards were masked; dynamic masking repeats it (`preprocessing/masking.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    out_dir: Path
    shards_dir: Path
    tokenizer_dir: Path
    on_gpu: bool
    world_size: int
    run_name: str  # the W&B run's name
    pretrain: PretrainConfig
    model: dict[str, Any]  # the model's config.json (Hugging Face keys)
    ds_config: dict[str, Any]  # the resolved DeepSpeed JSON
    masking: MaskingSettings
    wandb: WandbTarget
    pipeline_config: dict[str, Any]  # the whole pipeline config, for the W&B run's config
    shards_manifest_sha256: str

    @property
    def bert_config(self) -> BertConfig:
        return BertConfig.from_hf_dict(self.model)

    @property
    def checkpoints_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def zero_stage(self) -> int:
        return int(self.ds_config["zero_optimization"]["stage"])

    def fingerprint(self) -> str:
        """What makes two runs "the same" (a finished output is reused only for the same one):
        everything but where it runs and how it is logged."""
        same = self.model_dump(
            mode="json", include={"model", "ds_config", "masking", "shards_manifest_sha256"}
        )
        same["pretrain"] = self.pretrain.model_dump(mode="json", exclude=set(NOT_IN_FINGERPRINT))
        return digest(same)

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.model_dump(mode="json"))

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        return cls.model_validate(read_json_object(path, "run spec"))
