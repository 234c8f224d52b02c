"""The original BERT network (Devlin et al. 2018), post-LayerNorm, in plain PyTorch.

Module and parameter names copy the Hugging Face `BertForPreTraining` layout
(`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.transform.dense.weight`, ...)
so that a state dict moves between the two implementations with no renaming.

Shapes in comments: B batch, T sequence length, H hidden size, nh heads, hd head size, V vocabulary,
N selected positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import attend_on_cpu, attend_varlen, runs_varlen
from model.config import BertConfig
from model.dropout import Dropout, attention_with_cheap_dropout
from model.packing import Packing

_ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu, "silu": F.silu,
                "swish": F.silu}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        # `_weight` skips nn.Embedding's own init (BertForPreTraining._init_weights does it, or the checkpoint)
        def table(n: int, **kw) -> nn.Embedding:
            return nn.Embedding(n, config.hidden_size, _weight=torch.empty(n, config.hidden_size), **kw)
        self.word_embeddings = table(config.vocab_size, padding_idx=config.pad_token_id)
        self.position_embeddings = table(config.max_position_embeddings)
        self.token_type_embeddings = table(config.type_vocab_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, T, H); or packed (N,) ids with their (N,) `positions` -> (N, H)."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # broadcast over B
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


Mask = torch.Tensor | Packing | None  # a (B, 1, 1, T) key mask for padded input, a Packing for packed input


def rows_at(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(B, T, H) states at `keep`: a boolean (B, T) gives (K, H), the kept rows in row-major order (K is known only
    once the device has counted them); (B, Q) positions give (B, Q, H), a shape known before anything runs, which a
    step replayed as a CUDA graph needs. A position may repeat (fixed slots fill their spare places with [CLS])."""
    if keep.dtype == torch.bool:
        return x[keep]
    return x.gather(1, keep.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        # One module computing (query | key | value) at once, set at serving time (`model.fuse`; in int8 by
        # `kernels.quantize`, so that the three products share one quantization of x); None: the three Linears above.
        self.fused_qkv: nn.Module | None = None
        self.dropout_prob = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attn_mask: Mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x is (B, T, H) with a key mask (or None), or packed (N, H) with its Packing.

        With `keep`, a boolean (B, T), only the kept tokens ask queries: the result is (K, H) for
        them, row-major, while keys and values still come from every token; or with (B, Q) positions,
        (B, Q, H) for those (see `rows_at`).
        """
        if isinstance(attn_mask, Packing):
            if keep is not None:
                raise ValueError("keep is for padded input")
            packing = attn_mask
            qkv = self.fused_qkv(x) if self.fused_qkv is not None else \
                torch.cat((self.query(x), self.key(x), self.value(x)), -1)
            if not (self.training and self.dropout_prob > 0) and runs_varlen(qkv.device, qkv.dtype, self.head_dim):
                return attend_varlen(qkv, packing, self.num_heads, self.head_dim)  # no padding at all
            if not self.training and (on_cpu := attend_on_cpu(qkv, packing, self.num_heads, self.head_dim)) is not None:
                return on_cpu
            q, k, v = packing.pad(qkv).chunk(3, -1)
            return packing.unpad(self._attend(q, k, v, packing.key_mask))
        if self.fused_qkv is not None:
            q, k, v = self.fused_qkv(x).chunk(3, -1)
            q = q if keep is None else rows_at(q, keep)
        else:
            q, k, v = self.query(x if keep is None else rows_at(x, keep)), self.key(x), self.value(x)
        if keep is None or keep.dtype != torch.bool:
            return self._attend(q, k, v, attn_mask)  # (B, T, H), or (B, Q, H) for Q positions a row
        # Kept tokens' queries, left-aligned per sequence in a (B, Q, H) layout (Q = most kept in a row, at least 2:
        # a compiled step cannot tell whether a count read from the device is 1, where reshapes would differ).
        counts = keep.sum(1)
        slots = torch.arange(max(int(counts.max()), 2), device=x.device)[None, :] < counts[:, None]  # (B, Q)
        flat_slots = slots.reshape(-1).nonzero().squeeze(1)
        q = q.new_zeros(slots.numel(), q.shape[-1]).index_copy(0, flat_slots, q)
        out = self._attend(q.view(*slots.shape, -1), k, v, attn_mask)
        return out.reshape(slots.numel(), -1).index_select(0, flat_slots)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        """q (B, Tq, H) attends to k, v (B, T, H) -> (B, Tq, H)."""
        batch, queries, hidden = q.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, t.shape[1], self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)

        q, k, v = heads(q), heads(k), heads(v)
        if self.training and self.dropout_prob > 0 and q.device.type == "cpu":
            out = attention_with_cheap_dropout(q, k, v, key_mask, self.dropout_prob)
        else:
            # SDPA picks flash / memory-efficient kernels where the device has them. key_mask is a
            # boolean (B, 1, 1, T) key mask, or None when nothing is padded (which unlocks flash).
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=key_mask, dropout_p=self.dropout_prob if self.training else 0.0
            )
        return out.transpose(1, 2).reshape(batch, queries, hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(attended)) + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: Mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        """With `keep` only the kept tokens come out (`rows_at`): they attend to every token, but nothing
        else is computed for the others."""
        context = self.self(x, attn_mask, keep)
        return self.output(context, x if keep is None else rows_at(x, keep))


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, expanded: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(expanded)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: Mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        attended = self.attention(x, attn_mask, keep)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, attn_mask: Mask, keep_last: torch.Tensor | None = None, start: int = 0,
                stop: int | None = None) -> torch.Tensor:
        """All tokens through layers start..stop-1 (every layer by default), or with `keep_last` the last of those
        layers' output only for those tokens (`rows_at`: (K, H) for a boolean (B, T), (B, Q, H) for positions)."""
        layers = self.layer[start:stop]
        for index, layer in enumerate(layers):
            x = layer(x, attn_mask, keep_last if index == len(layers) - 1 else None)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.pool(sequence_output[:, 0])

    def pool(self, cls_vectors: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls_vectors))  # (B, H) from the [CLS] vectors


def key_padding_mask(attention_mask: torch.Tensor | None, padded: bool | None = None) -> torch.Tensor | None:
    """(B, T) 1/0 mask -> boolean (B, 1, 1, T) for SDPA, or None when there is no padding.

    `padded`: whether any row is padded, where the caller knows it without the device (the trainer reads it off
    the batch on the host); None asks the mask itself, which waits for the device and splits a compiled graph."""
    if attention_mask is None or padded is False:
        return None
    mask = attention_mask.bool()
    if padded is None and bool(mask.all()):
        return None
    return mask[:, None, None, :]


class BertModel(nn.Module):
    """Embeddings + encoder (+ pooler). Returns the last hidden state and the pooled [CLS] vector."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.encoder(self.embeddings(input_ids, token_type_ids), key_padding_mask(attention_mask))
        pooled = self.pooler(hidden) if self.pooler is not None else None
        return hidden, pooled  # (B, T, H), (B, H) | None

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, H): the hidden states the embedding routes serve (`config.embedding_layer`'s, else the last)."""
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        return self.encoder(self.embeddings(input_ids, types), key_padding_mask(attention_mask),
                            stop=self.config.served_embedding_layer)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = _ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """dense -> GELU -> LayerNorm -> decoder tied to the word embeddings, plus its own bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias  # same tensor under both names, as in transformers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (..., V)


class BertPreTrainingHeads(nn.Module):
    """The `cls` module. Either head may be absent (a checkpoint for BertModel or BertForMaskedLM)."""

    def __init__(self, config: BertConfig, with_mlm: bool = True, with_nsp: bool = True):
        super().__init__()
        self.predictions = BertLMPredictionHead(config) if with_mlm else None
        self.seq_relationship = nn.Linear(config.hidden_size, 2) if with_nsp else None


@dataclass
class PreTrainingOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooled_output: torch.Tensor | None  # (B, H)
    mlm_logits: torch.Tensor | None  # (B, T, V), or (N, V) when positions were selected
    nsp_logits: torch.Tensor | None  # (B, 2); index 0 = "B follows A"


class BertForPreTraining(nn.Module):
    """BERT with its pre-training heads (pooler, MLM, NSP: any may be left out), a classifier (`num_labels`) over the
    pooled [CLS] or (`per_token`) over every token, and a question-answering span head (`with_qa`: `qa_outputs`)."""

    def __init__(self, config: BertConfig, with_pooler: bool = True, with_mlm: bool = True, with_nsp: bool = True,
                 num_labels: int = 0, per_token: bool = False, with_qa: bool = False):
        super().__init__()
        if (with_nsp or (num_labels and not per_token)) and not with_pooler:
            raise ValueError("the next-sentence and sequence-classification heads need the pooler")
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=with_pooler)
        self.cls = BertPreTrainingHeads(config, with_mlm=with_mlm, with_nsp=with_nsp)
        self.classifier = nn.Linear(config.hidden_size, num_labels) if num_labels else None
        self.classifier_per_token = bool(num_labels and per_token)
        self.qa_outputs = nn.Linear(config.hidden_size, 2) if with_qa else None
        self.projection: nn.Module | None = None  # a ColBERT's, of each token's last state (model.projection)
        # On the meta device (load_checkpoint) init is moot, and would import torch._dynamo (1.3 s of every start).
        if not next(self.parameters()).is_meta:
            self.apply(self._init_weights)
        self.tie_weights()

    @property
    def has_mlm_head(self) -> bool:
        return self.cls.predictions is not None

    @property
    def has_nsp_head(self) -> bool:
        return self.cls.seq_relationship is not None

    @property
    def num_labels(self) -> int:  # the sequence classifier's outputs (0: none); the token classifier's below
        return self.classifier.out_features if self.classifier is not None and not self.classifier_per_token else 0

    @property
    def num_token_labels(self) -> int:
        return self.classifier.out_features if self.classifier_per_token else 0

    def tie_weights(self) -> None:
        """The decoder shares the word embeddings and the head's bias (also after loading replaces them)."""
        head = self.cls.predictions
        if head is not None:
            head.decoder.weight = self.bert.embeddings.word_embeddings.weight
            head.decoder.bias = head.bias

    def _init_weights(self, module: nn.Module) -> None:
        # Same scheme as the reference implementation: N(0, initializer_range), zero biases.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
        if isinstance(module, (nn.Linear, nn.LayerNorm, BertLMPredictionHead)) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def mlm_logits(self, sequence_output: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Vocabulary logits, at every position or only where the boolean (B, T) `positions` is set.

        The vocabulary projection is the largest matmul of a small BERT; selecting the ~15% of
        positions that are masked skips most of it.
        """
        if self.cls.predictions is None:
            raise RuntimeError("this checkpoint has no masked-LM head")
        if positions is not None:
            sequence_output = sequence_output[positions]  # (N, H), row-major order
        return self.cls.predictions(sequence_output)

    def nsp_logits(self, pooled_output: torch.Tensor) -> torch.Tensor:
        if self.cls.seq_relationship is None:
            raise RuntimeError("this checkpoint has no next-sentence head")
        return self.cls.seq_relationship(pooled_output)  # (B, 2)

    def nsp_logits_from_cls(self, cls_vectors: torch.Tensor) -> torch.Tensor:
        """(B, H) last-layer [CLS] vectors -> (B, 2) next-sentence logits, through the pooler."""
        return self.nsp_logits(self.bert.pooler.pool(cls_vectors))

    def class_logits_from_cls(self, cls_vectors: torch.Tensor) -> torch.Tensor:
        """(B, H) last-layer [CLS] vectors -> (B, num_labels) classifier logits, through the pooler."""
        if not self.num_labels:
            raise RuntimeError("this checkpoint has no sequence-classification head")
        return self.classifier(self.bert.pooler.pool(cls_vectors))

    def encode_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, packing: Packing,
                      for_heads: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Packed (N,) ids -> ((N, H) states the embedding routes serve, (N, H) last-layer states the heads read, or
        None unless `for_heads`), computed without padding (see Packing; spare rows are computed, not returned). One
        tensor twice unless `config.embedding_layer` stops below the top; then the top layers run only for heads."""
        at = self.config.served_embedding_layer
        ids, types, positions = (packing.with_spare_rows(t) for t in (input_ids, token_type_ids, packing.positions))
        embedded = self.bert.encoder(self.bert.embeddings(ids, types, positions), packing, stop=at)
        if not for_heads:
            return packing.real_rows(embedded), None
        hidden = self.bert.encoder(embedded, packing, start=at) if at < self.config.num_hidden_layers else embedded
        return packing.real_rows(embedded), packing.real_rows(hidden)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, mlm_positions: torch.Tensor | None = None
                ) -> PreTrainingOutput:
        hidden, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        mlm = self.mlm_logits(hidden, mlm_positions) if self.has_mlm_head else None
        nsp = self.nsp_logits(pooled) if self.has_nsp_head else None
        return PreTrainingOutput(hidden, pooled, mlm, nsp)
