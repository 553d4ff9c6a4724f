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
