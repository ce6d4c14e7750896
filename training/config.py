"""Settings of the pretrain stage (section `pretrain:`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from common.settings import Section, Seed


class PretrainConfig(Section):
    # how a run is watched, checkpointed, connected, fed and stopped, never the weights it computes:
    # a resume that changes them all (but master_addr and stop_grace_s) reproduces every loss of an
    # uninterrupted run bit for bit (tests/test_pretrain.py)
    run_only: ClassVar[tuple[str, ...]] = (
        "log_every",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "prefetch_batches",
        "peak_tflops",
        "dist_timeout_s",
        "master_port",
        "master_addr",
        "data_cache_dir",
        "launcher",
        "stop_grace_s",
    )
    # the run-only settings whose values show in a finished output (its logged curve, the checkpoints
    # it kept, its MFU figures): reusing it with other values says that they are not applied
    shown_in_output: ClassVar[tuple[str, ...]] = (
        "log_every",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "peak_tflops",
    )
    added_later: ClassVar[tuple[str, ...]] = ("muon_lr", "global_batch_size")

    deepspeed_config: str = Field("infra/deepspeed/zero2.json", description="DeepSpeed JSON template")
    zero_stage: int | None = Field(None, ge=0, description="overrides the template's ZeRO stage")
    num_processes: int | Literal["auto"] = Field(
        "auto", description="ranks on this node; auto: one per visible GPU, or 2 on a machine without one"
    )
    micro_batch_size: int = Field(
        16, ge=1, description="examples per rank and forward pass (at most, with global_batch_size)"
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="micro batches per optimizer step (follows from global_batch_size when set)"
    )
    global_batch_size: int | None = Field(
        None,
        ge=1,
        description="examples per optimizer step whatever the ranks: the accumulation steps and the micro "
        "batch (at most micro_batch_size) follow from the world size (training/ranks.py resolve_ranks)",
    )
    max_steps: int = Field(
        200, ge=1, description="optimizer steps of the run (lr decays linearly to 0 at the last)"
    )
    optimizer: Literal["adamw", "lamb", "muon"] = Field(
        "adamw",
        description="lamb: DeepSpeed's FusedLamb on GPU and the same update on CPU (training/optim.py Lamb); "
        "muon: Muon on the encoder's weight matrices at muon_lr, AdamW at lr on the rest; needs ZeRO "
        "stage 0 (docs/quality.md, 'Muon')",
    )
    lr: float = Field(
        1e-4, gt=0, le=1, description="AdamW/LAMB lr (with muon: of embeddings, heads, biases, norms)"
    )
    muon_lr: float = Field(
        0.01,
        gt=0,
        le=1,
        description="optimizer muon: lr of the encoder's weight matrices (momentum 0.95, no weight decay); "
        "follows the same warmup and decay as lr",
    )
    weight_decay: float = Field(0.01, ge=0, le=1, description="decoupled; not on biases and LayerNorm")
    dropout: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="hidden and attention dropout while pretraining (None: the model section's); the "
        "exported config.json keeps the model section's values; fine-tuning sets its own (finetune.dropout)",
    )
    mlm_bias_init: Literal["unigram", "zero"] = Field(
        "unigram",
        description="initial MLM output bias of a new model: log frequency of each token among the training "
        "split's masked tokens (the best context-free prediction), or zero as in BERT's code; see docs/quality.md",
    )
    warmup_steps: int = Field(20, ge=0, description="linear lr warmup from 0")
    gradient_clipping: float = Field(1.0, ge=0, description="max global gradient norm (0: off)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 on a GPU that has it, else fp32; fp16 (dynamic loss scale) GPU only"
    )
    dynamic_masking: bool = Field(
        False, description="draw new masks each pass over the shards, with their own masking rules"
    )
    checkpoint_every: int = Field(
        50, ge=1, description="steps between checkpoints (and at the end, and on SIGTERM)"
    )
    keep_checkpoints: int = Field(2, ge=1, description="newest verified checkpoints kept")
    eval_every: int = Field(50, ge=1, description="steps between held-out evaluations (and at the end)")
    log_every: int = Field(10, ge=1, description="steps between metric lines")
    seed: Seed = 42
    compile: bool = Field(False, description="torch.compile the model (GPU fast path; off on CPU)")
    init_from: str | None = Field(
        None, description="start from this model dir (with phases: the first phase does), fresh optimizer"
    )
    eval_batches: int = Field(
        20,
        ge=1,
        description="held-out examples per evaluation, in global batches (micro batch x accumulation x ranks; "
        "at most the validation split)",
    )
    launcher: Literal["auto", "deepspeed", "torchrun"] = Field(
        "auto", description="auto: DeepSpeed's launcher with a hostfile, torchrun (lighter start) on one node"
    )
    hostfile: str | None = Field(
        None, description="multi-node: DeepSpeed hostfile (see infra/hostfile.example)"
    )
    master_port: int | None = Field(None, gt=0, lt=65536, description="default: a free port (one node)")
    nnodes: int = Field(
        1,
        ge=1,
        description="nodes, each started with `bertflow pretrain --node-rank R` (torchrun, static rendezvous)",
    )
    master_addr: str | None = Field(None, description="multi-node: address of node 0, where every node meets")
    data_cache_dir: str | None = Field(
        None,
        description="node-local folder for the memory-mapped data cache ($VARS expanded on each node); "
        "default OUTPUT/data_cache",
    )
    dist_timeout_s: int = Field(
        600,
        ge=10,
        le=7 * 86400,
        description="collective timeout: a hung rank fails all ranks; nodes also wait this long for each other",
    )
    stop_grace_s: int = Field(
        90,
        ge=1,
        le=3600,
        description="after SIGTERM or Ctrl-C: the seconds the ranks get to finish their step and save it "
        "before they are killed (a second Ctrl-C kills them at once); keep it under the scheduler's notice "
        "(infra/: Slurm --signal=TERM@120, Kubernetes terminationGracePeriodSeconds 120)",
    )
    peak_tflops: float | None = Field(
        None, gt=0, le=1e6, description="MFU denominator override (dense TFLOP/s)"
    )
    prefetch_batches: int = Field(4, ge=1, description="batches the loader thread collates ahead")

    @property
    def derived_layout(self) -> bool:
        """The ranks or the batch split follow from the machine (`num_processes: auto`) or from
        `global_batch_size` instead of being spelled out (`training/ranks.py`)."""
        return self.num_processes == "auto" or self.global_batch_size is not None

    @field_validator("num_processes", mode="before")
    @classmethod
    def _ranks_or_auto(cls, value: Any) -> Any:
        """One message for both forms (the union's own error lists each member's)."""
        if value == "auto":
            return value
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError("must be a number of ranks (1 or more) or auto")

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_within_the_run(cls, warmup: int, info: ValidationInfo) -> int:
        """A warmup longer than the run (`--set pretrain.max_steps=20` on a config warming up for 30)
        trained every step below the lr asked for, unsaid. Not the default warmup (quick runs of a
        few steps that leave it alone keep running; a phase's section holds it from the main one's
        dump), nor a run_spec.json read back: it ran so."""
        steps = info.data.get("max_steps")  # absent when max_steps itself is invalid
        recorded = bool(info.context and info.context.get("recorded"))
        default = warmup == cls.model_fields["warmup_steps"].default
        if steps is not None and warmup > steps and not (recorded or default):
            raise PydanticCustomError(
                "warmup_past_the_end",
                "{warmup} exceeds max_steps {steps}: the lr would rise for the whole run and end at "
                "{share} of lr, never reaching it. Fix: set warmup_steps below max_steps (the shipped "
                "configs warm up for 1-10% of the steps), or raise max_steps",
                # `with`: the other setting of the rule, so that a --set of either is named (load_config)
                {"warmup": warmup, "steps": steps, "share": f"{steps / warmup:.1%}", "with": ["max_steps"]},
            )
        return warmup
