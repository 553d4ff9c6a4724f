"""Export with past on hf-llama-past-tiny: the export stage's torch.onnx.export phase against
torch.onnx.export called directly on the same model and inputs (a plain wrapper building the
DynamicCache from flat tensors, as a user would write it), and the stage's other phases
(verification, generation check) as shares of the stage.

Alternating runs in one process (after one warm-up of each), so both see the same machine state;
recorded as ratios with min-max, with the machine's load average before and after (a shared 2-core
machine: the seconds move with the load). The warm-up stage's phases are recorded as `first_run`:
a user's export is its process's first, imports and first calls included.

Run: python bench/decoder_export.py     -> bench/results/decoder_export.json (about 3 minutes on 2 cores)
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "decoder_export.json"
PROFILE = "hf-llama-past-tiny"
REPEATS = 3


def ours(folder: Path) -> dict[str, float]:
    """The export stage's phases, timed by its status messages."""
    from pipeline.core.profiles import load_profile
    from pipeline.export import export_model

    marks: list[tuple[str, float]] = []
    started = time.perf_counter()
    export_model(load_profile(PROFILE), folder / "ours.onnx", exporter="dynamo", status=lambda text: marks.append((text, time.perf_counter())))
    ended = time.perf_counter()
    at = {text.split(" ")[0]: t for text, t in marks}
    return {"build": at["exporting"] - started, "export": at["verifying"] - at["exporting"],
            "verify": at["generation"] - at["verifying"], "generation": ended - at["generation"], "stage": ended - started}


def direct(folder: Path) -> float:
    """torch.onnx.export of the same model with the same example inputs and dims, called directly."""
    import torch
    from transformers import DynamicCache

    from pipeline.core.profiles import load_profile
    from pipeline.models.module import build_module, default_example

    module, _, _, profile = build_module(load_profile(PROFILE))
    model, example = module, default_example(profile)  # called through its class forward: the stage's binding is not used
    config, layers = model.config, model.config.num_hidden_layers

    class WithPast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=config)
            out = type(self.model).forward(self.model, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                           past_key_values=cache, use_cache=True)
            return (out.logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    dim = torch.export.Dim
    batch, seq, past_seq = dim("batch", min=1, max=4), dim("seq", min=1, max=128), dim("past_seq", min=0, max=128)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: dim.AUTO}, {0: batch, 1: seq}, tuple({0: batch, 2: past_seq} for _ in range(2 * layers)))
    started = time.perf_counter()
    program = torch.onnx.export(WithPast(), example, dynamo=True, opset_version=20, dynamic_shapes=shapes, optimize=False, verbose=False)
    program.save(str(folder / "direct.onnx"), external_data=False)
    return time.perf_counter() - started


def main() -> None:
    import warnings

    from pipeline.core.fileio import write_json

    warnings.simplefilter("ignore")
    machine = {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        first = ours(folder)  # warm-up: imports, first traces; recorded apart, a user's export is a process's first
        direct(folder)
        runs = []
        for _ in range(REPEATS):
            phases, plain = ours(folder), direct(folder)
            runs.append({**{k: round(v, 3) for k, v in phases.items()}, "direct": round(plain, 3)})
            print(runs[-1], flush=True)
    ratios = [r["export"] / r["direct"] for r in runs]
    shares = [r["generation"] / r["stage"] for r in runs]
    machine["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json(RESULTS, {"profile": PROFILE, "machine": machine, "first_run": {k: round(v, 3) for k, v in first.items()}, "runs": runs,
                         "export_vs_direct": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3), "max": round(max(ratios), 3)},
                         "generation_check_share_of_stage": {"median": round(statistics.median(shares), 3), "min": round(min(shares), 3),
                                                             "max": round(max(shares), 3)}})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
