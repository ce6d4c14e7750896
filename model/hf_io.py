"""Read and write Hugging Face BERT directories (`config.json` + `model.safetensors` / `.bin`).

Our module names equal transformers', so the state dict moves with only three normalizations:
an optional `bert.` prefix, TF-era `gamma`/`beta` LayerNorm names, and the tied decoder keys.
Our own model directories use this same layout, so "our checkpoint" and "an HF directory" are
read by one function.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from common.errors import UserError
from model.config import BertConfig
from model.heads import BertForPreTraining

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")
DROPPED_KEYS = ("embeddings.position_ids",)
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def read_config(directory: Path) -> BertConfig:
    path = directory / "config.json"
    if not path.is_file():
        raise UserError(
            f"{directory} is not a BERT checkpoint: {path} is missing.",
            fix="pass a directory with config.json and model.safetensors (or pytorch_model.bin).",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None
    if data.get("model_type", "bert") != "bert":
        raise UserError(f"{path}: model_type is {data.get('model_type')!r}, expected 'bert'.")
    return BertConfig.from_hf_dict(data)


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            try:
                if name.endswith(".safetensors"):
                    from safetensors.torch import load_file

                    return load_file(str(path))
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # corrupt or truncated file
                raise UserError(
                    f"cannot read weights file {path}: {exc}", fix="re-export or re-download the checkpoint."
                ) from None
    raise UserError(
        f"{directory}: no weights file ({' or '.join(WEIGHT_FILES)}).",
        fix="export the checkpoint again (bertflow export-hf).",
    )


def normalize_keys(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Map any HF BERT state dict onto BertForPreTraining names; returns (state, ignored keys)."""
    out: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for key, value in state.items():
        k = key
        if k.endswith(".gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[: -len("beta")] + "bias"
        if k.startswith("bert."):
            k = k[len("bert.") :]
        if k.startswith(("embeddings.", "encoder.", "pooler.")):
            if k in DROPPED_KEYS:
                continue
            out["bert." + k] = value
        elif k.startswith(("cls.predictions.", "cls.seq_relationship.")):
            if k == "cls.predictions.decoder.bias":
                out.setdefault("cls.predictions.bias", value)
            elif k != "cls.predictions.decoder.weight":
                out[k] = value
        else:
            ignored.append(key)
    return out, ignored


def check_shapes(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = model.state_dict()
    for key, value in state.items():
        if key in expected and tuple(expected[key].shape) != tuple(value.shape):
            raise UserError(
                f"{source}: weight {key!r} has shape {tuple(value.shape)} but config.json implies "
                f"{tuple(expected[key].shape)}; config and weights disagree.",
                fix="use the config.json that was saved with these weights.",
            )


def load_pretraining_model(directory: str | os.PathLike) -> tuple[BertForPreTraining, list[str]]:
    """Build our BertForPreTraining from an HF/our directory. Heads absent from the checkpoint keep
    their fresh initialization; returns (model, names of parameters that were not in the file)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint directory {directory} does not exist.")
    config = read_config(directory)
    state, _ = normalize_keys(read_state_dict(directory))
    if not any(k.startswith("bert.encoder.") for k in state):
        raise UserError(f"{directory}: the weights hold no BERT encoder (no 'encoder.layer.*' keys).")
    model = BertForPreTraining(config)
    check_shapes(model, state, directory)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in TIED_KEYS]
    encoder_missing = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if encoder_missing or unexpected:
        raise UserError(
            f"{directory}: weights do not fit the config: missing {encoder_missing[:5]}, unexpected {unexpected[:5]}."
        )
    model.tie_weights()
    return model, missing


def write_hf_dir(
    model: BertForPreTraining, out_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None
) -> Path:
    """Write `config.json`, `model.safetensors` and tokenizer files that transformers loads
    (BertForPreTraining, AutoModel, AutoTokenizer) with no missing or unexpected keys."""
    from safetensors.torch import save_file

    from common.atomic import atomic_path, atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu").contiguous().clone()
        for k, v in model.state_dict().items()
        if k not in TIED_KEYS
    }
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic_write_json(out / "config.json", model.config.to_hf_dict())
    if tokenizer_dir is not None:
        copy_tokenizer_files(Path(tokenizer_dir), out)
    return out


def copy_tokenizer_files(src: Path, out: Path) -> None:
    from common.atomic import atomic_write_json

    found = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not found:
        raise UserError(f"{src} has no vocab.txt or tokenizer.json to copy next to the model.")
    for name in found:
        shutil.copyfile(src / name, out / name)
    lowercase = True
    meta = src / "tokenizer_config.json"
    if meta.is_file():
        lowercase = bool(json.loads(meta.read_text()).get("do_lower_case", True))
    atomic_write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": lowercase,
            "model_max_length": 512,
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
    )
