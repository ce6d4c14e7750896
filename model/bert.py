"""The BERT encoder: embeddings (token + segment + position), post-LN Transformer layers, pooler.

Attention goes through `scaled_dot_product_attention`, so PyTorch picks flash / memory-efficient
kernels on GPU and its fused CPU kernel here. `output_rows` lets pretraining run the last layer
only at the rows it reads (masked positions + [CLS]); the result equals the full output gathered.
On that path a padded batch is also *unpadded* (`Packing`): embeddings, projections, feed-forward
and LayerNorm run on the T non-pad tokens only, and only the attention core sees the padded
[B,S] layout. Module and parameter names equal Hugging Face's
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

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids [B,S] (positions default to 0..S-1), or packed [T] with their `positions` [T]."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        # .long(): the shard format stores int32 ids and int8 segments (no-op for int64 input)
        x = self.word_embeddings(input_ids.long()) + self.token_type_embeddings(token_type_ids.long())
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))

    @torch.no_grad()
    def copy_trained_positions(self, trained: int) -> None:
        """Positions `trained`.. (never trained by a phase at `trained` tokens) start as copies of
        positions 0..trained-1, repeated: Longformer's initialization for longer sequences (Beltagy
        et al. 2020), which keeps the learned local patterns instead of random vectors."""
        weight = self.position_embeddings.weight
        weight.copy_(weight[torch.arange(weight.shape[0]) % trained])  # the index makes a new tensor first


class Packing:
    """Where the T non-pad tokens of a padded [B,S] batch sit once packed into [T,H] rows.

    Unpadding is exact: a pad token never influences a real one (pad keys are masked out of
    attention, and every other op is per token), so computing only real tokens changes nothing
    but the work. Real batches are ~20-25% padding (docs/benchmarks.md §3).
    """

    def __init__(self, attention_mask: torch.Tensor) -> None:
        self.batch, self.seq = attention_mask.shape
        keep = attention_mask.reshape(-1).bool()
        self.index = keep.nonzero().squeeze(1)  # [T] flat positions b*S + s, row-major
        self.slot_of_flat = torch.cumsum(keep, 0) - 1  # flat position -> packed row (valid where kept)
        self.key_mask = attention_mask.bool()[:, None, None, :]  # [B,1,1,S], True = attend

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B,S,...] -> [T,...]."""
        return x.reshape(self.batch * self.seq, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[T,H] -> [B,S,H] with zeros at the pads."""
        full = x.new_zeros(self.batch * self.seq, x.shape[-1]).index_copy(0, self.index, x)
        return full.view(self.batch, self.seq, -1)

    def positions(self) -> torch.Tensor:
        """The position id (0..S-1) of every packed token [T]."""
        return self.index % self.seq

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        """Sequence positions [B,R] (each a real token) -> packed row numbers [B,R]."""
        base = torch.arange(self.batch, device=positions.device)[:, None] * self.seq
        return self.slot_of_flat[base + positions.long()]


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
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        x_query: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """Keys/values from every token of `x` [B,S,H]; queries from `x_query` [B,R,H], which is `x`
        itself or only the R rows whose outputs are needed (see BertEncoder). With `packing`, `x`
        is the packed [T,H]: projections run on the T real tokens, the attention core on [B,S]."""
        if packing is None:
            k, v = self.key(x), self.value(x)
            q = self.query(x if x_query is None else x_query)
        else:
            k, v = packing.unpack(self.key(x)), packing.unpack(self.value(x))
            q = packing.unpack(self.query(x)) if x_query is None else self.query(x_query)
            attn_mask = packing.key_mask
        b, s, h = k.shape
        r = q.shape[1]

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(q, r),
            heads(k, s),
            heads(v, s),
            attn_mask=attn_mask,
            dropout_p=self.dropout_p if self.training else 0.0,
        )
        out = out.transpose(1, 2).reshape(b, r, h)
        return packing.pack(out) if packing is not None and x_query is None else out


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
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        if rows is None:
            return self.output(self.self(x, attn_mask, None, packing), x)
        x_query = gather_rows(x, rows) if packing is None else x[rows]  # [B,R,H]
        return self.output(self.self(x, attn_mask, x_query, packing), x_query)


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
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """With `rows` [B,R] the output holds only those rows [B,R,H] (sequence positions, or
        packed row numbers when `packing` is given)."""
        x = self.attention(x, attn_mask, rows, packing)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        output_rows: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """`output_rows` [B,R]: return only these positions [B,R,H]. Every layer but the last still
        runs on all tokens (they are the keys and values of the next layer), but the last layer's
        queries, attention output and feed-forward run on the R rows alone: exact, and for
        pretraining (R = 1 + ~15% of S) it skips most of the last layer's work."""
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            x = layer(x, attn_mask, output_rows if i == last else None, packing)
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
        unpad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With `output_rows` [B,R] (real tokens only) the sequence output holds only those
        positions [B,R,H] (the pooler still sees [CLS]); the values equal the full output gathered
        at those rows. On that path a padded batch runs unpadded unless `unpad=False`."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        padded = attention_mask is not None and not bool(attention_mask.all())
        # Boolean key mask [B,1,1,S]: True = attend. Pad keys are never attended to.
        attn_mask = attention_mask.bool()[:, None, None, :] if padded else None
        if output_rows is None:
            x = self.encoder(self.embeddings(input_ids, token_type_ids), attn_mask)
            pooled = self.pooler(x) if self.pooler is not None else None
            return x, pooled
        rows = torch.cat([output_rows.new_zeros(output_rows.shape[0], 1), output_rows], dim=1)  # row 0: [CLS]
        packing = None
        if padded and unpad:
            packing = Packing(attention_mask)
            x = self.embeddings(packing.pack(input_ids), packing.pack(token_type_ids), packing.positions())
            rows = packing.rows(rows)
        else:
            x = self.embeddings(input_ids, token_type_ids)
        x = self.encoder(x, attn_mask, rows, packing)
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
