"""BERT in plain PyTorch, with module names that match Hugging Face checkpoint keys."""

from model.bert import BertModel
from model.config import PRESETS, BertConfig
from model.heads import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    PreTrainingOutput,
)

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "PreTrainingOutput",
]
