"""Near ties in a model's discrete choices, for the export check: a mixture of experts routes each token to
the experts whose router scores are its top k (torch.topk). Where the k-th and the (k+1)-th score differ by
less than the float rounding the check tolerates, torch's pick is arbitrary: onnxruntime, rounding the same
sum in another order, may route the token elsewhere, and that token (and, through attention, the ones after
it) then differs by the size of the outputs, not by rounding. GraniteMoE-Hybrid's small config met a margin
of 4e-8 on the export check's inputs. Such inputs cannot tell a faithful export from a wrong one, so the
check draws others (pipeline/export.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def topk_margins() -> Iterator[list[float]]:
    """The margins of the torch.topk calls made inside: for each, the smallest gap between a row's k-th and
    (k+1)-th largest value, relative to the k-th's magnitude where above 1."""
    import torch
    from torch.overrides import TorchFunctionMode

    margins: list[float] = []

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            if func in (torch.topk, torch.Tensor.topk):
                with torch._C.DisableTorchFunction():
                    margins.append(_margin(*args, **kwargs))
            return result

    with Recorder():
        yield margins


def _margin(values, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> float:  # noqa: A002 - torch.topk's names
    import torch

    if not values.is_floating_point() or values.shape[dim] <= k or values.numel() == 0:
        return float("inf")
    ordered = torch.sort(values.detach().float(), dim=dim, descending=largest).values
    kth, after = ordered.select(dim, k - 1), ordered.select(dim, k)
    return float(((kth - after).abs() / kth.abs().clamp(min=1.0)).min())
