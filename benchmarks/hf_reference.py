"""The reference for our pretraining model: `transformers.BertForPreTraining`, same shape, our batches.

Used by `bench_pretrain.py` (CPU) and `gpu_check.py` (GPU). Our batches carry the masked positions
and their labels (`masked_lm_positions` / `masked_lm_labels`, -100 = padded slot); transformers
wants a label per token (-100 = not predicted), which `hf_inputs` builds.
"""

from __future__ import annotations

import torch

from model.config import BertConfig


def hf_model(config: BertConfig):
    """A randomly initialized `transformers.BertForPreTraining` of our config, SDPA attention."""
    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining as HFBert

    return HFBert(HFConfig(**config.to_hf_dict(), attn_implementation="sdpa"))


def hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our collated batch (training.data.collate) -> the keyword arguments of transformers' model."""
    labels = torch.full_like(batch["input_ids"], -100)
    keep = batch["masked_lm_labels"] != -100
    rows = torch.arange(labels.shape[0], device=labels.device)[:, None].expand_as(keep)
    labels[rows[keep], batch["masked_lm_positions"][keep]] = batch["masked_lm_labels"][keep]
    return {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["token_type_ids"],
        "attention_mask": batch["attention_mask"],
        "labels": labels,
        "next_sentence_label": batch["next_sentence_labels"],
    }
