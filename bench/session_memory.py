"""What an onnxruntime check session keeps after its runs, with and without the CPU arena (pipeline/core/verify.py
runs its sessions without it): the memory a session still holds after two runs of a batch, over the estimate of one
run's peak (pipeline/core/memory.py), and the runs' time with the arena over without it, in one process per setting.

The model: a stack of 3x3 Convs at 600x600 (EfficientNet's default size, where the FP16 stage was killed for memory),
batch 6. Ratios, not absolute figures, are the result: on this machine they hold whatever else runs beside.

Run: python bench/session_memory.py     -> bench/results/session_memory.json (about a minute)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "session_memory.json"
BATCH, SIZE, CHANNELS, CONVS = 6, 600, 16, 6

ONE_SETTING = r'''
import json, sys, time
import numpy as np
import onnxruntime as ort

path, arena, batch, size = sys.argv[1], sys.argv[2] == "arena", int(sys.argv[3]), int(sys.argv[4])

def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024

options = ort.SessionOptions()
options.log_severity_level = 3
options.enable_cpu_mem_arena = arena
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
feeds = {"x": np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)}
before, seconds = rss_mb(), []
for _ in range(3):
    started = time.perf_counter()
    outputs = session.run(None, feeds)
    seconds.append(time.perf_counter() - started)
    del outputs
print(json.dumps({"kept_mb": rss_mb() - before, "seconds": seconds}))
'''


def conv_stack(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.normal(0, 0.1, (CHANNELS, 3, 3, 3)).astype(np.float32), "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["h0"], pads=[1, 1, 1, 1])]
    for i in range(1, CONVS):
        initializers.append(numpy_helper.from_array(rng.normal(0, 0.1, (CHANNELS, CHANNELS, 3, 3)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [f"h{i - 1}", f"w{i}"], [f"h{i}"], pads=[1, 1, 1, 1]))
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", CHANNELS, SIZE, SIZE])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), str(path))


def main() -> None:
    sys.path.insert(0, str(REPO))
    from pipeline.core.memory import peak_activation_bytes

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "convs.onnx"
        conv_stack(path)
        estimate_mb = peak_activation_bytes(path, {"x": [BATCH, 3, SIZE, SIZE]}) / 2**20
        runs = {}
        for setting in ("arena", "no-arena"):
            done = subprocess.run([sys.executable, "-c", ONE_SETTING, str(path), setting, str(BATCH), str(SIZE)],
                                  capture_output=True, text=True, check=True)
            runs[setting] = json.loads(done.stdout)
    timed = {s: min(r["seconds"][1:]) for s, r in runs.items()}  # the first run plans the memory pattern
    results = {
        "model": f"{CONVS} 3x3 Convs, {CHANNELS} channels, {SIZE}x{SIZE}, batch {BATCH}",
        "estimate_of_one_run_mb": round(estimate_mb, 1),
        "kept_after_runs_over_estimate": {s: round(r["kept_mb"] / estimate_mb, 2) for s, r in runs.items()},
        "run_seconds_arena_over_no_arena": round(timed["arena"] / timed["no-arena"], 2),
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
