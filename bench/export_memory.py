"""The export stage's peak memory as a fixed part plus a factor of the FP32 weights: the model `pipeline/models/size.py`
uses to refuse a model before building it (EXPORT_MEMORY).

One process per exporter and size: torch, transformers, onnx and onnxruntime imported first (the baseline), then
`export_model` on a Llama with its cache at two sizes (29M parameters: 8 layers, hidden 512, GQA 8/4, vocab 8000; 174M:
12 layers, hidden 1024, GQA 16/8, vocab 32000). Per exporter, the line through the two (peak RSS - baseline) points:
its slope is the factor, its value at no weights the fixed part (torch's tracing, the session's arenas).

Run: python bench/export_memory.py     -> bench/results/export_memory.json (about 5 minutes)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "export_memory.json"
FACTORY = '''
from transformers import LlamaConfig, LlamaModel

SIZES = {
    "29m": dict(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4),
    "174m": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8),
}

def llama_29m():
    return LlamaModel(LlamaConfig(max_position_embeddings=256, **SIZES["29m"])).eval()

def llama_174m():
    return LlamaModel(LlamaConfig(max_position_embeddings=256, **SIZES["174m"])).eval()
'''
SIZES = ("29m", "174m")
PROFILE = '''name = "export-memory"
[model]
factory = "memory_model:llama_{size}"
[dims.batch]
min = 1
opt = 1
max = 2
[dims.seq]
min = 1
opt = 8
max = 32
[[inputs]]
name = "input_ids"
dtype = "int64"
shape = ["batch", "seq"]
range = [0, {vocab}]
'''
MEASURE = '''
import json, resource, sys
import onnx, onnxruntime, torch, transformers
from pathlib import Path
from pipeline.core.profiles import load_profile
from pipeline.export import export_model
from pipeline.models.module import build_module

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

baseline = rss()
folder = Path(sys.argv[1])
profile = load_profile(str(folder / "p.toml"))
export_model(profile, folder / "m.onnx", exporter=sys.argv[2])
peak = rss()
parameters = sum(p.numel() for p in build_module(profile)[0].parameters())
print(json.dumps({"exporter": sys.argv[2], "parameters": parameters, "weights_bytes": parameters * 4, "baseline_rss": baseline,
                  "peak_rss": peak, "factor": round((peak - baseline) / (parameters * 4), 2)}))
'''


def fit(runs: list[dict]) -> dict:
    """The line through an exporter's two (weights, peak - baseline) points: factor (its slope) and fixed bytes."""
    small, large = sorted(runs, key=lambda r: r["weights_bytes"])
    grown = (large["peak_rss"] - large["baseline_rss"]) - (small["peak_rss"] - small["baseline_rss"])
    factor = grown / (large["weights_bytes"] - small["weights_bytes"])
    fixed = small["peak_rss"] - small["baseline_rss"] - factor * small["weights_bytes"]
    return {"factor": round(factor, 2), "fixed_bytes": int(fixed)}


def main() -> None:
    from pipeline.core.fileio import write_json

    runs = []
    for exporter in ("dynamo", "torchscript"):
        for size, vocab in zip(SIZES, (8000, 32000), strict=True):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                (folder / "memory_model.py").write_text(FACTORY)
                (folder / "p.toml").write_text(PROFILE.replace("{size}", size).replace("{vocab}", str(vocab)))
                run = subprocess.run([sys.executable, "-c", MEASURE, str(folder), exporter], cwd=REPO, capture_output=True, text=True, check=True)
                runs.append({"size": size, **json.loads(run.stdout.strip().splitlines()[-1])})
                print(runs[-1], flush=True)
    fits = {exporter: fit([r for r in runs if r["exporter"] == exporter]) for exporter in ("dynamo", "torchscript")}
    write_json(RESULTS, {"runs": runs, "fits": fits})
    print(fits)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
