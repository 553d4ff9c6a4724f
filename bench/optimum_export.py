"""Export of an encoder-decoder with past (issue 34): Optimum's `main_export` against ours, `build --until export`
(the encoder part's export, then the decoder part's), each a whole process, on the same weights.

A t5 of small config and a Whisper of whisper-tiny's sizes (transformers' WhisperConfig defaults: 4+4 layers, d_model
384, 51,865 tokens), random weights, are saved with save_pretrained into a temporary folder; both tools load that
folder. Our profiles are what `init --hf FOLDER` writes (the dynamo exporter), and the same with `exporter =
"torchscript"` (the exporter Optimum uses). Each round runs, per model, Optimum then ours (dynamo) then ours
(torchscript), so all see the same machine state; recorded: seconds per run, ours / Optimum per round (median, min,
max), and what each writes (file names, MiB, nodes, subgraphs' included).

Optimum needs transformers < 4.58 (optimum-onnx 0.1.0), this project 5.x: it runs in a venv of its own,
OPTIMUM_PYTHON (default /work/venv-optimum/bin/python), with this project's venv's site-packages after its own (a .pth
file), so both sides use the same torch, numpy and onnx:

    python -m venv /work/venv-optimum
    /work/venv-optimum/bin/pip install --no-deps optimum-onnx==0.1.0 optimum==2.1.0 transformers==4.57.6 \
        "huggingface_hub<1.0" "tokenizers>=0.22,<=0.23.0" requests charset_normalizer urllib3 certifi idna
    echo /work/venv/lib/python3.11/site-packages > /work/venv-optimum/lib/python3.11/site-packages/zz_shared.pth

Run: python bench/optimum_export.py [ROUNDS]   -> bench/results/optimum_export.json and its tables in docs/decoders.md
(3 rounds: about 8 minutes on 2 cores)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "optimum_export.json"
DOCS = REPO / "docs" / "decoders.md"
TABLE_START, TABLE_END = "<!-- optimum_export table start -->", "<!-- optimum_export table end -->"
TOOLS = ("optimum", "ours (dynamo)", "ours (torchscript)")
FOLDERS = {"optimum": "optimum", "ours (dynamo)": "dynamo", "ours (torchscript)": "torchscript"}  # each tool's output folder
OPTIMUM_PYTHON = os.environ.get("OPTIMUM_PYTHON", "/work/venv-optimum/bin/python")
MODELS = {  # name -> (our task, Optimum's task)
    "t5": ("seq2seq-lm", "text2text-generation-with-past"),
    "whisper-tiny": ("speech2seq-lm", "automatic-speech-recognition-with-past"),
}
OPTIMUM_EXPORT = "import sys\nfrom optimum.exporters.onnx import main_export\nmain_export(sys.argv[1], output=sys.argv[2], task=sys.argv[3])\n"


def save_models(folder: Path) -> dict[str, Path]:
    """Each model, random weights from a fixed seed, saved with save_pretrained under folder/<name>."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration, WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=2, num_decoder_layers=2, vocab_size=1000,
                                             decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    models = {"t5": t5, "whisper-tiny": WhisperForConditionalGeneration(WhisperConfig())}
    for name, model in models.items():
        model.save_pretrained(folder / name)
    return {name: folder / name for name in models}


def our_profiles(folder: Path, checkpoint: Path, task: str) -> dict[str, Path]:
    """`init --hf` on the checkpoint (as a user starts), and its copy with the TorchScript exporter."""
    dynamo = folder / f"{checkpoint.name}.toml"
    run([sys.executable, "-m", "pipeline", "init", "--hf", str(checkpoint), "--task", task, "-o", str(dynamo)], folder)
    text = dynamo.read_text(encoding="utf-8")
    assert 'exporter = "dynamo"' in text, "init writes the dynamo exporter"
    torchscript = folder / f"{checkpoint.name}-torchscript.toml"
    torchscript.write_text(text.replace('exporter = "dynamo"', 'exporter = "torchscript"'), encoding="utf-8")
    return {"ours (dynamo)": dynamo, "ours (torchscript)": torchscript}


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    """Seconds the command ran; its output kept for a failure."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return seconds


def optimum_environment() -> dict[str, str]:
    """The environment of Optimum's process: without this project on PYTHONPATH (its venv comes after Optimum's own)."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def describe(folder: Path) -> dict[str, dict]:
    """Each ONNX file under `folder`: MiB (external data included) and nodes (subgraphs' included)."""
    import onnx

    described = {}
    for path in sorted(folder.rglob("*.onnx")):
        model = onnx.load(str(path), load_external_data=False)
        data = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        described[str(path.relative_to(folder))] = {"mib": round(data / 2**20, 2), "nodes": count_nodes(model.graph)}
    return described


def count_nodes(graph) -> int:
    return sum(1 + sum(count_nodes(a.g) for a in node.attribute if a.g.node) for node in graph.node)


def one_round(folder: Path, round_index: int, checkpoints: dict[str, Path], profiles: dict[str, dict[str, Path]]) -> dict[str, dict[str, float]]:
    """Per model, each tool's export into folder/r<round>/<model>/<tool>, timed as a whole process."""
    seconds: dict[str, dict[str, float]] = {}
    for name, (_, optimum_task) in MODELS.items():
        out = folder / f"r{round_index}" / name
        out.mkdir(parents=True)
        seconds[name] = {"optimum": run([OPTIMUM_PYTHON, "-c", OPTIMUM_EXPORT, str(checkpoints[name]), str(out / "optimum"), optimum_task],
                                        folder, optimum_environment())}
        for tool, profile in profiles[name].items():
            target = out / FOLDERS[tool]
            seconds[name][tool] = run([sys.executable, "-m", "pipeline", "build", "--profile", str(profile), "--until", "export", "--out", str(target)], folder)
        print(round_index, name, {k: round(v, 2) for k, v in seconds[name].items()}, flush=True)
    return seconds


def summary(runs: list[dict[str, dict[str, float]]], name: str, tool: str) -> dict[str, float]:
    ratios = [r[name][tool] / r[name]["optimum"] for r in runs]
    return {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2), "max": round(max(ratios), 2)}


def versions() -> dict[str, str]:
    probe = "import optimum.version, optimum.exporters.onnx, transformers, torch, importlib.metadata as m; " \
            "print(m.version('optimum-onnx'), m.version('optimum'), transformers.__version__, torch.__version__)"
    found = subprocess.run([OPTIMUM_PYTHON, "-c", probe], capture_output=True, text=True, env=optimum_environment())
    if found.returncode != 0:
        raise SystemExit(f"Optimum does not import with {OPTIMUM_PYTHON}: {found.stderr.strip().splitlines()[-1:]}")
    import torch
    import transformers

    onnx_version, optimum_version, their_transformers, their_torch = found.stdout.split()
    return {"optimum-onnx": onnx_version, "optimum": optimum_version, "optimum_transformers": their_transformers, "optimum_torch": their_torch,
            "our_transformers": transformers.__version__, "our_torch": torch.__version__}


def main() -> None:
    from pipeline.core.fileio import write_json

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    record = {"versions": versions(), "machine": {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        checkpoints = save_models(folder)
        profiles = {name: our_profiles(folder, checkpoints[name], task) for name, (task, _) in MODELS.items()}
        runs = [one_round(folder, k, checkpoints, profiles) for k in range(rounds)]
        record["outputs"] = {name: {tool: describe(folder / "r0" / name / FOLDERS[tool]) for tool in TOOLS} for name in MODELS}
    record["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    record["runs"] = [{name: {tool: round(s, 2) for tool, s in by_tool.items()} for name, by_tool in r.items()} for r in runs]
    record["ours_over_optimum"] = {name: {tool: summary(runs, name, tool) for tool in ("ours (dynamo)", "ours (torchscript)")} for name in MODELS}
    write_json(RESULTS, record)
    write_docs(record)
    print(f"wrote {RESULTS} and its tables in {DOCS}")


def readme_table(results: dict) -> str:
    """Median seconds (min-max) and ours / Optimum per model, then what each tool writes."""
    lines = ["| model | Optimum s | ours, dynamo (`init`'s default) s | ours / Optimum | ours, torchscript s | ours / Optimum |", "|---|---|---|---|---|---|"]
    for name in MODELS:
        cells = []
        for tool in TOOLS:
            seconds = [r[name][tool] for r in results["runs"]]
            cells.append(f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})")
            if tool != "optimum":
                ratio = results["ours_over_optimum"][name][tool]
                cells.append(f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines += ["", "What each writes (ONNX file: nodes, subgraphs' included; MiB):", "",
              "| model | Optimum | ours, dynamo | ours, torchscript |", "|---|---|---|---|"]
    for name, by_tool in results["outputs"].items():
        files = [", ".join(f"{path.removesuffix('.onnx')} {f['nodes']:,} ({f['mib']:g})" for path, f in by_tool[tool].items()) for tool in TOOLS]
        lines.append(f"| {name} | {' | '.join(files)} |")
    return "\n".join(lines) + "\n"


def write_docs(results: dict, page: Path = DOCS) -> None:
    text = page.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    page.write_text(text[: start + len(TABLE_START)] + "\n" + readme_table(results) + text[end:])


if __name__ == "__main__":
    main()
