"""Sequence-level tasks (GLUE and user TSV tasks): `[CLS] A [SEP] B [SEP]`, one new layer on C."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from finetuning.chance import best_constant
from finetuning.metrics import classification_metrics, regression_metrics
from finetuning.tasks import (
    TaskSpec,
    TextExample,
    dev_is_train_note,
    label_warnings,
    read_tsv_examples,
    redefined_builtin_note,
)
from model.config import BertConfig
from model.heads import BertForSequenceClassification


def encode_pairs(tok: Tokenizer, examples: list[TextExample], max_seq_length: int) -> list[dict[str, Any]]:
    """Token ids and segment ids, truncated longest-first to `max_seq_length` (as transformers does)."""
    tok.no_padding()
    tok.enable_truncation(max_seq_length, strategy="longest_first")
    inputs = [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in examples]
    encodings = tok.encode_batch(inputs)
    return [
        {"input_ids": enc.ids, "token_type_ids": enc.type_ids, "label": ex.label}
        for enc, ex in zip(encodings, examples, strict=True)
    ]


class SequenceTask:
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
        train_path, dev_path = spec.path("train", data_root), spec.path("dev", data_root)
        train = read_tsv_examples(spec, train_path, max_train)
        dev = read_tsv_examples(spec, dev_path, max_eval)
        warnings = label_warnings(spec, train, dev, train_path, dev_path)  # said once, by the data check
        self.train_features = encode_pairs(tok, train, max_seq_length)
        self.eval_features = encode_pairs(tok, dev, max_seq_length)
        self.n_train, self.n_eval = len(train), len(dev)
        self.dev_examples = dev
        self.notes: dict[str, Any] = {**redefined_builtin_note(spec), **dev_is_train_note(spec, data_root)}
        if warnings:
            self.notes["labels"] = " ".join(warnings)

    def make_model(self, config: BertConfig) -> torch.nn.Module:
        return BertForSequenceClassification(config, self.spec.num_labels)

    def eval_outputs(self, outputs: tuple, batch: dict[str, torch.Tensor]) -> list[Any]:
        logits = outputs[1].float()
        if self.spec.kind == "regression":
            return logits.squeeze(-1).tolist()
        return logits.argmax(-1).tolist()

    def metrics(self, per_feature: list[Any]) -> dict[str, float]:
        labels = [f["label"] for f in self.eval_features]
        if self.spec.kind == "regression":
            return regression_metrics(self.spec.metrics, np.asarray(per_feature), labels)
        return classification_metrics(self.spec.metrics, per_feature, labels)

    def chance_metrics(self) -> dict[str, float | None]:
        """The best constant prediction's metrics (`chance.best_constant`) for classification; 0
        for correlations."""
        if self.spec.kind == "regression":
            return {m: 0.0 for m in self.spec.metrics}
        return self._best_constant()[1]

    def chance_prediction(self) -> str | None:
        """The label that `chance_metrics` always predicts (None for a regression)."""
        label = None if self.spec.kind == "regression" else self._best_constant()[0]
        return None if label is None else (self.spec.labels or [])[label]

    def _best_constant(self) -> tuple[int | None, dict[str, float | None]]:
        train = [f["label"] for f in self.train_features]
        return best_constant(self.spec.metrics, train, [f["label"] for f in self.eval_features])
