"""The model corpus: every Hugging Face architecture profile through `build --fp16 --int8 --fp8`, and
`build --int4` where it applies, with both exporters.

For each corpus profile (profiles/hf-*-tiny.toml: random weights from a config, nothing
downloaded) and each exporter, one whole `python -m pipeline build --fp16 --int8 --fp8` process in a
fresh folder, then `build --int4 --until int4` in the same folder (export and optimize cached; a
model without MatMul/Gemm weights records why INT4 does not apply), one after another (never two
at once on a shared machine). Recorded per run from the manifest: the result (or the one-line
error), export max_abs_diff and output names, nodes before/after optimize, the rewrites applied,
fp16/int8/fp8/int4 cosine_centered, Q/DQ pairs, lint findings per precision (each with the
justification below), seconds per stage and in total; and the load average before and after.

Run: python bench/models.py            -> bench/results/models.json (about 5 minutes on 2 cores)
     python bench/models.py --table    prints the docs/performance.md table from bench/results/models.json
     python bench/models.py --decoders -> the decoders (both cache forms, both exporters, through int8) into the same file
     python bench/models.py --decoder-table   prints docs/decoders.md's table
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "models.json"
CORPUS = ["hf-bert-tiny", "hf-distilbert-tiny", "hf-roberta-tiny", "hf-gpt2-tiny", "hf-llama-tiny", "hf-vit-tiny", "hf-resnet-tiny"]
EXPORTERS = ["dynamo", "torchscript"]
FUSIONS = ("fuse-layernorm", "fuse-gelu", "scale-before-attention-matmul", "split-to-sequence-as-split")

# Why each lint finding the corpus shows is what it says (a finding without an entry here is marked unjustified).
JUSTIFICATIONS = {
    "residual-skip-not-quantized": (
        "true by the rule: in these pre-LN blocks ModelOpt leaves the skip input of the residual Add (the residual stream: the "
        "embedding output or the previous block's sum, which also feeds the next norm) without Q/DQ while the GEMM side is INT8; "
        "presets only remove Q/DQ, never add them, so TensorRT cannot fuse that Add into the GEMM's INT8 epilogue"
    ),
}
MODEL_NOTES = {
    "hf-llama-tiny": (
        "RMSNorm, rotary and the SiLU-gated MLP stay written out (Pow/ReduceMean/Sqrt/Reciprocal/Mul; Slice/Neg/Concat/Mul/Add "
        "with Cos/Sin; Sigmoid/Mul): ONNX RMSNormalization and RotaryEmbedding are opset 23, the profiles export at opset <= 22, "
        "and which TensorRT versions import them is unchecked here (no TensorRT on this machine), so they are not emitted"
    ),
}


# The decoders (docs/decoders.md): each with its KV cache (the profile as written) and without (cache = "none", the
# cache inputs and past_seq removed), with both exporters. Run: python bench/models.py --decoders (merged into RESULTS).
DECODERS = ["hf-gpt2-past-tiny", "hf-llama-past-tiny", "hf-qwen2-tiny", "hf-phi3-tiny"]
CACHES = ["with-past", "none"]


def without_cache(text: str) -> str:
    """A with-past decoder profile's text as its cache = "none" form: no cache inputs, no past_seq, the mask over seq."""
    blocks = [b for b in text.split("\n\n") if "past_key_values." not in b and "[dims.past_seq]" not in b]
    return "\n\n".join(blocks).replace('"past_seq+seq"', '"seq"').replace('cache = "with-past"', 'cache = "none"')


def decoder_profile(name: str, cache: str, exporter: str, folder: Path) -> Path:
    target = corpus_profile(name, exporter, folder)
    if cache == "none":
        target.write_text(without_cache(target.read_text()))
    return target


def run_decoder(name: str, cache: str, exporter: str) -> dict:
    """One `build --fp16 --int8` of a decoder: the corpus record plus the generation check's figures per stage
    and its share of each stage's seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        profile = decoder_profile(name, cache, exporter, folder)
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pipeline", "build", "--profile", str(profile), "--fp16", "--int8", "--until", "int8",
                              "--out", str(folder / "out")], cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        manifest_path = folder / "out" / "manifest.json"
        stages = {s["name"]: s for s in json.loads(manifest_path.read_text())["stages"]} if manifest_path.is_file() else {}
    error = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    record = {"model": name, "cache": cache, "exporter": exporter, "passed": run.returncode == 0, "error": error[0] if error else None,
              "seconds_total": round(seconds, 2), "seconds": {k: round(s["seconds"], 2) for k, s in stages.items() if s["status"] == "done"}}
    done = {k: s["metrics"] for k, s in stages.items() if s["status"] == "done"}
    if "export" in done:
        record["export"] = {"nodes": done["export"]["nodes"], "max_abs_diff": done["export"]["max_abs_diff"],
                            "inputs": len([1 for _ in done["export"].get("checked_shapes", [{}])[0]])}
    if "optimize" in done:
        record["optimize"] = {"nodes_before": done["optimize"]["nodes_before"], "nodes_after": done["optimize"]["nodes_after"],
                              "applied": {r["rule"]: r["applied"] for r in done["optimize"]["rules"] if r["applied"]}}
    if "int8" in done:
        record["int8"] = {"qdq_pairs": done["int8"]["qdq_pairs"], "lint": done["int8"]["lint"]["count"], "cosine_centered": done["int8"]["accuracy"]["cosine_centered"]}
    record["generation"] = {}
    for stage, metrics in done.items():
        if "generation" in metrics:
            g = metrics["generation"]
            record["generation"][stage] = {"token_agreement": g["token_agreement"], "first_divergent_step": g["first_divergent_step"],
                                           "min_cosine_centered": g["min_cosine_centered"], "check_seconds": g["check_seconds"],
                                           "share_of_stage": round(g["check_seconds"] / max(stages[stage]["seconds"], 1e-9), 3)}
    return record


def decoder_table(results: dict) -> str:
    """docs/decoders.md's corpus table, rendered from the recorded decoder runs."""
    rows = ["| model | cache | exporter | result | nodes (optimize) | next-token agreement export / opt / fp16 / int8 | first step picking another token fp16 / int8 | "
            "Q/DQ | lint | s (export/opt/fp16/int8) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results.get("decoders", []):
        if not r["passed"]:
            rows.append(f"| {r['model']} | {r['cache']} | {r['exporter']} | fails: {(r['error'] or '').removeprefix('error: ')[:160]} | | | | | | |")
            continue
        g = r["generation"]
        agreement = " / ".join(f"{g[k]['token_agreement']:.0%}" for k in ("export", "optimize", "fp16", "int8"))
        divergent = " / ".join("none" if g[k]["first_divergent_step"] is None else str(g[k]["first_divergent_step"]) for k in ("fp16", "int8"))
        secs = "/".join(f"{r['seconds'].get(k, 0):.1f}" for k in ("export", "optimize", "fp16", "int8"))
        rows.append(f"| {r['model']} | {r['cache']} | {r['exporter']} | passes | {r['optimize']['nodes_before']} -> {r['optimize']['nodes_after']} | "
                    f"{agreement} | {divergent} | {r['int8']['qdq_pairs']} | {r['int8']['lint']} | {secs} |")
    return "\n".join(rows) + "\n"


def corpus_profile(name: str, exporter: str, folder: Path) -> Path:
    text = (REPO / "profiles" / f"{name}.toml").read_text()
    target = folder / f"{name}.toml"
    target.write_text(text.replace('exporter = "dynamo"', f'exporter = "{exporter}"'))
    return target


def run_one(name: str, exporter: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        profile = corpus_profile(name, exporter, folder)
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pipeline", "build", "--profile", str(profile), "--fp16", "--int8", "--fp8", "--out", str(folder / "out")],
                             cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        manifest_path = folder / "out" / "manifest.json"
        stages = {s["name"]: s for s in json.loads(manifest_path.read_text())["stages"]} if manifest_path.is_file() else {}
        # then INT4 on the same folder: its record only (the stages before it are cached there, their figures are the build's)
        int4 = subprocess.run([sys.executable, "-m", "pipeline", "build", "--profile", str(profile), "--int4", "--until", "int4", "--out", str(folder / "out")],
                              cwd=REPO, capture_output=True, text=True) if run.returncode == 0 else None
        if int4 is not None and int4.returncode == 0:
            stages["int4"] = next(s for s in json.loads(manifest_path.read_text())["stages"] if s["name"] == "int4")
        lint = json.loads((folder / "out" / "int8.lint.json").read_text()) if (folder / "out" / "int8.lint.json").is_file() else None
        fp8_lint = json.loads((folder / "out" / "fp8.lint.json").read_text()) if (folder / "out" / "fp8.lint.json").is_file() else None
        graph = graph_facts(folder / "out" / "model.opt.onnx") if (folder / "out" / "model.opt.onnx").is_file() else None
    error = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    record = {"model": name, "exporter": exporter, "passed": run.returncode == 0, "exit_code": run.returncode,
              "error": error[0] if error else None, "seconds_total": round(seconds, 2),
              "seconds": {k: round(s["seconds"], 2) for k, s in stages.items() if s["status"] == "done"}}
    if "export" in stages and stages["export"]["status"] == "done":
        m = stages["export"]["metrics"]
        record["export"] = {"max_abs_diff": m["max_abs_diff"], "outputs": m["outputs"], "nodes": m["nodes"]}
    if "optimize" in stages and stages["optimize"]["status"] == "done":
        m = stages["optimize"]["metrics"]
        record["optimize"] = {"nodes_before": m["nodes_before"], "nodes_after": m["nodes_after"], "max_abs_diff": m["max_abs_diff"],
                              "applied": {r["rule"]: r["applied"] for r in m["rules"] if r["applied"]},
                              "fusions": {r["rule"]: r["applied"] for r in m["rules"] if r["rule"] in FUSIONS and r["applied"]},
                              "op_delta": m["op_delta"], **(graph or {})}
    if "fp16" in stages and stages["fp16"]["status"] == "done":
        m = stages["fp16"]["metrics"]
        record["fp16"] = {"cosine_centered": m["accuracy"]["cosine_centered"], "max_abs_diff": m["accuracy"]["max_abs_diff"],
                          "runs_at_shapes": m["runs_at_shapes"], "placeholder_dims_repaired": m["placeholder_dims_repaired"]}
    if "int8" in stages and stages["int8"]["status"] == "done":
        m = stages["int8"]["metrics"]
        record["int8"] = {"cosine_centered": m["accuracy"]["cosine_centered"], "qdq_pairs": m["qdq_pairs"], "notes": m["notes"]}
    for precision in ("fp8", "int4"):
        if precision in stages and stages[precision]["status"] == "done":
            m = stages[precision]["metrics"]
            record[precision] = {"cosine_centered": m["accuracy"]["cosine_centered"], "method": m["method"], "opset": m["opset"],
                                 "quantize": m["qdq"]["quantize"], "dequantize": m["qdq"]["dequantize"], "notes": m["notes"]}
    if int4 is not None and int4.returncode != 0:
        why = [line for line in int4.stderr.splitlines() if line.startswith("error:")]
        record["int4"] = {"not_applied": why[0].removeprefix("error: ") if why else f"exit code {int4.returncode}"}
    if lint is not None:
        record["lint"] = [{"rule": f["rule"], "message": f["message"], "justification": JUSTIFICATIONS.get(f["rule"], "unjustified")}
                          for f in lint["findings"]]
    if fp8_lint is not None:
        record["fp8_lint"] = [{"rule": f["rule"], "message": f["message"], "justification": JUSTIFICATIONS.get(f["rule"], "unjustified")}
                              for f in fp8_lint["findings"]]
    if name in MODEL_NOTES:
        record["note"] = MODEL_NOTES[name]
    return record


def graph_facts(path: Path) -> dict:
    """What the optimized graph holds: op counts, and per attention (a MatMul reaching a Softmax
    through mask and scale ops) whether a Div/Mul scale sits after the MatMul."""
    from collections import Counter

    import onnx

    from pipeline.core.graph import GraphIndex

    model = onnx.load(str(path), load_external_data=False)
    graph = GraphIndex.of(model)
    attentions = after = 0
    for softmax in (n for n in graph.nodes if n.op_type == "Softmax"):
        node, scaled = graph.producer(softmax.input[0]), False
        while node is not None and node.op_type in ("Add", "Where", "Div", "Mul", "Sub"):
            scaled |= node.op_type in ("Div", "Mul")
            node = graph.producer(node.input[0])
        if node is not None and node.op_type == "MatMul":
            attentions += 1
            after += scaled
    return {"ops_after": dict(sorted(Counter(n.op_type for n in model.graph.node).items())),
            "attention_matmuls": attentions, "attention_scaled_after_matmul": after}


def _lint_cell(findings: list | None) -> str:
    if not findings:
        return "0"
    return f"{len(findings)} ({', '.join(sorted({f['rule'] for f in findings}))})"


def _low_precision_cells(r: dict) -> str:
    """The fp8 and int4 columns: cosine_centered and the FP8 lint, or why INT4 does not apply."""
    fp8 = f"{r['fp8']['cosine_centered']:.4f}" if "fp8" in r else "-"
    int4 = r.get("int4", {})
    int4_cell = f"{int4['cosine_centered']:.4f}" if "cosine_centered" in int4 else "n/a (no MatMul/Gemm weights)" if "no MatMul/Gemm" in int4.get("not_applied", "") else "-"
    return f" {fp8} | {_lint_cell(r.get('fp8_lint'))} | {int4_cell} |"


def table(results: dict) -> str:
    """The corpus table of docs/performance.md, rendered from the recorded results (the fp8/int4 columns once a run recorded them)."""
    low = any("fp8" in r for r in results["runs"])
    rows = ["| model | exporter | result | export diff | nodes (optimize) | LN / Gelu / attention scale (rewrites) | fp16 cos_c | int8 cos_c | Q/DQ | lint |"
            + (" fp8 cos_c | fp8 lint | int4 cos_c |" if low else "") + " s (export/opt/fp16/int8) |",
            "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if low else "") + "---|"]
    for r in results["runs"]:
        if not r["passed"]:
            rows.append(f"| {r['model']} | {r['exporter']} | fails: {(r['error'] or '').removeprefix('error: ')[:160]} | | | | | | | |" + (" | | |" if low else "") + " |")
            continue
        o = r["optimize"]
        scale = "no attention" if not o["attention_matmuls"] else "after MatMul" if o["attention_scaled_after_matmul"] else "before MatMul"
        rewrites = ", ".join(f"{k} {v}" for k, v in o["fusions"].items()) or "none"
        fusions = f"{o['ops_after'].get('LayerNormalization', 0)} / {o['ops_after'].get('Gelu', 0)} / {scale} ({rewrites})"
        lint = _lint_cell(r["lint"])
        secs = "/".join(f"{r['seconds'].get(k, 0):.1f}" for k in ("export", "optimize", "fp16", "int8"))
        rows.append(f"| {r['model']} | {r['exporter']} | passes | {r['export']['max_abs_diff']:.1e} | {r['optimize']['nodes_before']} -> "
                    f"{r['optimize']['nodes_after']} | {fusions} | {r['fp16']['cosine_centered']:.5f} | {r['int8']['cosine_centered']:.4f} | "
                    f"{r['int8']['qdq_pairs']} | {lint} |" + (_low_precision_cells(r) if low else "") + f" {secs} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    if sys.argv[1:] == ["--table"]:
        sys.stdout.write(table(json.loads(RESULTS.read_text())))
        return
    if sys.argv[1:] == ["--decoder-table"]:
        sys.stdout.write(decoder_table(json.loads(RESULTS.read_text())))
        return
    from pipeline.core.fileio import write_json

    if sys.argv[1:] == ["--decoders"]:
        results, load_before, decoders = json.loads(RESULTS.read_text()), os.getloadavg(), []
        for name in DECODERS:
            for cache in CACHES:
                for exporter in EXPORTERS:
                    print(f"{name} {cache} ({exporter}) ...", end=" ", flush=True)
                    decoders.append(run_decoder(name, cache, exporter))
                    print("passes" if decoders[-1]["passed"] else decoders[-1]["error"], f"({decoders[-1]['seconds_total']} s)", flush=True)
        results["decoders"] = decoders
        results["decoders_machine"] = {"load_average_before": load_before, "load_average_after": os.getloadavg()}
        write_json(RESULTS, results)
        print(f"wrote {RESULTS}")
        return

    load_before = os.getloadavg()
    runs = []
    for name in CORPUS:
        for exporter in EXPORTERS:
            print(f"{name} ({exporter}) ...", end=" ", flush=True)
            runs.append(run_one(name, exporter))
            print("passes" if runs[-1]["passed"] else runs[-1]["error"], f"({runs[-1]['seconds_total']} s)", flush=True)
    kept = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}  # the decoder runs (--decoders) stay
    results = {**kept, "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "load_average_before": load_before,
                                   "load_average_after": os.getloadavg(), "note": "2-core machine shared with other engineers; stage seconds are indicative"},
               "runs": runs}
    write_json(RESULTS, results)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
