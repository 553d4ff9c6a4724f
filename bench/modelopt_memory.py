"""ModelOpt's peak memory over the bytes of the FP32 model it is given: the factors behind the check that fails a
precision stage before ModelOpt runs where it cannot fit (quant/__init__.py, MODELOPT_LEAST_PEAK).

Each step alone in a process, as the stage calls it, on the optimized model a build wrote:
  fp16  ModelOpt AutoCast (`convert_to_mixed_precision`, FP16, keep_io_types), fed the stage's reference feeds (an
        encoder has none: AutoCast's own random inputs, as in the stage)
  int8  ModelOpt `quantize(quantize_mode="int8")` with the stage's arguments (its preset's plan), fed its calibration
  int4  ModelOpt `quantize(quantize_mode="int4", awq_clip)`, fed the stage's calibration
  int4_rtn_dq  the same with `rtn_dq` (round to nearest, `[quant] int4_method = "rtn_dq"`): no search, less memory
The models, of the two kinds the check tells apart: a BERT-base encoder ("other": its published sizes, random
weights, batch up to 8, seq 128), and decoders with their KV cache, bench/sizes.py's direct runs of Qwen2 at
each size of its ladder that ran a step (bench/results/sizes.json; the 118M one's INT4 run takes half an hour here):
read from that file, not rerun; and a step the ladder does not run (INT4 round to nearest) measured here on a
ladder size built to its optimized model (`--decoder-sizes`). The factor: the process's peak RSS over the model's bytes (file and external data).
A factor falls as the model grows (ModelOpt's fixed part is spread over more weights), so the least over the sizes
measured is the largest size's: the check it sets refuses no model of that size that would fit. Ratios, not
absolute figures, are the result.

Run: python bench/modelopt_memory.py     -> bench/results/modelopt_memory.json and the table in docs/performance.md
     (about 30 minutes on 2 cores, most of it INT4's AWQ)
     python bench/modelopt_memory.py --decoders-only     the decoders' rows again after a ladder run, the encoder's kept
     python bench/modelopt_memory.py --steps int4_rtn_dq [--decoder-sizes 0.5b]   only those steps, on the encoder (or
     on those ladder sizes, built here: 0.5b in about 5 minutes), into the rows recorded
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "modelopt_memory.json"
SIZES = REPO / "bench" / "results" / "sizes.json"
DOCS = REPO / "docs" / "performance.md"
START, END = "<!-- modelopt_memory table start -->", "<!-- modelopt_memory table end -->"
STEPS = ("fp16", "int8", "int4", "int4_rtn_dq")
BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512)
PROFILE = """name = "bert-base"
[model]
task = "base"
[model.hf_config]
{config}

[dims.batch]
min = 1
opt = 4
max = 8

[dims.seq]
min = 1
opt = 128
max = 128

[[inputs]]
name = "input_ids"
dtype = "int64"
shape = ["batch", "seq"]
range = [0, 30522]

[[inputs]]
name = "attention_mask"
dtype = "int64"
shape = ["batch", "seq"]
range = [1, 2]
"""

STEP = '''
import json, re, resource, sys, time
from pathlib import Path
step, folder = sys.argv[1], Path(sys.argv[2])
manifest = json.loads((folder / "out" / "manifest.json").read_text())
optimized = folder / "out" / next(r for r in manifest["stages"] if r["name"] == "optimize")["outputs"]["onnx"]
import numpy as np
from pipeline.core.profiles import load_profile
from pipeline.core.samples import split
from pipeline.stages.shared import calibration, max_sequence
profile = load_profile(str(folder / "p.toml"))
if step == "fp16":
    from pipeline.models.decoder import autocast_feeds
    feeds = autocast_feeds(profile)  # None: an encoder, AutoCast's own random inputs
    if feeds is not None:
        np.savez(folder / "feeds.npz", **feeds)
    from modelopt.onnx.autocast import convert_to_mixed_precision
    convert_to_mixed_precision(onnx_path=str(optimized), low_precision_type="fp16", keep_io_types=True, providers=["cpu"],
                               calibration_data=None if feeds is None else str(folder / "feeds.npz"))
else:
    import onnx
    from modelopt.onnx.quantization import quantize
    from quant.calibration import calibration_reader
    from quant.presets import plan_preset, resolve_preset
    from quant.ptq import MODELOPT_ARGUMENTS
    data, batch, _ = calibration(profile, None, optimized)
    extra = {"calibration_method": "rtn_dq" if step == "int4_rtn_dq" else "awq_clip"}
    if step == "int8":
        model = onnx.load(str(optimized), load_external_data=False)
        plan = plan_preset(resolve_preset(profile.quant.preset, model), model, max_sequence(profile))
        extra = {"op_types_to_quantize": plan.op_types_to_quantize, "disable_mha_qdq": plan.disable_mha_qdq,
                 "nodes_to_exclude": [re.escape(n) + "$" for n in plan.nodes_to_exclude] or None,
                 **MODELOPT_ARGUMENTS, "high_precision_dtype": profile.quant.int8_float_dtype}  # ModelOpt's default, fp16, converts after: the stage does not
        del model
    quantize(onnx_path=str(optimized), quantize_mode=step.split("_")[0], calibration_data_reader=calibration_reader(split(data, batch), lambda *_: None),
             calibration_eps=["cpu"], calibrate_per_node=False, output_path=str(folder / "direct.onnx"), log_level="ERROR", **extra)
print(json.dumps({"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
'''


def measured_row(folder: Path, profile: str, name: str, kind: str, steps: tuple[str, ...]) -> dict:
    """A model's `steps`: `profile` built up to its optimized model in `folder`, then each step in a process of its own."""
    from pipeline.core.onnxfile import stored_bytes

    (folder / "p.toml").write_text(profile)
    subprocess.run([sys.executable, "-m", "pipeline", "build", "--profile", str(folder / "p.toml"), "--until", "optimize",
                    "--out", str(folder / "out")], cwd=REPO, check=True)
    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    optimized = folder / "out" / next(r for r in manifest["stages"] if r["name"] == "optimize")["outputs"]["onnx"]
    model_mb = stored_bytes(optimized) / 2**20
    measured = {}
    for step in steps:
        run = subprocess.run([sys.executable, "-c", STEP, step, str(folder)], cwd=REPO, capture_output=True, text=True)
        lines = run.stdout.strip().splitlines()
        if run.returncode or not lines:
            raise SystemExit(f"{name} {step}: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
        peak = json.loads(lines[-1])["peak_rss_mb"]
        measured[step] = {"peak_rss_mb": peak, "factor": round(peak / model_mb, 2)}
        print(name, step, measured[step], flush=True)
    return {"kind": kind, "source": "this benchmark", "model_mb": round(model_mb, 1), "steps": measured}


def encoder_profile() -> str:
    return PROFILE.format(config="\n".join(f"{key} = {json.dumps(value)}" for key, value in BERT_BASE.items()))


def decoder_rows() -> dict:
    """The Qwen2 decoders' direct steps, as bench/sizes.py recorded them at each size that ran one (FP32 weights:
    parameters x 4 bytes); a step the ladder did not run at a size (ModelOpt's INT8 and INT4 past this machine's
    memory) is left out of that size's row."""
    from quant import modelopt_step

    rows = {}
    for size, record in json.loads(SIZES.read_text())["sizes"].items():
        model_mb = record["parameters"] * 4 / 2**20
        method = record["stages"].get("int4", {}).get("int4_method", "awq_clip")  # the ladder's INT4 step: its size's method
        peaks = {modelopt_step(step, method) if step == "int4" else step: record["stages"][step]["direct"]["peak_rss_mb"] * 1e6 / 2**20
                 for step in ("fp16", "int8", "int4") if "peak_rss_mb" in record["stages"].get(step, {}).get("direct", {})}  # that file's MB, here MiB
        if size != "tiny" and peaks:  # tiny: a few MB of weights, ModelOpt's own footprint is all of its peak
            rows[f"qwen2-{size}"] = {"kind": "decoder", "source": f"bench/results/sizes.json ({size}, direct)", "model_mb": round(model_mb, 1),
                                     "steps": {step: {"peak_rss_mb": round(peak, 1), "factor": round(peak / model_mb, 2)} for step, peak in peaks.items()}}
    return rows


def table(results: dict) -> str:
    lines = ["| model | kind | FP32 model GB | AutoCast FP16 | INT8 calibration | INT4 AWQ | INT4 round to nearest | measured by |",
             "|---|---|---|---|---|---|---|---|"]
    for name, model in results["models"].items():
        cells = " | ".join(f"{model['steps'][step]['factor']:.1f}x ({model['steps'][step]['peak_rss_mb'] / 1024:.2f} GB)"
                           if step in model["steps"] else "not run" for step in STEPS)
        lines.append(f"| {name} | {model['kind']} | {model['model_mb'] / 1024:.2f} | {cells} | {model['source']} |")
    return "\n".join(lines) + "\n\nThe check's factor for a kind is the least over its models, rounded down.\n"


def write_docs(results: dict) -> None:
    text = DOCS.read_text()
    start, end = text.index(START), text.index(END)
    DOCS.write_text(text[: start + len(START)] + "\n" + table(results) + text[end:])


def merged(recorded: dict | None, row: dict) -> dict:
    """`row`'s steps over those `recorded` for the same model (a run of some steps keeps the others)."""
    return {**row, "steps": {**(recorded or {}).get("steps", {}), **row["steps"]}} if recorded else row


def main() -> None:
    import argparse
    import os
    import platform

    sys.path.insert(0, str(REPO / "bench"))
    from sizes import SIZES, profile_text

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoders-only", action="store_true",
                        help="keep the encoder's row from the results file (its run takes half an hour) and read the decoders' again")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}: measured, the others' kept")
    parser.add_argument("--decoder-sizes", default="", help=f"comma-separated, of {', '.join(SIZES)}: build these ladder sizes and measure "
                                                            "--steps on them (the encoder's row kept)")
    args = parser.parse_args()
    steps = tuple(args.steps.split(","))
    if unknown := set(steps) - set(STEPS):
        raise SystemExit(f"--steps: {', '.join(sorted(unknown))}: use some of {', '.join(STEPS)}")
    recorded = json.loads(RESULTS.read_text()).get("models", {}) if RESULTS.is_file() else {}
    sizes = [size for size in args.decoder_sizes.split(",") if size]
    if args.decoders_only or sizes:
        if "bert-base" not in recorded:
            raise SystemExit(f"--decoders-only: {RESULTS} has no bert-base row to keep; run without --decoders-only first")
        encoder = recorded["bert-base"]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            encoder = merged(recorded.get("bert-base"), measured_row(Path(tmp), encoder_profile(), "bert-base", "other", steps))
    built = {name: row for name, row in recorded.items() if row["kind"] == "decoder" and row["source"] == "this benchmark"}
    for size in sizes:
        name = f"qwen2-{size} (built here)"
        with tempfile.TemporaryDirectory() as tmp:
            built[name] = merged(built.get(name), measured_row(Path(tmp), profile_text(size), name, "decoder", steps))
    models = {"bert-base": encoder, **decoder_rows(), **built}
    least = {kind: {step: min(m["steps"][step]["factor"] for m in models.values() if m["kind"] == kind and step in m["steps"]) for step in STEPS
                    if any(step in m["steps"] for m in models.values() if m["kind"] == kind)}
             for kind in dict.fromkeys(m["kind"] for m in models.values())}
    results = {"benchmark": __doc__.split("\n\n")[0], "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "models": models, "least_factor": least}
    from pipeline.core.fileio import write_json

    write_json(RESULTS, results)
    write_docs(results)
    print(json.dumps(least))


if __name__ == "__main__":
    main()
