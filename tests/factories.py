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
