"""The size ladder: one decoder family (Qwen2, random weights from its published configs) at four sizes
through the stages of `build --fp16 --int8 --int4`, each stage's seconds and peak RSS beside the same step
done by the library called directly, right after it (each stage is built with `--until` it, the stages before
it cached), at the same size:

| stage    | the library called directly                                                        |
|----------|------------------------------------------------------------------------------------|
| export   | `torch.onnx.export(dynamo=True)` of the model without its cache, saved with external data |
| optimize | `onnx.load` + `onnx.save` of the exported model (external data as needed)           |
| fp16     | ModelOpt AutoCast (`convert_to_mixed_precision`, FP16, keep_io_types) of the optimized model, fed the stage's reference feeds |
| int8     | ModelOpt `quantize(quantize_mode="int8")` with the stage's arguments (its preset's plan), fed its calibration steps (prefill and decode on real caches) |
| int4     | ModelOpt `quantize(quantize_mode="int4")` with the size's method (`INT4_METHOD`) fed the stage's calibration feeds |

The direct calls get the feeds the stages make (made before their clock starts): fed its own random
data, AutoCast's reference run fails on a decoder with a cache (the mask does not match past_seq + seq:
onnxruntime's GatherND "invalid index"), and INT8 entropy calibration on random caches fails
("Too many bins for data range").

Each build and each direct step runs in a process of its own; peak RSS is that process's (the build's
per stage: the manifest's `peak_rss_mb`). A direct step's seconds leave out its imports and the feeds
it is given (a stage's include its lazy imports, a few seconds in the first stage that needs torch or ModelOpt). What ours adds over the direct call is what the stage checks
(torch vs onnxruntime, generation, accuracy gates, lint): the ratio says what that costs.

Run: python bench/sizes.py [--sizes tiny,0.1b] [--until STAGE] [--results FILE] [--docs-only]
     -> bench/results/sizes.json, bench/results/sizes.png, the table in docs/performance.md
Sizes merge into the results file by name, so a large size can be run alone on a larger machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "sizes.json"
PLOT = REPO / "bench" / "results" / "sizes.png"
DOCS = REPO / "docs" / "performance.md"
TABLE_START, TABLE_END = "<!-- sizes table start -->", "<!-- sizes table end -->"
STAGES = ("export", "optimize", "fp16", "int8", "int4")
PRECISIONS = STAGES[2:]

QWEN2 = dict(model_type="qwen2", vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0)
SIZES = {  # Qwen2.5's published configs (0.5B, 1.5B); tiny and 0.1b scaled down in the same shape
    "tiny": dict(QWEN2, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256),
    "0.1b": dict(QWEN2, hidden_size=512, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2),
    "0.5b": dict(QWEN2, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
    "1.5b": dict(QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
}
DIMS = {"batch": (1, 1, 2), "seq": (1, 32, 64), "past_seq": (0, 32, 64)}  # small: the ladder measures weights, not activations
# AWQ's clip search runs the model per weight group: 30 minutes at 0.1b here, hours from 0.5B; those sizes round to nearest
INT4_METHOD = {"tiny": "awq_clip", "0.1b": "awq_clip", "0.5b": "rtn_dq", "1.5b": "rtn_dq"}

DIRECT = '''
import json, re, resource, sys, time
from pathlib import Path
step, folder = sys.argv[1], Path(sys.argv[2])
manifest = json.loads((folder / "out" / "manifest.json").read_text())
outputs = {r["name"]: r.get("outputs", {}) for r in manifest["stages"]}
exported = folder / "out" / outputs["export"]["onnx"]
if step not in ("export", "optimize"):  # ModelOpt's INT8 call rewrites the model it is given: the build's stays the build's
    import shutil
    given = folder / "out" / outputs["optimize"]["onnx"]
    copy = folder / "direct_input"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for part in (given, given.with_name(given.name + ".data")):
        if part.is_file():
            shutil.copy2(part, copy / part.name)
    optimized = copy / given.name
if step == "export":  # the model is built inside the clock, as in the stage's seconds
    import torch, transformers
    from pipeline.core.profiles import load_profile
    from pipeline.models.hf import load_hf_model
    started = time.perf_counter()
    model = load_hf_model(load_profile(str(folder / "p.toml")))
    model.config.use_cache = False
    ids = torch.ones(1, 32, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", max=2), torch.export.Dim("seq", max=64)
    program = torch.onnx.export(model, (), kwargs={"input_ids": ids, "attention_mask": ids}, dynamo=True,
                                dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    program.save(str(folder / "direct.onnx"), external_data=True)
elif step == "optimize":
    import onnx
    started = time.perf_counter()
    model = onnx.load(str(exported))  # past 2 GB protobuf cannot even size the whole model: sum its weights
    onnx.save(model, str(folder / "direct.onnx"), save_as_external_data=sum(t.ByteSize() for t in model.graph.initializer) > 2**31 - 1)
else:  # fed what the stage feeds (a decoder's mask must match its cache: random library feeds fail), made before the clock starts
    import numpy as np
    import onnx
    from pipeline.core.profiles import load_profile
    from pipeline.models.decoder import apply_derived, autocast_feeds
    from quant.calibration import calibration_reader, decoder_calibration
    export = next(r for r in manifest["stages"] if r["name"] == "export")
    profile = apply_derived(load_profile(str(folder / "p.toml")), export["metrics"].get("derived_inputs"))
    if step == "fp16":
        np.savez(folder / "feeds.npz", **autocast_feeds(profile))
        from modelopt.onnx.autocast import convert_to_mixed_precision
        started = time.perf_counter()
        model = convert_to_mixed_precision(onnx_path=str(optimized), low_precision_type="fp16", keep_io_types=True, providers=["cpu"],
                                           calibration_data=str(folder / "feeds.npz"))
        onnx.save(model, str(folder / "direct.onnx"), save_as_external_data=model.ByteSize() > 2**31 - 1)
    else:  # the arguments the stage passes (its preset's plan for INT8), planned before the clock starts
        from pipeline.core.samples import split
        from pipeline.stages.shared import calibration, max_sequence
        from quant.presets import plan_preset, resolve_preset
        from quant.ptq import MODELOPT_ARGUMENTS
        if step == "int8":
            feeds = decoder_calibration(profile, optimized, profile.quant.samples).feeds
            model = onnx.load(str(optimized), load_external_data=False)
            plan = plan_preset(resolve_preset(profile.quant.preset, model), model, max_sequence(profile))
            extra = {"op_types_to_quantize": plan.op_types_to_quantize, "disable_mha_qdq": plan.disable_mha_qdq,
                     **MODELOPT_ARGUMENTS, "high_precision_dtype": profile.quant.int8_float_dtype,  # ModelOpt's default, fp16, adds a conversion the stage does not run
                     "nodes_to_exclude": [re.escape(n) + "$" for n in plan.nodes_to_exclude] or None}
        else:
            data, batch, _ = calibration(profile, None, optimized)
            feeds, extra = split(data, batch), {"calibration_method": profile.quant.int4_method}
        from modelopt.onnx.quantization import quantize
        from pipeline.core.onnxfile import external_tensors
        extra["use_external_data_format"] = bool(external_tensors(onnx.load(str(optimized), load_external_data=False)))  # as the stage
        started = time.perf_counter()
        quantize(onnx_path=str(optimized), quantize_mode=step, calibration_data_reader=calibration_reader(feeds, lambda *_: None),
                 calibration_eps=["cpu"], calibrate_per_node=False, output_path=str(folder / "direct.onnx"), log_level="ERROR", **extra)
print(json.dumps({"seconds": round(time.perf_counter() - started, 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, 1)}))  # MB, as the manifest's
'''


def profile_text(size: str) -> str:
    config = "\n".join(f"{key} = {json.dumps(value)}" for key, value in SIZES[size].items())
    dims = "\n".join(f"[dims.{name}]\nmin = {low}\nopt = {opt}\nmax = {high}\n" for name, (low, opt, high) in DIMS.items())
    return (f'name = "qwen2-{size}"\n[model]\ntask = "causal-lm"\n[model.hf_config]\n{config}\n\n{dims}\n'
            f'[[inputs]]\nname = "input_ids"\ndtype = "int64"\nshape = ["batch", "seq"]\nrange = [0, {SIZES[size]["vocab_size"]}]\n'
            f'\n[quant]\nint4_method = "{INT4_METHOD[size]}"\n')


def parameters(size: str) -> int:
    """The model's parameter count, from a model on the meta device (no memory)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**SIZES[size])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def run_size(size: str, folder: Path, until: str = STAGES[-1]) -> dict:
    """The build's stages up to `until` and each direct step, at one size: each stage built (`--until` it, the stages
    before it cached) and its direct step run right after it, so a drift of the shared host's speed falls on both
    sides of a ratio alike (all of ours, then all direct calls, put 25 minutes between the two sides at 0.5B)."""
    (folder / "p.toml").write_text(profile_text(size))
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    record = {"parameters": parameters(size), "config": SIZES[size], "stages": {}}
    for step in STAGES[: STAGES.index(until) + 1]:
        precision = [f"--{step}"] if step in PRECISIONS else []  # only its own: a failed one is not rerun by the next build
        command = [sys.executable, "-m", "pipeline", "build", "--profile", str(folder / "p.toml"), *precision, "--until", step,
                   "--out", str(folder / "out")]
        build = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        print(build.stdout, build.stderr, sep="", flush=True)
        record["build_rc"] = build.returncode
        manifest = folder / "out" / "manifest.json"
        stages = {r["name"]: r for r in json.loads(manifest.read_text())["stages"]} if manifest.is_file() else {}
        if step not in stages:
            break  # the build stopped before it (its error is in the output above)
        stage = stages[step]
        record["stages"][step] = {"status": stage["status"], "seconds": stage["seconds"], "peak_rss_mb": stage.get("peak_rss_mb"),
                                  "reason": stage.get("reason", "")[:300], **({"int4_method": INT4_METHOD[size]} if step == "int4" else {})}
        if record["stages"].get("optimize", {}).get("status") != "done" and step != "export":
            break
        direct = subprocess.run([sys.executable, "-c", DIRECT, step, str(folder)], cwd=REPO, capture_output=True, text=True)
        lines = direct.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if direct.returncode == 0 and lines else {"error": (direct.stderr.strip().splitlines() or ["?"])[-1][:300]}
        record["stages"][step]["direct"] = result
        print(size, step, record["stages"][step], flush=True)
    record["run_seconds"] = round(time.perf_counter() - started, 1)  # the builds and the direct steps
    if until != STAGES[-1]:
        record["until"] = until  # the stages after it were not asked for (a machine with too little memory for ModelOpt's)
    record["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]  # a shared machine: what else ran beside
    record["cpus"] = os.cpu_count()
    return record


def readme_table(results: dict) -> str:
    lines = ["| size | parameters | stage | status | ours s | direct s | ours / direct | ours peak RSS GB | direct peak RSS GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size, record in results["sizes"].items():
        for stage, row in record["stages"].items():
            direct = row.get("direct", {})
            ratio = f"{row['seconds'] / direct['seconds']:.1f}x" if "seconds" in direct and row.get("seconds") else ""
            lines.append(f"| {size} | {record['parameters'] / 1e6:,.1f}M | {stage} | {row.get('status', 'not run')} | {row.get('seconds', '')} | "
                         f"{direct.get('seconds', direct.get('error', ''))} | {ratio} | {_gb(row.get('peak_rss_mb'))} | {_gb(direct.get('peak_rss_mb'))} |")
    loads = [f"{size} {r['load_average'][0]}-{r['load_average'][1]} on {r['cpus']} CPUs" for size, r in results["sizes"].items() if "load_average" in r]
    note = f"\nLoad average (1 min) before and after each size, the machine shared with other work: {', '.join(loads)}.\n" if loads else ""
    return "\n".join(lines) + "\n" + note


def _gb(mb: float | None) -> str:
    return f"{mb / 1000:.2f}" if mb else ""


def plot(results: dict, path: Path = PLOT) -> None:
    """Seconds and peak RSS per stage against parameters, ours and direct."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results["sizes"].values(), key=lambda r: r["parameters"])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for stage in STAGES:
        rows = [(r["parameters"] / 1e6, r["stages"][stage]) for r in sizes if stage in r["stages"] and "seconds" in r["stages"][stage]]
        for axis, field in zip(axes, ("seconds", "peak_rss_mb"), strict=True):
            line, = axis.plot([p for p, _ in rows], [row[field] for _, row in rows], marker="o", label=stage)
            direct = [(p, row["direct"][field]) for p, row in rows if field in row.get("direct", {})]
            axis.plot([p for p, _ in direct], [v for _, v in direct], marker="x", linestyle="--", color=line.get_color())
    for axis, label in zip(axes, ("seconds", "peak RSS (MB)"), strict=True):
        axis.set(xscale="log", yscale="log", xlabel="parameters (M)", ylabel=label)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(title="ours (solid), direct (dashed)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def write_docs(results: dict, page: Path = DOCS) -> None:
    text = page.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    page.write_text(text[: start + len(TABLE_START)] + "\n" + readme_table(results) + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--until", default=STAGES[-1], choices=STAGES,
                        help="the last stage built and measured (e.g. optimize for 0.5b and 1.5b on a machine ModelOpt's steps do not fit)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--docs-only", action="store_true", help="only rewrite the docs table and plot from the results file")
    args = parser.parse_args()
    results = json.loads(args.results.read_text()) if args.results.is_file() else {"sizes": {}}
    if not args.docs_only:
        from pipeline.core.fileio import write_json

        for size in args.sizes.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                results["sizes"][size] = run_size(size, Path(tmp), args.until)
            results["sizes"] = dict(sorted(results["sizes"].items(), key=lambda item: item[1]["parameters"]))
            write_json(args.results, results)
    if args.results == RESULTS:
        plot(results)
        write_docs(results)


if __name__ == "__main__":
    main()
