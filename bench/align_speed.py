"""Benchmark: `compare` aligned by execution, on dynamo vs TorchScript exports.

In one run:
  (a) bert-base (12 x 768) exported by both exporters, traced at the profile's opt shape (1 x 128):
      the two traces (onnxruntime run with every result kept, plus fingerprints), the
      fingerprints alone, and the alignment with each pair judged (pipeline/diagnose/align.py), RUNS times;
      the memory the two traces hold (their arrays, weights included);
  (b) the alignment on encoders of 12 and of 48 layers (hidden 256 to keep the exports small: the
      alignment's cost follows the number of results, not their size), RUNS times each, and the
      ratio 48 / 12 (4 would be linear).
Medians with min-max. Run: python bench/align_speed.py -> bench/results/align_speed.json; a few minutes.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "align_speed.json"
RUNS = 3
TARGETS = {"align_seconds_bert_base": 2.0, "ratio_48_over_12_layers": 4.5}


def scaled_profile(layers: int, hidden: int, heads: int, ffn: int) -> str:
    text = (REPO / "profiles" / "bert-base.toml").read_text()
    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("ffn", ffn), ("mlp_hidden", hidden)):
        text = "\n".join(f"{key} = {value}" if line.startswith(f"{key} = ") else line for line in text.splitlines())
    return text.replace('name = "bert-base"', f'name = "bench-{layers}x{hidden}"')


def exports(profile_text: str, folder: Path, name: str):
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import make_inputs
    from pipeline.export import export_model

    (folder / f"{name}.toml").write_text(profile_text)
    profile = load_profile(str(folder / f"{name}.toml"))
    paths = [folder / f"{name}.{exporter}.onnx" for exporter in ("dynamo", "torchscript")]
    for exporter, path in zip(("dynamo", "torchscript"), paths):
        export_model(profile, path, exporter=exporter)
    return paths, make_inputs(profile, seed=30_000)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def measure(paths: list[Path], feeds: dict, workdir: Path, runs: int) -> dict:
    from pipeline.diagnose.align import aligned_rows
    from pipeline.diagnose.trace import fingerprint, trace_model

    trace_seconds, traces = zip(*(timed(lambda p=p: trace_model(p, feeds, workdir)) for p in paths))
    a, b = (t.steps for t in traces)
    fingerprint_seconds = timed(lambda: [fingerprint(s.value) for s in [*a, *b]])[0]
    align_seconds, rows = [], []
    for _ in range(runs):
        seconds, rows = timed(lambda: aligned_rows(a, b, False, 1e-4))
        align_seconds.append(seconds)
    marks = {mark: sum(1 for r in rows if r.mark == mark) for mark in "=~-+"}
    return {"results": [len(a), len(b)], "trace_seconds": [round(s, 3) for s in trace_seconds], "fingerprint_seconds": round(fingerprint_seconds, 3),
            "align_seconds": spread(align_seconds), "trace_mib": [round(t.nbytes / 2**20, 1) for t in traces], "rows": marks}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths, feeds = exports((REPO / "profiles" / "bert-base.toml").read_text(), folder, "bert-base")
        base = measure(paths, feeds, folder, RUNS)
        for path in paths:
            for leftover in folder.glob(f"*{path.stem}*"):
                leftover.unlink()
        by_layers = {}
        for layers in (12, 48):
            paths, feeds = exports(scaled_profile(layers, 256, 4, 1024), folder, f"l{layers}")
            by_layers[layers] = measure(paths, feeds, folder, RUNS)
    twelve, fortyeight = by_layers[12]["align_seconds"], by_layers[48]["align_seconds"]
    result = {
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "runs": RUNS, "targets": TARGETS,
        "bert_base": base,
        "layers": {str(k): v for k, v in by_layers.items()},
        "ratio_48_over_12_layers": {"median": round(fortyeight["median"] / twelve["median"], 2),  # range: the extremes of the two spreads
                                    "min": round(fortyeight["min"] / twelve["max"], 2), "max": round(fortyeight["max"] / twelve["min"], 2)},
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


def table(result: dict) -> str:
    """The results as a markdown table (for docs/performance.md)."""
    base, ratio = result["bert_base"], result["ratio_48_over_12_layers"]
    align = base["align_seconds"]
    return "\n".join([
        "| measure | value |", "|---|---|",
        f"| bert-base results traced (dynamo / TorchScript) | {base['results'][0]} / {base['results'][1]} |",
        f"| the two traces (onnxruntime run, every result kept, fingerprints) | {base['trace_seconds'][0]} s / {base['trace_seconds'][1]} s |",
        f"| of which fingerprints, both traces | {base['fingerprint_seconds']} s |",
        f"| alignment and judging, beyond the two traces | {align['median']} s ({align['min']}-{align['max']}) |",
        f"| memory of the two traces (weights included) | {base['trace_mib'][0]} MiB / {base['trace_mib'][1]} MiB |",
        f"| alignment, 48 / 12 layers (hidden 256) | {ratio['median']}x ({ratio['min']}-{ratio['max']}) |",
    ])


if __name__ == "__main__":
    main()
