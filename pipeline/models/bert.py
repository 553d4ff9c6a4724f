"""The default model: a sentence-pair matcher on a post-LayerNorm BERT encoder, the model of the real TensorRT 10.10 build
log ``shared/fixtures/trt/bert-fp16-trt10.10.detailed.log``. Module names make the TorchScript exporter name the ONNX nodes
as that log's ``[ONNX Layer: ...]`` entries (``/encoder/layers.0/mha/attn/mha_prob/key/MatMul``); GELU is written out.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ErfGelu(nn.Module):
    """GELU written with erf, exported as Mul/Div/Erf/Add/Mul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class PositionEncoding(nn.Module):
    """Learned position embedding added to the token embedding, then LayerNorm."""

    def __init__(self, max_positions: int, hidden: int, eps: float):
        super().__init__()
        self.pe = nn.Embedding(max_positions, hidden)
        self.layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, pos_ids: torch.Tensor) -> torch.Tensor:
        return self.layernorm(x + self.pe(pos_ids))


class AttentionProbs(nn.Module):
    """softmax(Q K^T / sqrt(d) + mask), with the scale after the MatMul (BERT style)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_size = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.heads, self.head_size).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        query = self.split_heads(self.query(x))
        key = self.split_heads(self.key(x))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.head_size)
        return torch.softmax(scores + mask, dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.mha_prob = AttentionProbs(hidden, heads)
        self.value = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        probs = self.mha_prob(x, mask)
        value = self.mha_prob.split_heads(self.value(x))
        context = torch.matmul(probs, value).transpose(1, 2)
        return context.reshape(x.shape)


class AddNorm(nn.Module):
    """layernorm(dense(x) + residual)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.layernorm(self.dense(x) + residual)


class MultiHeadAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float):
        super().__init__()
        self.attn = Attention(hidden, heads)
        self.output = AddNorm(hidden, eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.attn(x, mask), x)


class PositionwiseFeedForward(nn.Module):
    """layernorm(output(gelu(dense(x))) + x), GELU written with erf."""

    def __init__(self, hidden: int, ffn: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden, ffn)
        self.output = nn.Linear(ffn, hidden)
        self.layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dense(x)
        h = h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return self.layernorm(self.output(h) + x)


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.mha = MultiHeadAttention(hidden, heads, eps)
        self.pos_ff = PositionwiseFeedForward(hidden, ffn, eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pos_ff(self.mha(x, mask))


class Encoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        type_vocab_size: int,
        max_positions: int,
        hidden: int,
        layers: int,
        heads: int,
        ffn: int,
        eps: float,
    ):
        super().__init__()
        self.embed_scale = math.sqrt(hidden)
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.sent_embedding = nn.Embedding(type_vocab_size, hidden)
        self.pos_encoding = PositionEncoding(max_positions, hidden, eps)
        self.layers = nn.ModuleList(
            EncoderLayer(hidden, heads, ffn, eps) for _ in range(layers)
        )

    def attention_mask(self, concat_mask: torch.Tensor) -> torch.Tensor:
        """Additive [batch, 1, seq, seq] mask: 0 where both tokens are real, -10000 else."""
        keys = concat_mask.unsqueeze(1).unsqueeze(2)
        queries = concat_mask.unsqueeze(1).unsqueeze(3)
        blocked = torch.logical_not(keys & queries)
        return blocked.to(torch.float32) * -10000.0

    def forward(self, concat_ids, sent_ids, pos_ids, concat_mask):
        x = self.embedding(concat_ids) * self.embed_scale
        x = x + self.sent_embedding(sent_ids) * self.embed_scale
        x = self.pos_encoding(x, pos_ids)
        mask = self.attention_mask(concat_mask)
        for layer in self.layers:
            x = layer(x, mask)
        return x


class MlpLayer(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.linear = nn.Linear(features_in, features_out)
        self.gelu = ErfGelu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu(self.linear(x))


class MatchModel(nn.Module):
    """Scores the [CLS] vector: MLP (Gemm + GELU), score Gemm, Sigmoid, Squeeze."""

    def __init__(self, hidden: int, mlp_hidden: int):
        super().__init__()
        self.mlp_layers = nn.ModuleList([MlpLayer(hidden, mlp_hidden)])
        self.score_layer = nn.Linear(mlp_hidden, 1)

    def forward(self, encoded: torch.Tensor) -> torch.Tensor:
        x = encoded[:, 0]
        for layer in self.mlp_layers:
            x = layer(x)
        return torch.sigmoid(self.score_layer(x)).squeeze(-1)


class SentencePairMatcher(nn.Module):
    def __init__(self, encoder: Encoder, match_model: MatchModel):
        super().__init__()
        self.encoder = encoder
        self.match_model = match_model

    def forward(self, concat_ids, sent_ids, pos_ids, concat_mask):
        return self.match_model(self.encoder(concat_ids, sent_ids, pos_ids, concat_mask))


def sentence_pair_matcher(
    vocab_size: int = 8192,
    type_vocab_size: int = 2,
    max_positions: int = 512,
    hidden: int = 256,
    layers: int = 12,
    heads: int = 4,
    ffn: int = 1024,
    mlp_hidden: int = 256,
    eps: float = 1e-12,
) -> SentencePairMatcher:
    """Profile factory: the matcher in eval mode (weights from the caller's torch seed)."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    encoder = Encoder(vocab_size, type_vocab_size, max_positions, hidden, layers, heads, ffn, eps)
    return SentencePairMatcher(encoder, MatchModel(hidden, mlp_hidden)).eval()
