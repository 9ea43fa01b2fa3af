"""The BERT / XLM-RoBERTa encoder family on packed tokens, with its heads.

One readable module: embeddings, transformer layers and the
sequence-classification head, all working on a flat ``[T, hidden]`` token
matrix with no padding. How attention is kept inside each sequence is not
decided here: the caller passes an ``Attend`` function (see attention.py).
Knows nothing about files, batching or devices.

BERT and XLM-R share this code; they differ only in where position ids start
(config.position_offset) and in their checkpoints' weight names (weights.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.modules.attention import BIDIRECTIONAL, Attend, AttentionKind
from embedserve.model.config import EncoderConfig


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name == "gelu":
        return F.gelu                                     # exact (erf) GELU, as HF "gelu"
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu


def embedding_table(rows: int, dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` with its weights left as they are made (a checkpoint fills them).

    ``nn.Embedding``'s own initialisation draws normal values; on the meta device
    (``engine.build_model``) that runs torch's Python reference op, whose first call
    imports torch._dynamo: about 1.7 s of every replica's start, for values never used.
    """
    return nn.Embedding.from_pretrained(torch.empty(rows, dim), freeze=True)


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word = embedding_table(config.vocab_size, config.hidden_size)
        self.position = embedding_table(config.max_position_embeddings, config.hidden_size)
        self.token_type = embedding_table(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        # token_ids, position_ids, token_type_ids: [T] -> x: [T, hidden]
        x = self.word(token_ids) + self.token_type(token_type_ids) + self.position(position_ids)
        return self.norm(x)


class Layer(nn.Module):
    """Post-norm transformer layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        # Q, K and V fused into one matmul: one pass over x instead of three.
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(hidden, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, hidden]
        tokens = x.shape[0]
        qkv = self.qkv(x).view(tokens, 3, self.num_heads, self.head_dim)   # [T, 3, heads, hd]
        context = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2])                  # [T, heads, hd]
        x = self.attn_norm(x + self.attn_out(context.reshape(tokens, -1)))
        return self.ffn_norm(x + self.ffn_out(self.act(self.ffn_in(x))))


class Encoder(nn.Module):
    """Token ids in, final hidden states out: [T] -> [T, hidden]."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layers))

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embeddings(token_ids, position_ids, token_type_ids)      # [T, hidden]
        for layer in self.layers:
            x = layer(x, attend)
        return x


class ClassificationHead(nn.Module):
    """Sequence-classification head on the first token: out_proj(tanh(dense(x))).

    BERT calls ``dense`` its pooler and ``out_proj`` its classifier; XLM-R calls
    them classifier.dense / classifier.out_proj. The math is the same
    (weights.py maps both spellings).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, cls_states: torch.Tensor) -> torch.Tensor:
        # cls_states: [B, hidden] -> logits [B, labels]
        return self.out_proj(torch.tanh(self.dense(cls_states)))


class MaskedLMHead(nn.Module):
    """The masked-LM head: decoder(LN(act(dense(x)))) + bias, one logit per vocabulary entry.

    BERT calls these cls.predictions.transform.{dense,LayerNorm}, cls.predictions.decoder
    (tied to the word embeddings) and cls.predictions.bias (weights.py maps them). SPLADE
    (modules/sparse.py) runs it on blocks of tokens, never on all T at once.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.act = activation(config.hidden_act)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        # states: [t, hidden] -> logits [t, vocab]
        return self.decoder(self.norm(self.act(self.dense(states))))


class EncoderModel(nn.Module):
    """An encoder plus, for rerankers and classifiers, its classification head, or, for
    SPLADE sparse encoders, its masked-LM head."""

    attention_kind: AttentionKind = BIDIRECTIONAL

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head: nn.Module | None = None
        self.mlm: MaskedLMHead | None = None
        if config.task in ("score", "classify"):
            self.head = ClassificationHead(config)
        if config.task == "sparse":
            self.mlm = MaskedLMHead(config)

    def forward(self, token_ids: torch.Tensor, position_ids: torch.Tensor,
                token_type_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        return self.encoder(token_ids, position_ids, token_type_ids, attend)

    def score(self, cls_states: torch.Tensor) -> torch.Tensor:
        # cls_states: [B, hidden] -> logits [B] (one label: a reranker) or [B, labels]
        assert self.head is not None, "score() needs a classification head"
        logits = self.head(cls_states)
        return logits[:, 0] if self.config.num_labels == 1 else logits
