"""Settings of the finetune stage (section `finetune:`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator
from pydantic_core import PydanticCustomError

from common.settings import Section, Seed

LearningRate = Annotated[float, Field(gt=0, le=1)]

# The code that determines a unit's result and the scorecard (recorded in their markers; see
# pipelines/stage_keys.py, STAGE_CODE).
UNIT_CODE: tuple[str, ...] = ("finetuning/*.py", "model/*.py")


class FinetuneConfig(Section):
    # scheduling, not a unit's result (a unit's torch threads are `threads`, whatever the concurrency);
    # save_models only adds files to a unit (a finished unit without the model it should keep trains
    # again: finetuning/keep.py)
    run_only: ClassVar[tuple[str, ...]] = ("concurrency", "units_per_gpu", "save_models")
    # threads was run-only until 2026-11-27, but torch's float sums on CPU depend on it: in the keys
    # once set, so the units made before (one thread each on CPU by default) are found again
    added_later: ClassVar[tuple[str, ...]] = ("threads",)

    tasks: list[str] = Field(
        default_factory=lambda: ["sst2", "mrpc", "rte", "cola", "stsb"],
        description="finetuning/tasks.yaml names (GLUE, conll2003, squad) or task_config's",
    )
    task_config: str | None = Field(None, description="YAML with extra task definitions")
    # where `tasks` came from, for a message about an unknown task name (not a setting): set by
    # pipelines.config.load_config and by `bertflow finetune --tasks`
    _tasks_from: str = PrivateAttr("finetune.tasks")

    @property
    def tasks_from(self) -> str:
        return self._tasks_from

    @tasks_from.setter
    def tasks_from(self, where: str) -> None:
        self._tasks_from = where

    baselines: list[str] = Field(
        default_factory=lambda: ["random"], description="other checkpoints to score: 'random' or an HF dir"
    )
    max_train_examples: int | None = Field(
        2000, ge=1, description="the first N training examples of each task (null: all)"
    )
    max_eval_examples: int | None = Field(None, ge=1, description="the first N dev examples (null: all)")
    epochs: float = Field(3.0, gt=0, le=1000, description="passes over the training examples")
    lrs: list[LearningRate] = Field(
        default_factory=lambda: [5e-5],
        min_length=1,
        description="one unit per lr; the scorecard keeps each task's best",
    )
    seeds: list[Seed] = Field(
        default_factory=lambda: [42],
        min_length=1,
        description="one unit per seed; the scorecard gives mean and spread",
    )
    batch_size: int = Field(32, ge=1, description="training examples per step")
    max_seq_length: int = Field(
        128, gt=8, description="longer inputs are truncated (SQuAD: split into windows)"
    )
    warmup_proportion: float = Field(0.1, ge=0, le=1, description="share of the steps with linear lr warmup")
    weight_decay: float = Field(0.01, ge=0, le=1, description="decoupled; not on biases and LayerNorm")
    concurrency: int = Field(2, ge=1, description="fine-tuning units at a time on a machine without GPUs")
    units_per_gpu: int = Field(
        1,
        ge=1,
        description="on a GPU machine, units that share one GPU at a time (each its own process); "
        "this, times the GPUs, is the concurrency there",
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="hidden and attention dropout while fine-tuning")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads per unit on CPU (null: 1, so a unit's numbers depend on neither the "
        "machine nor the concurrency; more are faster for a few large units but change the float sums, "
        "so a set value other than 1 is in the unit key); on a GPU machine null shares the cores among the "
        "workers",
    )
    group_by_length: bool = Field(True, description="batch examples of similar length together")
    save_models: Literal["none", "best", "all"] = Field(
        "none",
        description="keep fine-tuned models as Hugging Face directories (UNIT_DIR/model/, with the dev "
        "predictions in UNIT_DIR/predictions.jsonl): all = every unit's, best = the units of each "
        "checkpoint's and task's best lr (one per seed; the others' are removed once all are done); a "
        "finished unit without its model trains again",
    )

    def settings_without(self, left_out: Iterable[str]) -> dict[str, Any]:
        """As `Section.settings_without`, and `threads: 1` left out as null is: on CPU null runs one
        thread, the same float sums; on a GPU the threads only feed it. So `--threads 1` written out
        finds the units of the default, where it trained them all again."""
        return super().settings_without([*left_out, *(["threads"] if self.threads == 1 else [])])

    @field_validator("tasks", "baselines", "lrs", "seeds")
    @classmethod
    def _each_once(cls, values: list) -> list:
        """A repeat ran no unit more: the scorecard counted the same unit twice, as two seeds of spread
        0 (which narrows every seed-noise margin), or showed a task or baseline twice."""
        repeated = [v for i, v in enumerate(values) if v in values[:i]]
        if repeated:
            raise PydanticCustomError(
                "listed_twice",
                "{value} is listed twice: list each once (a repeat runs no unit more, but the scorecard "
                "counted its units twice, a repeated seed as a second run with a spread of 0)",
                {"value": repr(repeated[0])},
            )
        return values
