"""BERT hyperparameters and the published size presets (Turc et al. 2019; Devlin et al. 2019)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from common.errors import UserError

# name -> (layers L, hidden H, heads A); intermediate size is 4H.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def preset_of(config: dict[str, Any]) -> str | None:
    """The preset a Hugging Face config.json has the shape of ('tiny' for L2/H128/A2), else None."""
    shape = (config.get("num_hidden_layers"), config.get("hidden_size"), config.get("num_attention_heads"))
    return next((name for name, dims in PRESETS.items() if dims == shape), None)


# Hugging Face BERT options that change what the network computes, with the one value this
# implementation computes (a bidirectional encoder, absolute positions, a tied MLM decoder). A
# config.json with another value is refused: dropping the key would silently give another model.
SUPPORTED_OPTIONS: dict[str, tuple[Any, str]] = {
    "is_decoder": (False, "a causal (decoder) attention mask"),
    "add_cross_attention": (False, "cross-attention layers"),
    "is_encoder_decoder": (False, "an encoder-decoder model"),
    "position_embedding_type": ("absolute", "relative position embeddings"),
    "tie_word_embeddings": (True, "an MLM decoder with weights of its own"),
    "pruned_heads": ({}, "pruned attention heads"),
}


def check_supported(d: dict[str, Any]) -> None:
    """Refuse architecture options this BERT does not implement (see SUPPORTED_OPTIONS)."""
    for key, (supported, meaning) in SUPPORTED_OPTIONS.items():
        if key in d and d[key] != supported and not (supported == {} and not d[key]):
            raise UserError(
                f"model config: {key} {d[key]!r} ({meaning}) is not supported; bertflow's BERT is a "
                f"bidirectional encoder with absolute positions and a tied MLM decoder ({key} {supported!r}).",
                fix="use an encoder checkpoint without that option.",
            )
    if d.get("embedding_size") not in (None, d.get("hidden_size")):
        raise UserError(
            f"model config: embedding_size {d['embedding_size']} differs from hidden_size "
            f"{d.get('hidden_size')} (a factorized embedding, as in ALBERT) and is not supported.",
            fix="use a BERT checkpoint whose embeddings have hidden_size.",
        )


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise UserError(f"model config: {name} must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"model config: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}."
            )
        if self.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise UserError(f"model config: hidden_act {self.hidden_act!r} is not supported.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        if name not in PRESETS:
            raise UserError(f"unknown model preset {name!r}.", fix=f"use one of: {', '.join(PRESETS)}.")
        layers, hidden, heads = PRESETS[name]
        values: dict[str, Any] = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls(**values)

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` that transformers' BertConfig reads."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d.update(self.extra)
        d["model_type"] = "bert"
        d["architectures"] = d.get("architectures") or ["BertForPreTraining"]
        d["position_embedding_type"] = "absolute"
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> BertConfig:
        check_supported(d)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        keep = ("architectures", "num_labels", "id2label", "label2id", "problem_type")
        extra = {k: d[k] for k in keep if k in d}
        return cls(**known, extra=extra)
