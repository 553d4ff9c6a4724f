"""init's trial run of a starter profile's model, bounded in time (pipeline/core/budget.py) and memory: the run at the
profile's max dims is first made at batch 1, and its peak memory times the batch max refused where it would not fit.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.core.budget import step
from pipeline.core.errors import InputError
from pipeline.core.profiles import Profile

# init's time budget in seconds (`init --budget`, or this environment variable): the slowest types of the
# sweep took 90 s on a loaded 2-core machine (gpt_neo, mpnet)
DEFAULT_SECONDS = 300
SECONDS_ENV = "PIPELINE_INIT_SECONDS"


def run_at_max(model_name: str, bound: Any, profile: Profile, batch_one: bool = False) -> None:
    """Run `bound` (the forward taking the profile's inputs in order) at the profile's max dims, batch 1 first (only, with
    `batch_one`); refuses a batch max whose projected peak memory exceeds what is available (projected on Linux only)."""
    import torch

    from pipeline.core.memory import available_bytes, gib
    from pipeline.core.rss import peak_rss_mb, reset_peak
    from pipeline.core.samples import make_inputs

    def run(batch: int | None) -> None:
        feeds = make_inputs(profile, seed=0, which="max", dims={"batch": batch} if batch else None)
        bound(*(torch.from_numpy(array) for array in feeds.values()))

    dims = ", ".join(f"{name} {r.max}" for name, r in profile.dims.items() if name != "batch")
    with step(f"running {model_name} at batch 1{', ' if dims else ''}{dims}"):
        measured = reset_peak()
        before = peak_rss_mb()
        run(1)
        grown = (peak_rss_mb() - before) * 1e6
    batch_max = profile.dims["batch"].max if "batch" in profile.dims else 1
    if batch_one or batch_max == 1:
        return
    available = available_bytes()
    if measured and grown * batch_max > available:
        raise InputError(f"running {model_name} at batch {batch_max}{', ' if dims else ''}{dims} would need about {gib(grown * batch_max)} "
                         f"({grown / 2**20:,.0f} MiB at batch 1, x{batch_max}); this machine has {gib(available)} available: "
                         "write the profile's config and [dims] by hand, smaller (see docs/models.md)")
    with step(f"running {model_name} at batch {batch_max}{', ' if dims else ''}{dims}"):
        run(None)


@contextmanager
def random_draws() -> Iterator[list[tuple[int, ...]]]:
    """The shapes of the random tensors the code run inside draws with torch.rand or torch.randn (ViTMAE's masking
    noise): a forward that draws them differs on every run, and a forward taking them as an input can be fed them."""
    import torch
    from torch.overrides import TorchFunctionMode

    shapes: list[tuple[int, ...]] = []

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.rand, torch.randn):
                given = args or ((kwargs or {}).get("size", ()),)
                sizes = given[0] if len(given) == 1 and isinstance(given[0], (tuple, list, torch.Size)) else given
                if all(isinstance(size, (int, torch.SymInt)) or (isinstance(size, torch.Tensor) and size.numel() == 1) for size in sizes):
                    shapes.append(tuple(int(size) for size in sizes))  # else a size this record cannot read: the model's call decides
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield shapes


def feed_noise(model: Any, draws: list[tuple[int, ...]], document: Any) -> bool:
    """Where the forward drew a [batch, n] random tensor and takes it as `noise` (ViTMAE's masking), add that input
    to the profile: fed, the forward is deterministic, so its export can be checked and calibrated."""
    drawn = [shape for shape in draws if len(shape) == 2]
    if not drawn or "noise" not in inspect.signature(type(model).forward).parameters:
        return False
    import tomlkit

    noise = tomlkit.table()
    noise.update({"name": "noise", "dtype": "float32", "shape": ["batch", drawn[0][1]], "range": [0.0, 1.0]})
    noise.comment(f"the random draw {type(model).__name__}'s forward makes otherwise (uniform, as torch.rand)")
    document["inputs"].append(noise)
    return True
