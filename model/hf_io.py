"""Read and write Hugging Face BERT directories (`config.json` + `model.safetensors` / `.bin`).

Our module names equal transformers', so the state dict moves with only three normalizations:
an optional `bert.` prefix, TF-era `gamma`/`beta` LayerNorm names, and the tied decoder keys.
Our own model directories use this same layout, so "our checkpoint" and "an HF directory" are
read by one function.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.jsonfile import read_json_object
from common.paths import check_checkpoint_dir
from common.stage_output import model_dir_hint
from common.textfile import read_user_text
from common.tokenizer_config import declared_do_lower_case, normalizer_settings
from model.config import BertConfig
from model.heads import BertForPreTraining

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")
DROPPED_KEYS = ("embeddings.position_ids",)
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def read_config(directory: Path) -> BertConfig:
    path = directory / "config.json"
    data = read_json_object(
        path,
        "model config",
        missing=f"{directory} is not a BERT checkpoint: {path} is missing{model_dir_hint(directory)}.",
        missing_fix=f"pass {directory / 'model'}."
        if model_dir_hint(directory)
        else "pass a directory with config.json and model.safetensors (or pytorch_model.bin).",
        invalid_fix="use the config.json that was saved with these weights.",
    )
    if data.get("model_type", "bert") != "bert":
        raise UserError(
            f"{directory} is not a BERT checkpoint: {path} says model_type {data.get('model_type')!r}.",
            fix="pass a BERT model directory (model_type 'bert').",
        )
    try:
        return BertConfig.from_hf_dict(data)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None
    except TypeError as exc:  # e.g. a value of the wrong type
        raise UserError(f"{path}: invalid value in the model config: {exc}") from None


def _require_weights_file(path: Path) -> None:
    if not path.is_file():
        raise UserError(f"weights file {path} is missing.", fix="re-export or re-download the checkpoint.")


def _read_weights_file(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    _require_weights_file(path)
    try:
        if path.name.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # corrupt or truncated file
        raise unreadable(path, exc) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"weights file {path} does not hold a state dict of tensors.")
    return state


def unreadable(path: Path, exc: Exception) -> UserError:
    """A weights file that cannot be read: corrupt or truncated."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(
        f"cannot read weights file {path} (corrupt or truncated: {reason}).",
        fix="re-export or re-download the checkpoint.",
    )


def weight_files(directory: Path) -> list[Path]:
    """The weights file(s) of an HF directory: model.safetensors, pytorch_model.bin, or the shards
    that `model.safetensors.index.json` / `pytorch_model.bin.index.json` name."""
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return [directory / name]
    for name in WEIGHT_FILES:
        index = directory / (name + ".index.json")
        if index.is_file():
            try:
                shards = sorted(
                    set(json.loads(read_user_text(index, "weights index"))["weight_map"].values())
                )
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                raise UserError(f"{index} is not a valid weights index (no 'weight_map').") from None
            return [directory / shard for shard in shards]
    raise UserError(
        f"{directory}: no weights file ({' or '.join(WEIGHT_FILES)}) next to config.json.",
        fix="copy the weights file into the directory, or export the checkpoint again (bertflow export-hf).",
    )


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """The weights of an HF directory (`weight_files`), all in memory."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(directory):
        state.update(_read_weights_file(path))
    return state


def iter_weights(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of an HF directory one tensor at a time, for a pass over a checkpoint that
    need not hold it in memory: safetensors read tensor by tensor, .bin files memory-mapped
    (where their format allows: not files saved by torch before 1.6)."""
    for path in weight_files(directory):
        if path.name.endswith(".safetensors"):
            yield from _safetensors_tensors(path)
        else:
            yield from _read_weights_file(path, mmap=zipfile.is_zipfile(path)).items()


def _safetensors_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    _require_weights_file(path)
    try:
        with safe_open(str(path), framework="pt") as weights:
            for key in weights.keys():
                yield key, weights.get_tensor(key)
    except Exception as exc:  # corrupt or truncated file (not a consumer's error: none is thrown in)
        raise unreadable(path, exc) from None


def weight_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in an HF directory's weights (`weight_files`): safetensors
    headers read without loading a tensor, .bin files memory-mapped where their format allows."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(directory):
        if not path.name.endswith(".safetensors"):
            state = _read_weights_file(path, mmap=zipfile.is_zipfile(path))
            shapes.update({k: tuple(v.shape) for k, v in state.items()})
            continue
        _require_weights_file(path)
        try:
            with safe_open(str(path), framework="pt") as weights:
                shapes.update({k: tuple(weights.get_slice(k).get_shape()) for k in weights.keys()})
        except Exception as exc:  # corrupt or truncated file
            raise unreadable(path, exc) from None
    return shapes


def saved_parameter_count(directory: Path) -> int | None:
    """Elements in `directory/model.safetensors`, from its header (no tensor is read); None without
    that file. `write_hf_dir` stores each parameter once (not the tied decoder) and no buffers, so
    for our model directories this is the parameter count, without building the model."""
    from safetensors import safe_open

    path = Path(directory) / WEIGHT_FILES[0]
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as weights:
        return sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())


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
                f"{source}: weight {key!r} has shape {tuple(value.shape)} but {source / 'config.json'} "
                f"implies {tuple(expected[key].shape)}; config and weights disagree.",
                fix="use the config.json that was saved with these weights.",
            )


@dataclass
class LoadedCheckpoint:
    model: BertForPreTraining
    fresh: list[str]  # parameters not in the file: freshly initialized (pooler / pretraining heads)
    ignored: list[str]  # keys in the file that BertForPreTraining has no place for (e.g. a classifier)


def load_checkpoint(directory: str | os.PathLike) -> LoadedCheckpoint:
    """Build our BertForPreTraining from an HF/our directory and say what was and was not in it."""
    directory = Path(directory)
    check_checkpoint_dir(directory)
    config = read_config(directory)
    state, ignored = normalize_keys(read_state_dict(directory))
    if not any(k.startswith("bert.encoder.") for k in state):
        raise UserError(
            f"{directory} is not a BERT checkpoint: its weights hold no 'encoder.layer.*' keys.",
            fix="pass a BERT model directory.",
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # heads absent from the file get the same fresh values on every run
        model = BertForPreTraining(config)
    check_shapes(model, state, directory)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in TIED_KEYS]
    encoder_missing = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if encoder_missing or unexpected:
        raise UserError(
            f"{directory}: the weights do not fit {directory / 'config.json'} "
            f"(num_hidden_layers={config.num_hidden_layers}): missing {encoder_missing[:3]}, "
            f"unexpected {unexpected[:3]}.",
            fix="use the config.json that was saved with these weights.",
        )
    model.tie_weights()
    return LoadedCheckpoint(model, missing, ignored)


def load_pretraining_model(directory: str | os.PathLike) -> tuple[BertForPreTraining, list[str]]:
    """Build our BertForPreTraining from an HF/our directory. Heads absent from the checkpoint keep
    their fresh initialization; returns (model, names of parameters that were not in the file)."""
    loaded = load_checkpoint(directory)
    return loaded.model, loaded.fresh


def write_hf_dir(
    model: torch.nn.Module,
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None = None,
    encoder_only: bool = False,
    model_max_length: int | None = None,
    hf_config: dict[str, Any] | None = None,
) -> Path:
    """Write `config.json`, `model.safetensors` and tokenizer files that transformers loads
    (BertForPreTraining, AutoModel, AutoTokenizer) with no missing keys. With the heads, BertModel
    (AutoModel) reports the `cls.*` head weights as unexpected, as it does for bert-base-uncased;
    `encoder_only=True` writes only `bert.*` (architectures BertModel) for a clean AutoModel load.
    `model_max_length`: the sequence length the model was trained at (tokenizer_config.json).
    `hf_config`: config.json entries to add or replace, for a fine-tuned task model
    (`model.heads`, whose module names are transformers'): its `architectures`, labels and so on."""
    from safetensors.torch import save_file

    from common.atomic import atomic_path, atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu").contiguous().clone()
        for k, v in model.state_dict().items()
        if k not in TIED_KEYS and not (encoder_only and not k.startswith("bert."))
    }
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    config = model.config.to_hf_dict()
    config["architectures"] = ["BertModel" if encoder_only else "BertForPreTraining"]
    config.update(hf_config or {})
    atomic_write_json(out / "config.json", config)
    if tokenizer_dir is not None:
        copy_tokenizer_files(Path(tokenizer_dir), out, model.config.vocab_size, model_max_length)
    return out


def has_tokenizer(directory: Path) -> bool:
    return any((Path(directory) / n).is_file() for n in TOKENIZER_FILES)


def copy_tokenizer_files(
    src: Path, out: Path, vocab_size: int | None = None, model_max_length: int | None = None
) -> None:
    """Put vocab.txt, tokenizer.json and tokenizer_config.json next to the model. Whichever of
    vocab.txt / tokenizer.json the source lacks is derived from the other, so both the slow and
    the fast `AutoTokenizer` paths load the directory. `model_max_length` (the length the model
    was trained at) defaults to the source's, else 512."""
    from common.atomic import atomic_write_json, atomic_write_text

    found = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not found:
        raise UserError(
            f"{src} has no vocab.txt or tokenizer.json to put next to the model.",
            fix="pass --tokenizer DIR with the tokenizer the model was trained with.",
        )
    source_meta = _source_tokenizer_config(src)
    # a tokenizer.json's normalizer is how the pipeline tokenized: the config must say the same
    norm = (
        normalizer_settings(read_user_text(src / "tokenizer.json", "tokenizer"))
        if "tokenizer.json" in found
        else {}
    )
    lowercase = (
        norm["do_lower_case"]
        if "do_lower_case" in norm
        else declared_do_lower_case(source_meta, src / "tokenizer_config.json", True)
    )
    if model_max_length is None:
        model_max_length = source_meta.get("model_max_length")
        if not isinstance(model_max_length, int) or model_max_length > 10**6:  # HF's "no limit" value
            model_max_length = 512
    for name in found:
        shutil.copyfile(src / name, out / name)
    if "vocab.txt" not in found:
        atomic_write_text(out / "vocab.txt", "".join(t + "\n" for t in _vocab_from_tokenizer_json(src)))
    vocab = read_user_text(out / "vocab.txt", "vocabulary").splitlines()
    if vocab_size is not None and (problem := tokenizer_fit_problem(len(vocab), vocab_size)):
        raise UserError(
            f"{src}: {problem}.", fix="pass the tokenizer the model was trained with (--tokenizer DIR)."
        )
    if "tokenizer.json" not in found:
        from tokenizers.implementations import BertWordPieceTokenizer

        tok = BertWordPieceTokenizer(str(out / "vocab.txt"), lowercase=lowercase)
        tok.save(str(out / "tokenizer.json"))
    atomic_write_json(out / "tokenizer_config.json", _tokenizer_config(lowercase, norm, model_max_length))


def _source_tokenizer_config(src: Path) -> dict[str, Any]:
    """The source's tokenizer_config.json ({} when it has none)."""
    meta = src / "tokenizer_config.json"
    return read_json_object(meta, "tokenizer config") if meta.is_file() else {}


def _tokenizer_config(lowercase: bool, norm: dict[str, Any], model_max_length: int) -> dict[str, Any]:
    """The tokenizer_config.json of an exported BERT: its normalizer settings (`norm`), its length."""
    return {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        **{k: v for k, v in norm.items() if k != "do_lower_case"},
        "model_max_length": model_max_length,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }


def set_model_max_length(model_dir: Path, length: int) -> None:
    """Record in tokenizer_config.json the sequence length the model was trained at, so
    tokenizers (and pipelines) truncate there instead of at the position-embedding count."""
    from common.atomic import atomic_write_json

    path = Path(model_dir) / "tokenizer_config.json"
    meta = read_json_object(path, "tokenizer config")
    atomic_write_json(path, {**meta, "model_max_length": int(length)})


MIN_TOKENIZER_SHARE = 0.5  # of the model's embedding rows a tokenizer must use


def tokenizer_fit_problem(tokens: int, rows: int) -> str | None:
    """Why a tokenizer of `tokens` tokens is not that of a model with `rows` embeddings: more tokens
    (ids past the table would crash), or fewer than half of them (a truncated or foreign vocabulary:
    most rows unused, and most words of real text [UNK]); None when it fits."""
    if tokens > rows:
        return f"the tokenizer has {tokens:,} tokens but the model's vocab_size is {rows:,}: token ids past the embedding table would crash"
    if tokens < MIN_TOKENIZER_SHARE * rows:
        return (
            f"the tokenizer has {tokens:,} tokens for the model's {rows:,} embeddings: a truncated or "
            "another model's vocabulary, under which most words would be [UNK]"
        )
    return None


def tokenizer_size(src: Path) -> int:
    """The tokens of a tokenizer directory's vocabulary (its vocab.txt, else its tokenizer.json)."""
    if (src / "vocab.txt").is_file():
        return len(read_user_text(src / "vocab.txt", "vocabulary").splitlines())
    return len(_vocab_from_tokenizer_json(src))


def _vocab_from_tokenizer_json(src: Path) -> list[str]:
    from tokenizers import Tokenizer

    path = src / "tokenizer.json"
    try:
        tok = Tokenizer.from_str(read_user_text(path, "tokenizer file"))
    except Exception as exc:
        raise UserError(f"cannot read tokenizer file {path}: {exc}") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise UserError(f"{path}: token ids are not contiguous from 0; cannot write vocab.txt.")
    return [t for t, _ in by_id]
