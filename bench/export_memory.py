"""The export stage's peak memory over the FP32 weights: the factor `pipeline/models/size.py` uses to
refuse a model before building it (EXPORT_MEMORY_FACTOR).

One process per exporter: torch, transformers, onnx and onnxruntime imported first (the baseline),
then `export_model` on a 29M-parameter Llama (8 layers, hidden 512, GQA 8/4, vocab 8000) with its
cache; the factor is (peak RSS - baseline) / FP32 weight bytes.

Run: python bench/export_memory.py     -> bench/results/export_memory.json (about a minute)
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

def llama():
    return LlamaModel(LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)).eval()
'''
PROFILE = '''name = "export-memory"
[model]
factory = "memory_model:llama"
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
range = [0, 8000]
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


def main() -> None:
    from pipeline.core.fileio import write_json

    runs = []
    for exporter in ("dynamo", "torchscript"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "memory_model.py").write_text(FACTORY)
            (folder / "p.toml").write_text(PROFILE)
            run = subprocess.run([sys.executable, "-c", MEASURE, str(folder), exporter], cwd=REPO, capture_output=True, text=True, check=True)
            runs.append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    write_json(RESULTS, {"runs": runs, "max_factor": max(r["factor"] for r in runs)})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
