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

# Pretrain settings that never change the weights a run computes: kept out of the fingerprint, so
# they may change when a run is resumed (and a finished run with other values of them is the same
# run). The run-only ones (`PretrainConfig.run_only`, also out of the stage key); the evaluation size
# (it changes the held-out figures, so it stays in the key: a finished output is not reused for
# other ones); the DeepSpeed template's path and the ZeRO stage override, because the resolved
# `ds_config` (in the fingerprint) holds what they decide; the process layout, because the world
# size and the global batch are in it too (and a resume on another world size is refused by
# preflight with its own message); `global_batch_size`, which only chooses the micro batch and
# accumulation steps that are in it (so a run made before the setting existed is the same run).
NOT_IN_FINGERPRINT = (
    *PretrainConfig.run_only,
    "eval_batches",
    "hostfile",
    "nnodes",
    "num_processes",
    "global_batch_size",
    "deepspeed_config",
    "zero_stage",
)


# keys of the resolved DeepSpeed JSON that settings out of the fingerprint decide, with them named
# as a user gives them (`--zero-stage` or pretrain.zero_stage, `--num-processes`), so that a run
# refused for another stage or global batch says which setting (and `bertflow pretrain` which flag)
# changed it
DS_KEY_SETTINGS = {
    "ds_config.zero_optimization.stage": " (pretrain.zero_stage, else the stage of the "
    "pretrain.deepspeed_config JSON)",
    # the micro batch and accumulation steps are named by their own pretrain.* keys when they differ
    "ds_config.train_batch_size": " (the global batch: the ranks, pretrain.num_processes x "
    "pretrain.nnodes, x micro batch x accumulation steps)",
}


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
    # pretrain.init_from's training length where this run's shards are longer: the positions past it
    # start as copies of the trained ones (`BertEmbeddings.copy_trained_positions`). A function of
    # init_from and the shards, both already in the settings.
    init_trained_length: int | None = None

    @property
    def bert_config(self) -> BertConfig:
        return BertConfig.from_hf_dict(self.model)

    @property
    def checkpoints_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def zero_stage(self) -> int:
        return int(self.ds_config["zero_optimization"]["stage"])

    def settings(self) -> dict[str, Any]:
        """What makes two runs "the same": everything that decides the weights (not where the run
        runs, how it is logged or how often it is checkpointed). A finished output is reused only
        for the same settings, and a checkpoint is resumed only with them."""
        same = self.model_dump(
            mode="json", include={"model", "ds_config", "masking", "shards_manifest_sha256"}
        )
        same["pretrain"] = self.pretrain.settings_without(NOT_IN_FINGERPRINT)
        return same

    def fingerprint(self) -> str:
        return digest(self.settings())

    def differences(self, recorded: dict[str, Any]) -> list[str]:
        """`key: recorded -> now` for every setting that differs from `recorded` (a `settings()`);
        a key of the resolved DeepSpeed JSON names the settings that decide it (`DS_KEY_SETTINGS`)."""
        old, new = _flatten(recorded), _flatten(self.settings())
        return [
            f"{key}{DS_KEY_SETTINGS.get(key, '')}: {old.get(key, '(unset)')!r} -> {new.get(key, '(unset)')!r}"
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
        ]

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.model_dump(mode="json"))

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        # what a run was made with, read back: settings checked since (a warmup past max_steps) pass
        return cls.model_validate(read_json_object(path, "run spec"), context={"recorded": True})


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"pretrain": {"lr": 1e-4}} -> {"pretrain.lr": 1e-4}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
