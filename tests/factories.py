"""Small PyTorch models the tests export (profile factories: `factories:NAME`)."""

import torch
from torch import nn


class _Special(nn.Module):
    def forward(self, x):
        return torch.polygamma(1, x) + 1  # aten::polygamma has no ONNX translation


def polygamma_model():
    """A model whose `head.special` submodule calls an operator neither exporter supports."""
    return nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU(), _Special()))


def tiny_mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def scaled_tiny_mlp(scale: float = 1e6):
    """tiny_mlp with outputs near `scale`: float32 rounding differences grow with them."""
    model = tiny_mlp()
    with torch.no_grad():
        model[2].weight.mul_(scale)
        model[2].bias.mul_(scale)
    return model

def tiny_mlp_with_examples():
    """Returns (module, example_inputs): the factory form with its own example inputs."""
    return tiny_mlp(), (torch.randn(3, 8),)


def not_a_module():
    return 42


class HandWrittenBlock(nn.Module):
    """LayerNorm (mean / var / sqrt, eps 1e-12) and GELU (erf and tanh forms) written out in torch."""

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.gamma = nn.Parameter(torch.rand(hidden) + 0.5)
        self.beta = nn.Parameter(torch.rand(hidden) - 0.5)

    def layer_norm(self, x):
        mean = x.mean(-1, keepdim=True)
        centered = x - mean
        variance = centered.pow(2).mean(-1, keepdim=True)
        return centered / torch.sqrt(variance + 1e-12) * self.gamma + self.beta

    def forward(self, x):
        h = self.layer_norm(self.dense(x))
        erf = h * 0.5 * (1.0 + torch.erf(h / 1.4142135623730951))
        tanh = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3))))
        return erf + tanh


def hand_written_block():
    return HandWrittenBlock()


def small_mlp():
    """Big enough for ModelOpt to quantize (it skips GEMMs with K or N < 16)."""
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def tiny_mlp_with_dynamic_shapes():
    """Returns (module, example_inputs, dynamic_shapes) with the shapes keyed by forward's argument name."""
    return tiny_mlp(), (torch.randn(3, 8),), {"input": {0: torch.export.Dim("batch", min=1, max=16)}}


def _broken_while_exporting(model: nn.Module, module: str, offset: float) -> nn.Module:
    """`model` whose submodule `module` adds `offset` to its output only while an ONNX export traces it:
    the export differs from torch from that module on, which `compare --torch` must find."""
    target = model.get_submodule(module)
    forward = target.forward

    def broken(*args, **kwargs):
        output = forward(*args, **kwargs)
        return output + offset if torch.onnx.is_in_onnx_export() else output

    target.forward = broken
    return model


def bert_tiny_broken(module: str = "encoder.layers.3.pos_ff.dense", offset: float = 1.0, **kwargs):
    """The built-in bert-tiny (kwargs of pipeline.models.bert:sentence_pair_matcher) with one broken module."""
    from pipeline.models.bert import sentence_pair_matcher

    return _broken_while_exporting(sentence_pair_matcher(**kwargs), module, offset)


def bert_tiny_broken_new_each_build(**kwargs):
    """bert_tiny_broken with weights drawn afresh on every call (no seed): a factory whose model cannot be built again."""
    import os

    model = bert_tiny_broken(**kwargs)
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.01)
    return model


def hf_bert_broken(module: str = "encoder.layer.1.intermediate.dense", offset: float = 0.05):
    """A Hugging Face BertModel from a small random config, with one broken module."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, max_position_embeddings=64)
    return _broken_while_exporting(BertModel(config).eval(), module, offset)


class _SharedLayer(nn.Module):
    """One block (Linear + LayerNorm) applied three times: weight sharing, as in ALBERT."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.block(x))
        return x


def shared_layer():
    return _SharedLayer()


class _CosSin(nn.Module):
    """Two results of one shape, computed interleaved (as rotary embeddings return cos and sin)."""

    def forward(self, x):
        return torch.cos(x) * 2, torch.sin(x) * 2


class _TrickyModules(nn.Module):
    """What a per-module comparison must get right: a submodule's output changed in place afterwards
    (ResNet's `hidden += residual`) and a submodule returning two tensors of one shape."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.pair = _CosSin()

    def forward(self, x):
        h = self.linear(x)
        h += x
        cos, sin = self.pair(h)
        return cos - sin


def tricky_modules():
    return _TrickyModules()


class _RejectsLargeInputs(nn.Module):
    """A model whose own code raises on some inputs (as real models check their arguments)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        if torch.onnx.is_in_onnx_export() or float(x.abs().max()) < 100:
            return self.linear(x)
        raise ValueError("inputs must be normalized")


def rejects_large_inputs():
    return _RejectsLargeInputs()


def tiny_transformer_encoder():
    """torch's own encoder layer: its dynamo export computes the attention scale with CastLike."""
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(32, nhead=2, dim_feedforward=64, batch_first=True), 1, enable_nested_tensor=False).eval()


class _TinyCnn(nn.Module):
    """Two conv blocks with a residual, pooled into a classifier: a CNN as a user writes one."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.act = nn.ReLU()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.stem(x)
        x = self.act(self.block(x) + x)
        return self.head(x.mean(dim=(2, 3)))


def tiny_cnn(trained_bn: bool = False):
    """`trained_bn`: BatchNorm statistics of a trained model (not the identity a fresh one is), so an exporter
    that folds a BatchNorm into the Conv before it changes that Conv's output (TorchScript does)."""
    model = _TinyCnn().eval()
    if trained_bn:
        generator = torch.Generator().manual_seed(0)
        for norm in (model.stem[1], model.block[1]):
            norm.running_mean.uniform_(-0.5, 0.5, generator=generator)
            norm.running_var.uniform_(0.5, 1.5, generator=generator)
            norm.weight.data.uniform_(0.5, 1.5, generator=generator)
    return model


class _PreLnTransformer(nn.Module):
    """Token ids through pre-LayerNorm encoder layers (norm_first) to a classifier: a transformer as a user writes one."""

    def __init__(self, d: int = 64, heads: int = 4, vocab: int = 1000, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 2)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x)[:, 0])


def pre_ln_transformer():
    return _PreLnTransformer().eval()


class _StackedCacheDecoder(nn.Module):
    """A user's own decoder and cache: keys and values of every layer stacked as [layers, batch, heads, past, head_dim]
    (batch on axis 1), taken and returned beside the logits."""

    def __init__(self, vocab=128, d=32, heads=2, layers=3):
        super().__init__()
        self.heads, self.embed = heads, nn.Embedding(vocab, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, cache_k, cache_v):
        x = self.embed(tokens)
        b, t, d = x.shape
        keys, values = [], []
        for i, qkv in enumerate(self.qkv):
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in qkv(x).split(d, dim=-1))
            k, v = torch.cat([cache_k[i], k], dim=2), torch.cat([cache_v[i], v], dim=2)
            x = x + nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
            keys.append(k)
            values.append(v)
        return self.head(x), torch.stack(keys), torch.stack(values)


def stacked_cache_decoder():
    torch.manual_seed(0)
    return _StackedCacheDecoder().eval()


class _OwnCacheDecoder(nn.Module):
    """A decoder of a user's writing: its cache one key and one value per layer, fed and returned by the names
    trt-pipeline reads (`past_key_values.{i}.key` in, `present.{i}.key` out); positions looked up as
    `arange(past, past + seq)`, with past the cache's length."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2):
        super().__init__()
        self.heads, self.embed, self.positions = heads, nn.Embedding(vocab, d), nn.Embedding(64, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask, *cache):
        past = cache[0].shape[2]
        x = self.embed(input_ids) + self.positions(torch.arange(past, past + input_ids.shape[1]))
        b, t, d = x.shape
        causal = torch.arange(past + t)[None, :] <= torch.arange(past, past + t)[:, None]
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        outputs = {}
        for i, qkv in enumerate(self.qkv):
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in qkv(x).split(d, dim=-1))
            k, v = torch.cat([cache[2 * i], k], dim=2), torch.cat([cache[2 * i + 1], v], dim=2)
            x = x + nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2).reshape(b, t, d)
            outputs[f"present.{i}.key"], outputs[f"present.{i}.value"] = k, v
        return {"logits": self.head(x), **outputs}


def own_cache_decoder():
    torch.manual_seed(0)
    return _OwnCacheDecoder().eval()


class _PaddedMaxPool(nn.Module):
    """Zero padding, then a max pool (a BiT stem's): over a window of negative values the padded 0 is the maximum."""

    def __init__(self):
        super().__init__()
        self.pad, self.pool = nn.ZeroPad2d(1), nn.MaxPool2d(3, stride=2)

    def forward(self, x):
        return self.pool(self.pad(x - 2.0))


def padded_max_pool():
    return _PaddedMaxPool()


class _StepsOverItsLength(nn.Module):
    def forward(self, x):
        return torch.stack([x[:, i] * (i + 1) for i in range(x.shape[1])], dim=1)  # a Python loop over a dynamic dim


def steps_over_its_length():
    """A model whose code takes its input's dim 1 as a Python number (mamba's sequential scan, funnel's position list)."""
    return _StepsOverItsLength()


class _RandomMask(nn.Module):
    """Masks a random half of its input on every call, as ViTMAE's forward draws its patch mask."""

    def forward(self, x):
        return x * (torch.rand_like(x) > 0.5)


def random_mask():
    return nn.Sequential(nn.Linear(8, 8), _RandomMask())


class _BucketizedPositions(nn.Module):
    """SmolVLM's vision position ids in small: each of the 8 inputs' fraction of the way along, bucketized into 14
    buckets (13 boundaries), looks up a position embedding."""

    def __init__(self):
        super().__init__()
        self.positions = nn.Embedding(14, 8)

    def forward(self, x):
        boundaries = torch.arange(1 / 14, 1.0, 1 / 14)
        fractions = torch.sigmoid(x)
        return x + self.positions(torch.bucketize(fractions, boundaries, right=True)).sum(dim=1)


def bucketized_positions():
    return _BucketizedPositions()


class _SeventhSteps(nn.Module):
    """Scales its first 7 inputs by torch.arange(1/7, 1.0, 1/7): 7 steps in torch (counted in double), 6 in float32."""

    def forward(self, x):
        return x[:, :7] * torch.arange(1 / 7, 1.0, 1 / 7) + torch.arange(0.5, 7, 1, dtype=torch.int64)


def seventh_steps():
    return _SeventhSteps()


class _PrefillOnlyDecoder(_OwnCacheDecoder):
    """The decoder above as a user may first export it: token ids in, logits and the cache out, no input feeding the
    cache back (each forward starts from an empty one)."""

    def forward(self, input_ids):
        empty = torch.zeros(input_ids.shape[0], self.heads, 0, self.head.in_features // self.heads)
        return super().forward(input_ids, torch.ones_like(input_ids), *[empty] * (2 * len(self.qkv)))


def prefill_only_decoder():
    torch.manual_seed(0)
    return _PrefillOnlyDecoder().eval()
