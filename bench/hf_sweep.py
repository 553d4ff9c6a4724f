"""The Hugging Face sweep: `init --hf MODEL_TYPE` then `build --fp16 --int8` on every model type `init`
supports in the installed transformers (each type a task of pipeline/models/hf.py's AUTO_CLASSES
maps; its base model where there is one), as a new user would run them: one `python -m pipeline`
process per command, its own --out in a temporary folder, one type after another.

Recorded per type in bench/results/hf_sweep.json: the task, each command's outcome (ok, refused:
exit 2 with one line, failed: a stage's check failed (exit 1, its line), internal: anything else), the one line of every refusal, each stage's status
and its line as the build printed it, and seconds. Runs merge into the file by type, so a sample
updates its types and keeps the others'; docs/models.md's sweep section is rendered from the file.

Run: python bench/hf_sweep.py --init-only         init on every type (minutes)
     python bench/hf_sweep.py                     init + build on every type (hours on 2 cores)
     python bench/hf_sweep.py --sample            init + build on SAMPLE
     python bench/hf_sweep.py --types gptj,swin   init + build on those types
     python bench/hf_sweep.py --docs-only         rewrite docs/models.md's section from the results file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "hf_sweep.json"
DOCS = REPO / "docs" / "models.md"
START, END = "<!-- hf_sweep table start -->", "<!-- hf_sweep table end -->"
# A fixed sample: the kinds issue 38 found broken (per-stage lists, per-layer lists, rotary dims,
# position offsets) and one plain encoder, decoder and vision model.
SAMPLE = ["bert", "gpt2", "vit", "gpt_neo", "gptj", "segformer", "convnext", "swin", "xlm-roberta", "mpnet"]
STAGES = ("export", "optimize", "fp16", "int8")
# the commit the rows of this run ran on (rows of earlier runs keep theirs; the first 128 rows have none: the file's `code` says)
COMMIT = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or "unknown"
INIT_SECONDS, BUILD_SECONDS = 360, 1800  # init refuses past its own budget (300 s, pipeline/models/trial.py); this is a backstop


def model_types() -> dict[str, str]:
    """{model_type: task} for every model type a task of AUTO_CLASSES maps, its first such task (base first); an
    encoder-decoder's generation task (seq2seq-lm, speech2seq-lm) over any other, since init builds only that."""
    import transformers

    from pipeline.core.profiles import ENCODER_DECODER_TASKS
    from pipeline.models.hf import AUTO_CLASSES

    types: dict[str, str] = {}
    for task, auto_class in AUTO_CLASSES.items():
        for model_type in getattr(transformers, auto_class)._model_mapping._model_mapping:
            if model_type not in types or (task in ENCODER_DECODER_TASKS and types[model_type] not in ENCODER_DECODER_TASKS):
                types[model_type] = task
    return dict(sorted(types.items()))


def pipeline_command(arguments: list[str], timeout: int) -> tuple[str, str, subprocess.CompletedProcess | None, float]:
    """Run `python -m pipeline ARGUMENTS`: its outcome (ok, refused: exit 2 with one line, failed: a stage's
    check failed, exit 1 with why, internal, timeout), the line that says why (empty when ok), the process and its seconds."""
    started = time.perf_counter()
    try:
        run = subprocess.run([sys.executable, "-m", "pipeline", *arguments], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout} s", None, time.perf_counter() - started
    seconds = time.perf_counter() - started
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    if run.returncode == 0:
        return "ok", "", run, seconds
    if run.returncode == 2 and errors and "Traceback" not in run.stderr:
        return "refused", errors[0].removeprefix("error: "), run, seconds
    if run.returncode == 1 and errors and "internal error" not in run.stderr and "Traceback" not in run.stderr:
        return "failed", errors[-1].removeprefix("error: "), run, seconds  # a stage's check (a gate) failed, with why
    tail = (errors or run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]
    return "internal", f"exit code {run.returncode}: {tail}", run, seconds


def sweep_one(model_type: str, task: str, build: bool, until: str = "int8") -> dict:
    """init then (when `build` and init wrote a profile) build --fp16 --int8 --until `until`, in a fresh folder."""
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / f"{model_type}.toml"
        status, line, _, seconds = pipeline_command(["init", "--hf", model_type, "--task", task, "-o", str(profile)], INIT_SECONDS)
        record = {"task": task, "commit": COMMIT, "init": {"status": status, "line": line, "seconds": round(seconds, 1)}}
        if not build or status != "ok":
            return record
        status, line, run, seconds = pipeline_command(["build", "--profile", str(profile), "--fp16", "--int8", "--until", until,
                                                       "--out", str(Path(tmp) / "out")], BUILD_SECONDS)
        record["build"] = {"status": status, "line": line, "seconds": round(seconds, 1), "until": until, "stages": _stages(Path(tmp) / "out", run)}
    return record


def _stages(out: Path, run: subprocess.CompletedProcess | None, part: str = "") -> dict[str, dict]:
    """Each stage's status and seconds from the manifest, with the line the build printed for it (`part`: the lines
    of that part of an encoder-decoder, which begin with its name). An encoder-decoder's stage is both parts' runs of
    it: "done", or "done/failed" (encoder/decoder) when they differ."""
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return {}
    data = json.loads(manifest.read_text())
    if "parts" in data:
        parts = [_stages(out / folder, run, name) for name, folder in data["parts"].items()]
        return {stage: {"status": "/".join(dict.fromkeys(p[stage]["status"] for p in parts if stage in p)),
                        "seconds": round(sum(p[stage]["seconds"] for p in parts if stage in p), 1),
                        "line": "; ".join(p[stage]["line"] for p in parts if p.get(stage, {}).get("line"))} for stage in dict.fromkeys(s for p in parts for s in p)}
    printed = {}
    for line in (run.stdout if run else "").splitlines():
        words = line.split()
        if part and words[:1] == [part]:
            words = words[1:]
        elif part:
            continue
        if words[:1] and words[0] in STAGES:
            printed[words[0]] = " ".join(words[2:])
    return {s["name"]: {"status": s["status"], "seconds": round(s["seconds"], 1), "line": printed.get(s["name"], "")} for s in data["stages"]}


def summary(runs: dict[str, dict]) -> dict[str, dict[str, int]]:
    """How many types each command left ok, refused, failed, internal or timed out."""
    counts: dict[str, dict[str, int]] = {"init": {}, "build": {}}
    for record in runs.values():
        for command in counts:
            if command in record:
                status = record[command]["status"]
                counts[command][status] = counts[command].get(status, 0) + 1
    return counts


def table(results: dict) -> str:
    """docs/models.md's sweep section: the counts, one row per built type, the init refusals folded."""
    runs, counts = results["runs"], summary(results["runs"])
    lines = [f"transformers {results['transformers']}: {len(runs)} model types swept of the {results['types_supported']} `init` supports. "
             + "; ".join(f"{command}: " + ", ".join(f"{n} {status}" for status, n in sorted(c.items())) for command, c in counts.items() if c) + ".", ""]
    code = results.get("code")
    if code:  # which commit the rows without their own ran on
        lines[0] += (f" Rows without a commit of their own ran at commit {code['commit']}; {', '.join(code['rerun_at']['types'])} rerun at "
                     f"{code['rerun_at']['commit']} ({code['rerun_at']['why']}); {code['since']}.")
    commits = [r["commit"] for r in runs.values() if "commit" in r]
    if commits:
        lines[0] += " " + ", ".join(f"{n} rows ran at {commit}" for commit, n in sorted(Counter(commits).items())) + "."
    built = {t: r for t, r in runs.items() if "build" in r}
    if built:
        lines += ["| model type | task | build | " + " | ".join(STAGES) + " | s (init + build) | why not |", "|---|---|---|" + "---|" * len(STAGES) + "---|---|"]
        for model_type, r in built.items():
            b = r["build"]
            cells = " | ".join(b["stages"].get(s, {}).get("status", "-") for s in STAGES)
            lines.append(f"| {model_type} | {r['task']} | {b['status']} | {cells} | {r['init']['seconds'] + b['seconds']:.0f} | {b['line'][:200]} |")
        lines.append("")
    refused = {t: r["init"] for t, r in runs.items() if r["init"]["status"] != "ok"}
    if refused:
        lines += [f"<details><summary>{len(refused)} types init does not write a profile for, and why</summary>", "",
                  "| model type | init | why |", "|---|---|---|"]
        lines += [f"| {t} | {r['status']} | {r['line'].replace('|', '/')[:240]} |" for t, r in refused.items()]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def write_docs(results: dict, page: Path = DOCS) -> None:
    text = page.read_text()
    start, end = text.index(START), text.index(END)
    page.write_text(text[: start + len(START)] + "\n" + table(results) + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", help="comma-separated model types (default: every type init supports)")
    parser.add_argument("--sample", action="store_true", help=f"the fixed sample: {', '.join(SAMPLE)}")
    parser.add_argument("--init-only", action="store_true", help="only init, no build")
    parser.add_argument("--until", default="int8", choices=STAGES, help="the last build stage")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results file (merged by type)")
    parser.add_argument("--docs-only", action="store_true", help="only rewrite docs/models.md's section from the results file")
    args = parser.parse_args()
    if args.docs_only:
        write_docs(json.loads(args.results.read_text()))
        return
    import transformers

    from pipeline.core.fileio import write_json

    supported = model_types()
    chosen = args.types.split(",") if args.types else SAMPLE if args.sample else list(supported)
    results = json.loads(args.results.read_text()) if args.results.is_file() else {"runs": {}}
    load_before = os.getloadavg()
    for model_type in chosen:
        record = sweep_one(model_type, supported.get(model_type, "base"), not args.init_only, args.until)
        results["runs"][model_type] = record
        outcome = record.get("build", record["init"])
        print(f"{model_type}: {'build' if 'build' in record else 'init'} {outcome['status']} ({outcome['seconds']} s) {outcome['line'][:160]}", flush=True)
    results.update({"transformers": transformers.__version__, "types_supported": len(supported),
                    "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "load_average_before": load_before,
                                "load_average_after": os.getloadavg(), "note": "2-core machine shared with other sessions; seconds are indicative"}})
    results["runs"] = dict(sorted(results["runs"].items()))
    write_json(args.results, results)
    if args.results == RESULTS:
        write_docs(results)
    print(f"wrote {args.results}: {summary(results['runs'])}")


if __name__ == "__main__":
    main()
