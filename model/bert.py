"""The BERT encoder: embeddings (token + segment + position), post-LN Transformer layers, pooler.

Attention goes through `scaled_dot_product_attention`, so PyTorch picks flash / memory-efficient
kernels on GPU and its fused CPU kernel here. `output_rows` lets pretraining run the last layer
only at the rows it reads (masked positions + [CLS]); the result equals the full output gathered. Module and parameter names equal Hugging Face's
(`embeddings.word_embeddings`, `encoder.layer.N.attention.self.query`, ...) so a state dict
moves between the two without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import BertConfig


def activation(name: str):
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device)
        # .long(): the shard format stores int32 ids and int8 segments (no-op for int64 input)
        x = self.word_embeddings(input_ids.long()) + self.token_type_embeddings(token_type_ids.long())
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, x_query: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Keys/values from every token of `x` [B,S,H]; queries from `x_query` [B,R,H], which is `x`
        itself or only the R rows whose outputs are needed (see BertEncoder)."""
        x_query = x if x_query is None else x_query
        b, s, h = x.shape
        r = x_query.shape[1]

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x_query), r), heads(self.key(x), s), heads(self.value(x), s)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0
        )
        return out.transpose(1, 2).reshape(b, r, h)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        x_query = x if rows is None else gather_rows(x, rows)
        return self.output(self.self(x, attn_mask, x_query), x_query)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """With `rows` [B,R] the output holds only those positions [B,R,H]."""
        x = self.attention(x, attn_mask, rows)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None, output_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`output_rows` [B,R]: return only these positions [B,R,H]. Every layer but the last still
        runs on all tokens (they are the keys and values of the next layer), but the last layer's
        queries, attention output and feed-forward run on the R rows alone: exact, and for
        pretraining (R = 1 + ~15% of S) it skips most of the last layer's work."""
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            x = layer(x, attn_mask, output_rows if i == last else None)
        return x


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x [B,S,H], rows [B,R] -> [B,R,H]."""
    return torch.take_along_dim(x, rows.long().unsqueeze(-1), dim=1)


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))


class BertModel(nn.Module):
    """Returns (sequence_output T [B,S,H], pooled_output C [B,H])."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With `output_rows` [B,R] the sequence output holds only those positions [B,R,H] (the
        pooler still sees [CLS]); the values equal the full output gathered at those rows."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        attn_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            # Boolean key mask [B,1,1,S]: True = attend. Pad keys are never attended to.
            attn_mask = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids)
        if output_rows is None:
            x = self.encoder(x, attn_mask)
            pooled = self.pooler(x) if self.pooler is not None else None
            return x, pooled
        cls_row = torch.zeros_like(output_rows[:, :1])
        x = self.encoder(x, attn_mask, torch.cat([cls_row, output_rows], dim=1))
        pooled = self.pooler(x) if self.pooler is not None else None  # row 0 is [CLS]
        return x[:, 1:], pooled


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialization: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
