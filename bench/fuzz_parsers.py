"""Fuzz run at scale: the mutation strategy of tests/test_parsers_malformed.py over every real TensorRT file,
plus crafted inputs aimed at super-linear parsing (the quadratic regexes issue 10 found) and a 20 MB file.

For each input: parse it as layer information, build the report and render it in every format, diff it
against the file it was mutated from, and parse it as a trtexec profile. Counted: inputs, foreign exceptions (anything not a PipelineError), inputs over
3 s, the slowest input. Hypothesis generates (no shrinking, no example database: every run is new);
a foreign exception is recorded with the fixture, the exception and a short repr of the input.
Run: python bench/fuzz_parsers.py [--examples 10000]  -> bench/results/fuzz_parsers.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_parsers_malformed import FIXTURES, mutate  # noqa: E402

from pipeline.core.errors import PipelineError  # noqa: E402
from trt.diff import build_diff  # noqa: E402
from trt.parsers import parse_layer_info, parse_timing  # noqa: E402
from trt.render import FORMATS, render  # noqa: E402
from trt.report import build_report  # noqa: E402

DATA = REPO / "tests" / "data" / "trt"
LIMIT_SECONDS = 3.0


def crafted() -> dict[str, bytes]:
    """Inputs built to make a backtracking or quadratic parser slow (sizes as in the issue: 48-256 KB lines,
    a 612 KB log of one repeated line, a 20 MB file)."""
    oneline = (DATA / "trt10.16_engineinspector_oneline_fp16_2profiles.log").read_bytes().split(b"\n")
    layer_line = next(line for line in oneline if line.startswith(b"Name: node_linear_myl5_2"))
    names_line = next(line for line in (DATA / "trt82_swin_tiny_int8_T4_builder_layers.log").read_bytes().split(b"\n") if line.startswith(b"Layer(Myelin)"))
    profile = (DATA / "trt852_namesonly_yolo_qdq_int8.profile.json").read_bytes()
    real_json = (DATA / "trt10.16_detailed_mnist_myelin.layers.json").read_bytes()
    return {
        "Name: x256K without LayerType": b"Name: " * 43_000,
        "Name: a, LayerType: k + ', Key: v' x200K": b"Name: a, LayerType: k" + b", Key: v" * 25_000,
        "[ONNX Layer: x256K unclosed": b"Name: a, LayerType: k, Metadata: " + b"[ONNX Layer: " * 20_000,
        "Layer(X): with 'a (' x128K": b"Layer(X): n, Tactic: 0, " + b"a (" * 43_000,
        "Layer(X): 8.2 tensors x48K": b"Layer(X): n, Tactic: 0, " + b"t[Half(1,2)], " * 3_500 + b"-> o",
        "profile: unclosed names x128K": b'[\n{ "name" : "' * 10_000,
        "profile: name repeated": b'[\n{ "name" : "' + b'a", "timeMs" : 1, ' * 6_000 + b"\n",
        "polygraphy head with a 256K name": b"    Layer 0    | " + b"[Op: " * 50_000 + b"\n",
        "PWN( nested x20K": b'{"Layers": ["' + b"PWN(" * 20_000 + b'"]}',
        "612 KB log: one layer line repeated": layer_line + b"\n" + (names_line + b"\n") * (612_000 // len(names_line)),
        "20 MB: one-line log, layer line repeated": (layer_line + b"\n") * (20_000_000 // len(layer_line)),
        "20 MB: profile records repeated": profile[:2] + profile[2:-2] * (20_000_000 // len(profile)) + b"\n]",
        "20 MB: JSON with one 20 MB string": b'{"Layers": [{"Name": "' + b"a" * 20_000_000 + b'", "LayerType": "k"}]}',
        "real JSON, 20 MB of nesting": real_json[:100] + b"[" * 20_000_000,
    }


def run_one(path: Path, original: Path | None = None) -> tuple[float, str | None]:
    """The slowest command's seconds (`report -f FMT` for each format: parse + report + render; `diff` against
    the file it was mutated from; `--timing`: the profile parse) and the foreign exception (None when only our
    errors, or none, were raised)."""
    foreign, commands = None, [0.0]
    try:
        started = time.perf_counter()
        try:
            report = build_report(parse_layer_info(path))
            parsed = time.perf_counter() - started
            for fmt in FORMATS:
                started = time.perf_counter()
                render(report, fmt)
                commands.append(parsed + time.perf_counter() - started)
            if original is not None:
                started = time.perf_counter()
                diff = build_diff(parse_layer_info(original), parse_layer_info(path))
                for fmt in FORMATS:
                    render(diff, fmt)
                commands.append(time.perf_counter() - started)
        except PipelineError:
            commands.append(time.perf_counter() - started)
        started = time.perf_counter()
        try:
            parse_timing(path)
        except PipelineError:
            pass
        commands.append(time.perf_counter() - started)
    except Exception as err:  # noqa: BLE001 - what this script exists to find
        foreign = f"{type(err).__name__}: {str(err)[:200]}"
    return max(commands), foreign


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=10_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    results = {"inputs": 0, "foreign_exceptions": [], "over_limit": [], "slowest": {"seconds": 0.0, "input": None}}

    def record(label: str, seconds: float, foreign: str | None) -> None:
        results["inputs"] += 1
        if foreign:
            results["foreign_exceptions"].append({"input": label, "exception": foreign})
        if seconds > LIMIT_SECONDS:
            results["over_limit"].append({"input": label, "seconds": round(seconds, 3)})
        if seconds > results["slowest"]["seconds"]:
            results["slowest"] = {"seconds": round(seconds, 4), "input": label}

    crafted_times = {}
    for label, data in crafted().items():
        path = folder / ("crafted.json" if data.startswith((b"{", b"[")) else "crafted.log")
        path.write_bytes(data)
        seconds, foreign = run_one(path)
        crafted_times[label] = {"bytes": len(data), "seconds": round(seconds, 3), "foreign_exception": foreign}
        record(f"crafted: {label}", seconds, foreign)
        print(f"{label}: {len(data)} bytes, {seconds:.3f} s" + (f", {foreign}" if foreign else ""), flush=True)

    @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def fuzz(data):
        name = data.draw(st.sampled_from(FIXTURES))
        mutated = mutate(data, (DATA / name).read_bytes())
        path = folder / ("fuzz" + (".json" if name.endswith(".json") else ".log"))
        path.write_bytes(mutated)
        seconds, foreign = run_one(path, None if name.endswith(".profile.json") else DATA / name)
        record(f"mutated {name} ({len(mutated)} bytes): {mutated[:80]!r}...", seconds, foreign)

    started = time.perf_counter()
    fuzz()
    result = {
        "benchmark": "fuzz: mutations of every real TensorRT file + crafted inputs; parse, report, render in every format, parse as profile",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "limit_seconds": LIMIT_SECONDS,
        "mutated_inputs": results["inputs"] - len(crafted_times),
        "crafted_inputs": crafted_times,
        "inputs": results["inputs"],
        "foreign_exceptions": len(results["foreign_exceptions"]),
        "foreign_exception_examples": results["foreign_exceptions"][:20],
        "inputs_over_limit": len(results["over_limit"]),
        "over_limit_examples": results["over_limit"][:20],
        "slowest": results["slowest"],
        "fuzz_seconds": round(time.perf_counter() - started, 1),
    }
    out = REPO / "bench" / "results" / "fuzz_parsers.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "crafted_inputs"}, indent=2))


if __name__ == "__main__":
    main()
