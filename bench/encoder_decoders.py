"""The encoder-decoder corpus: each packaged encoder-decoder profile (profiles/hf-{t5,bart,marian,whisper}-tiny.toml:
random weights from a small config, nothing downloaded) through one whole `build --fp16 --int8 --until int8` process
in a fresh folder, one after another. Recorded per model from the part manifests and the top-level one: the
result (or the one-line error), each part's nodes before/after optimize and seconds per stage, the decoder part's
next-token agreement with torch's greedy tokens per stage (each stage's model fed torch's tokens) and how many distinct tokens torch's reference decodes per row, INT8 Q/DQ pairs and lint findings per part, and the end-to-end
agreement (encoder and decoder files of one precision, OUT/manifest.json); and the load average.

Run: python bench/encoder_decoders.py          -> bench/results/encoder_decoders.json, the table in docs/decoders.md
     python bench/encoder_decoders.py --table  rewrites the table from the results file
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "encoder_decoders.json"
DOCS = REPO / "docs" / "decoders.md"
TABLE_START, TABLE_END = "<!-- encoder-decoder table: python bench/encoder_decoders.py -->", "<!-- end of encoder-decoder table -->"
MODELS = ["hf-t5-tiny", "hf-bart-tiny", "hf-marian-tiny", "hf-whisper-tiny"]
PARTS = ("encoder", "decoder")
STAGES = ("export", "optimize", "fp16", "int8")


def run_model(name: str) -> dict:
    """One `build --fp16 --int8 --until int8` of an encoder-decoder profile, read back from its manifests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "pipeline", "build", "--profile", name, "--fp16", "--int8", "--until", "int8", "--out", str(out)],
                             cwd=REPO, capture_output=True, text=True)
        record = {"model": name, "passed": run.returncode == 0, "seconds_total": round(time.perf_counter() - started, 1),
                  "error": next((line for line in run.stderr.splitlines() if line.startswith("error:")), None), "parts": {}}
        for part in PARTS:
            manifest = out / part / "manifest.json"
            stages = {s["name"]: s for s in json.loads(manifest.read_text())["stages"]} if manifest.is_file() else {}
            record["parts"][part] = _part_record(stages)
        reference = out / "decoder" / "model.generation.npz"
        if reference.is_file():  # a check on one token repeated proves less than one on varied tokens
            import numpy as np

            record["distinct_tokens_per_row"] = [len(set(row.tolist())) for row in np.load(reference)["tokens"]]
        top = out / "manifest.json"
        checks = json.loads(top.read_text()).get("generation", []) if top.is_file() else []
        record["end_to_end"] = {c["precision"]: c["metrics"]["token_agreement"] for c in checks if "token_agreement" in c.get("metrics", {})}
    return record


def _part_record(stages: dict[str, dict]) -> dict:
    done = {name: s["metrics"] for name, s in stages.items() if s["status"] in ("done", "cached")}
    record = {"status": {name: stages[name]["status"] for name in STAGES if name in stages},
              "seconds": {name: round(stages[name]["seconds"], 2) for name in STAGES if name in stages}}
    if "optimize" in done:
        record["nodes"] = [done["optimize"]["nodes_before"], done["optimize"]["nodes_after"]]
    if "int8" in done:
        record["int8"] = {"qdq_pairs": done["int8"]["qdq_pairs"], "lint": done["int8"]["lint"]["count"]}
    record["tokens"] = {name: m["generation"]["token_agreement"] for name, m in done.items() if "generation" in m}
    return record


def readme_table(results: dict) -> str:
    rows = ["| model | result | nodes encoder / decoder (optimize) | decoder next tokens export / opt / fp16 / int8 | end to end fp32 / fp16 / int8 | "
            "torch's distinct tokens per row | INT8 Q/DQ pairs encoder / decoder | s (whole build) |", "|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        encoder, decoder = r["parts"]["encoder"], r["parts"]["decoder"]
        result = "passes" if r["passed"] else f"fails: {(r['error'] or '').removeprefix('error: ')[:120]}"
        nodes = " / ".join(f"{p['nodes'][0]} -> {p['nodes'][1]}" if "nodes" in p else "-" for p in (encoder, decoder))
        tokens = " / ".join(f"{decoder['tokens'][s]:.0%}" if s in decoder["tokens"] else "-" for s in STAGES)
        e2e = " / ".join(f"{r['end_to_end'][p]:.0%}" if p in r["end_to_end"] else "-" for p in ("fp32", "fp16", "int8"))
        qdq = " / ".join(str(p["int8"]["qdq_pairs"]) if "int8" in p else "-" for p in (encoder, decoder))
        distinct = ", ".join(map(str, r.get("distinct_tokens_per_row", []))) or "-"
        rows.append(f"| {r['model']} | {result} | {nodes} | {tokens} | {e2e} | {distinct} | {qdq} | {r['seconds_total']} |")
    load = results["machine"]["load_average"]
    return "\n".join(rows) + f"\n\nLoad average (1 min) {load[0]}-{load[1]} on {results['machine']['cpus']} CPUs shared with other work.\n"


def write_docs(results: dict) -> None:
    text = DOCS.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    DOCS.write_text(text[: start + len(TABLE_START)] + "\n" + readme_table(results) + text[end:])


def main() -> None:
    if sys.argv[1:] != ["--table"]:
        from pipeline.core.fileio import write_json

        before, runs = os.getloadavg()[0], []
        for name in MODELS:
            print(f"{name} ...", end=" ", flush=True)
            runs.append(run_model(name))
            print("passes" if runs[-1]["passed"] else runs[-1]["error"], f"({runs[-1]['seconds_total']} s)", flush=True)
        machine = {"cpus": os.cpu_count(), "load_average": [round(before, 1), round(os.getloadavg()[0], 1)]}
        write_json(RESULTS, {"machine": machine, "runs": runs})
    write_docs(json.loads(RESULTS.read_text()))


if __name__ == "__main__":
    main()
