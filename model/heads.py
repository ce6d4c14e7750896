"""Heads on top of the encoder: pretraining (MLM + NSP) and the fine-tuning task heads.

The MLM head runs only on the masked positions it is given: gathering the ~15% selected
tokens before the transform and the vocabulary projection avoids the [B*S, V] logits matrix
that a naive implementation builds, which is where most pretraining time goes on small models.
The encoder's last layer is likewise run only at those positions and [CLS] (`output_rows`).
Training on CPU, the loss at those positions is fused with the vocabulary projection
(`model.mlm_loss`): the output then has the predicted ids instead of the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertModel, activation, init_bert_weights
from model.config import BertConfig
from model.mlm_loss import linear_cross_entropy

IGNORE_INDEX = -100


def log_unigram_prior(token_counts: torch.Tensor) -> torch.Tensor:
    """log P(token) from how often each id is a masked-LM target, add-one smoothed over the
    vocabulary: the MLM bias at step 0 and the context-free baseline (`training.evaluate`)."""
    counts = token_counts.double().reshape(-1)
    return torch.log((counts + 1.0) / (counts.sum() + counts.numel()))


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class MLMHeadOutput(NamedTuple):
    logits: torch.Tensor | None  # [N, V]; None where the fused loss ran
    loss: torch.Tensor | None  # mean over the N rows, when labels were given
    top1: torch.Tensor | None  # [N] predicted ids, from the fused loss (else take logits.argmax)


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> MLMHeadOutput:
        """Logits at the rows `x` [N,H]; with `labels` [N] also the mean loss. Training on CPU in
        fp32 takes the fused loss instead (`model.mlm_loss`): no logits, the top-1 ids instead."""
        x = self.transform(x)
        if labels is None:
            return MLMHeadOutput(F.linear(x, self.decoder.weight, self.bias), None, None)
        fused = torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == torch.float32
        if fused and labels.numel():
            loss, top1 = linear_cross_entropy(x, self.decoder.weight, self.bias, labels)
            return MLMHeadOutput(None, loss, top1)
        logits = F.linear(x, self.decoder.weight, self.bias)
        return MLMHeadOutput(logits, F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX), None)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor | None  # [N, V] at the N selected positions (row-major over batch, slot)
    nsp_logits: torch.Tensor  # [B, 2]; label 0 = IsNext, 1 = NotNext (as in BERT / transformers)
    mlm_labels: torch.Tensor | None  # [N] original token ids at those positions
    mlm_top1: torch.Tensor | None = None  # [N] set instead of mlm_logits by the fused CPU training loss

    @property
    def mlm_predictions(self) -> torch.Tensor:
        """The predicted token id [N] at each selected position."""
        return self.mlm_top1 if self.mlm_logits is None else self.mlm_logits.argmax(-1)


class BertForPreTraining(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        init_bert_weights(self, config.initializer_range)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    @torch.no_grad()
    def init_mlm_bias(self, token_counts: torch.Tensor) -> None:
        """Start the MLM output bias at the log unigram distribution of the prediction targets
        (add-one smoothed, centred): the model then predicts token frequencies from step 0 instead
        of pushing every word embedding (tied to the decoder) along a shared direction to learn
        them, which left rare words' embeddings nearly identical (docs/quality.md)."""
        counts = token_counts.double().reshape(-1)
        if counts.numel() != self.config.vocab_size:
            raise ValueError(
                f"token_counts has {counts.numel()} entries for a vocabulary of {self.config.vocab_size}"
            )
        log_prior = log_unigram_prior(counts)
        self.cls.predictions.bias.copy_((log_prior - log_prior.mean()).to(self.cls.predictions.bias.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_labels: torch.Tensor | None = None,
        unpad: bool = True,
    ) -> PreTrainingOutput:
        """`masked_lm_positions` [B,P] index into the sequence; slots whose `masked_lm_labels`
        are -100 are padding and are skipped. Without positions, MLM logits cover every token.
        With positions, a padded batch runs unpadded (`unpad=False` keeps the padded layout)."""
        labels = masked_lm_labels.reshape(-1).long() if masked_lm_labels is not None else None
        if masked_lm_positions is None:
            seq, pooled = self.bert(input_ids, token_type_ids, attention_mask)
            selected = seq.reshape(-1, seq.shape[-1])
        else:
            # The encoder's last layer runs only at the masked positions (and [CLS]).
            seq, pooled = self.bert(
                input_ids, token_type_ids, attention_mask, output_rows=masked_lm_positions, unpad=unpad
            )
            selected = seq.reshape(-1, seq.shape[-1])
            if labels is not None:
                keep = labels != IGNORE_INDEX
                selected, labels = selected[keep], labels[keep]
        mlm = self.cls.predictions(selected, labels)
        nsp_logits = self.cls.seq_relationship(pooled)

        mlm_loss, nsp_loss, loss = mlm.loss, None, None
        if next_sentence_labels is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_labels.reshape(-1).long())
        if mlm_loss is not None or nsp_loss is not None:
            loss = sum(t for t in (mlm_loss, nsp_loss) if t is not None)
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm.logits, nsp_logits, labels, mlm.top1)


class BertForSequenceClassification(nn.Module):
    """One new layer W ∈ R^{K×H} on the pooled [CLS] vector C. K = 1 means regression (MSE)."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_bert_weights(self, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        # Only C is read: the last layer runs at [CLS] alone and a padded batch runs unpadded.
        no_rows = torch.zeros(input_ids.shape[0], 0, dtype=torch.long, device=input_ids.device)
        _, pooled = self.bert(input_ids, token_type_ids, attention_mask, output_rows=no_rows)
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        return loss, logits


class BertForTokenClassification(nn.Module):
    """A K-way classifier on every token vector T_i (labels -100 are ignored)."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_bert_weights(self, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        seq, _ = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(seq))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, self.num_labels).float(),
                labels.reshape(-1).long(),
                ignore_index=IGNORE_INDEX,
            )
        return loss, logits


class BertForQuestionAnswering(nn.Module):
    """Start/end logits over the token vectors T_i."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_bert_weights(self, config.initializer_range)

    def forward(
        self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None, end_positions=None
    ):
        seq, _ = self.bert(input_ids, token_type_ids, attention_mask)
        start_logits, end_logits = self.qa_outputs(seq).unbind(-1)
        if attention_mask is not None:
            neg = torch.finfo(start_logits.dtype).min
            start_logits = start_logits.masked_fill(~attention_mask.bool(), neg)
            end_logits = end_logits.masked_fill(~attention_mask.bool(), neg)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = (
                F.cross_entropy(start_logits.float(), start_positions.long())
                + F.cross_entropy(end_logits.float(), end_positions.long())
            ) / 2
        return loss, start_logits, end_logits


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once); under ZeRO-3, whose partitioned parameters
    hold no local elements, their full size (`ds_numel`)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in {id(p): p for p in module.parameters()}.values())
