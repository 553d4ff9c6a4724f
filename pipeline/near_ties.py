"""Near ties in a mixture of experts' routing (torch.topk), for the export check: where the k-th and (k+1)-th router scores
differ by less than float rounding, onnxruntime may route a token elsewhere and differ by the size of the outputs
(GraniteMoE-Hybrid met a margin of 4e-8). Such inputs cannot tell a faithful export from a wrong one: the check draws others.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from pipeline.core.profiles import Profile

# a float32 dot product over a few thousand terms rounds by up to about 1e-5 of its magnitude in another summation
# order: a top-k choice decided by less is onnxruntime's to make otherwise; the check draws other inputs, up to 4 times
TIE_MARGIN = 1e-5
UNTIED_DRAWS = 4


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


def _margin(values, k, dim: int = -1, largest: bool = True, sorted: bool = True, **_: object) -> float:  # noqa: A002 - torch.topk's names
    """The margin of one topk call as the model made it (k a number or a 0-d tensor; `out=` and the like ignored);
    inf where there is none to measure: the model's own call, not this record, decides whether the model runs."""
    import torch

    k = int(k)
    if not isinstance(values, torch.Tensor) or not values.is_floating_point() or values.numel() == 0 or values.shape[dim] <= k:
        return float("inf")
    ordered = torch.sort(values.detach().float(), dim=dim, descending=largest).values
    kth, after = ordered.select(dim, k - 1), ordered.select(dim, k)
    return float(((kth - after).abs() / kth.abs().clamp(min=1.0)).min())


def untied_run(profile: Profile, module: Any, sizes: dict[str, int], seed: int) -> tuple[dict[str, np.ndarray], Any]:
    """Random valid inputs at `sizes` and torch's output on them: the first of UNTIED_DRAWS draws on which every
    torch.topk choice (a mixture of experts' routing) is decided by more than TIE_MARGIN, else the draw whose
    closest choice is the least close."""
    import torch

    from pipeline.core.samples import make_inputs
    from pipeline.models.module import run_module

    draws = []
    for draw in range(UNTIED_DRAWS):
        feeds = make_inputs(profile, seed=seed + 100 * draw, dims=sizes)
        with topk_margins() as margins:
            output = run_module(module, tuple(torch.from_numpy(a) for a in feeds.values()), profile)
        closest = min(margins, default=float("inf"))
        if closest > TIE_MARGIN:
            return feeds, output
        draws.append((closest, feeds, output))
    _, feeds, output = max(draws, key=lambda d: d[0])
    return feeds, output
