"""CoNLL-2003 NER: a classifier on the token vectors T_i, labelled on each word's first sub-token.

Scored with entity-level F1 over words (exact span and type, IOB2), so the sub-word split never
changes the score; words cut off by `max_seq_length` count as predicted `O`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from common.errors import UserError
from common.textfile import read_user_text
from finetuning.batching import IGNORE_INDEX
from finetuning.metrics import entity_f1
from finetuning.tasks import TaskSpec, check_file, dev_is_train_note, redefined_builtin_note
from model.config import BertConfig
from model.heads import BertForTokenClassification


def read_conll(spec: TaskSpec, path: Path, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """Sentences as (words, tags). `-DOCSTART-` lines are document separators and are skipped."""
    check_file(path, spec)
    column = int(spec.label if spec.label is not None else -1)
    allowed = set(spec.labels or [])
    sentences: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    width = None
    for lineno, line in enumerate(read_user_text(path, "CoNLL file").splitlines(), start=1):
        cells = line.split()
        if not cells or cells[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
                words, tags = [], []
                if limit is not None and len(sentences) >= limit:
                    break
            continue
        width = width or len(cells)
        if len(cells) != width:
            raise UserError(
                f"{path} line {lineno}: {len(cells)} columns, expected {width} (task {spec.name!r}).",
                fix="fix or remove that line.",
            )
        if len(cells) <= column:
            raise UserError(
                f"{path} line {lineno}: {len(cells)} columns, so no label column {column} (task {spec.name!r}).",
                fix="set the task's `label` to the tag's 0-based column, or fix that line.",
            )
        tag = cells[column]
        if tag not in allowed:
            raise UserError(
                f"{path} line {lineno}: unknown tag {tag!r} (task {spec.name!r} has {spec.labels}).",
                fix="fix the line or add the tag to the task's `labels`.",
            )
        words.append(cells[0])
        tags.append(tag)
    if words and (limit is None or len(sentences) < limit):
        sentences.append((words, tags))
    if not sentences:
        raise UserError(
            f"task {spec.name!r}: {path} holds no sentences.", fix="point the task at a CoNLL file."
        )
    return sentences


def tag_warnings(
    spec: TaskSpec,
    train: list[tuple[list[str], list[str]]],
    dev: list[tuple[list[str], list[str]]],
    train_path: Path,
    dev_path: Path,
) -> list[str]:
    """The dev set's tags that no training word has (`tasks.label_warnings` for token tasks): never
    predicted, so every entity they mark is missed; or a dev set without entities, where entity F1 is
    0 whatever is predicted. Said by the data check, kept in the unit's notes."""
    if all(tag == "O" for _, tags in dev for tag in tags):
        return [
            f"task {spec.name!r}: the {len(dev)} dev sentence(s) read from {dev_path} hold no entity (every "
            "word is tagged O), so entity F1 is 0 whatever the model predicts."
        ]
    seen = {tag for _, tags in train for tag in tags}
    missing = [tag for _, tags in dev for tag in tags if tag not in seen]
    if not missing:
        return []
    names = [tag for tag in spec.labels or [] if tag in missing]
    tags, verb, them, they = (
        ("tag", "occurs", "it", "it") if len(names) == 1 else ("tags", "occur", "them", "they")
    )
    return [
        f"task {spec.name!r}: {tags} {', '.join(map(repr, names))} {verb} in {dev_path} ({len(missing)} "
        f"words) but never in the {len(train)} training sentences read from {train_path}; the model "
        f"cannot learn to predict {them}, so the entities {they} mark count as missed."
    ]


def encode_words(
    tok: Tokenizer,
    sentences: list[tuple[list[str], list[str]]],
    label_ids: dict[str, int],
    max_seq_length: int,
) -> list[dict[str, Any]]:
    tok.no_padding()
    tok.enable_truncation(max_seq_length)
    encodings = tok.encode_batch([words for words, _ in sentences], is_pretokenized=True)
    features = []
    for enc, (_, tags) in zip(encodings, sentences, strict=True):
        labels, first_token = [], {}
        previous = None
        for pos, word in enumerate(enc.word_ids):
            if word is not None and word != previous:
                labels.append(label_ids[tags[word]])
                first_token[word] = pos
            else:
                labels.append(IGNORE_INDEX)
            previous = word
        features.append(
            {
                "input_ids": enc.ids,
                "token_type_ids": enc.type_ids,
                "labels": labels,
                "first_token": first_token,
            }
        )
    return features


class TokenTask:
    def __init__(
        self,
        spec: TaskSpec,
        tok: Tokenizer,
        max_seq_length: int,
        max_train: int | None,
        max_eval: int | None,
        data_root: str | None,
    ) -> None:
        self.spec = spec
        self.label_ids = {t: i for i, t in enumerate(spec.labels or [])}
        train_path, dev_path = spec.path("train", data_root), spec.path("dev", data_root)
        train = read_conll(spec, train_path, max_train)
        self.dev = read_conll(spec, dev_path, max_eval)
        warnings = tag_warnings(spec, train, self.dev, train_path, dev_path)  # said once, by the data check
        self.train_features = encode_words(tok, train, self.label_ids, max_seq_length)
        self.eval_features = encode_words(tok, self.dev, self.label_ids, max_seq_length)
        self.n_train, self.n_eval = len(train), len(self.dev)
        cut = sum(
            len(w) - len(f["first_token"]) for (w, _), f in zip(self.dev, self.eval_features, strict=True)
        )
        self.notes: dict[str, Any] = {
            **redefined_builtin_note(spec),
            **dev_is_train_note(spec, data_root),
            "eval_words_truncated": cut,
        }
        if warnings:
            self.notes["labels"] = " ".join(warnings)

    def make_model(self, config: BertConfig) -> torch.nn.Module:
        return BertForTokenClassification(config, self.spec.num_labels)

    def eval_outputs(self, outputs: tuple, batch: dict[str, torch.Tensor]) -> list[Any]:
        preds = outputs[1].argmax(-1)
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [preds[i, :n].tolist() for i, n in enumerate(lengths)]

    def word_tags(self, per_feature: list[Any]) -> list[list[str]]:
        """The predicted tag of each dev word: its first token's ("O" for a word cut off)."""
        names = self.spec.labels or []
        return [
            [
                names[preds[feat["first_token"][w]]] if w in feat["first_token"] else "O"
                for w in range(len(words))
            ]
            for (words, _), feat, preds in zip(self.dev, self.eval_features, per_feature, strict=True)
        ]

    def metrics(self, per_feature: list[Any]) -> dict[str, float]:
        return {"entity_f1": entity_f1(self.word_tags(per_feature), [tags for _, tags in self.dev])}

    def chance_metrics(self) -> dict[str, float]:
        """Tagging every word with the majority tag "O" finds no entity: F1 0."""
        return {"entity_f1": 0.0}

    def chance_prediction(self) -> str:
        return "O"
