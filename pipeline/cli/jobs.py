"""`jobs`: benchmark a matrix of models x precisions x shapes x backends x builder settings x GPU types,
here (`run`), one cell at a time (`cell`, what a cluster pod runs), as Kubernetes Indexed Jobs (`k8s`),
and gather the cells into one report (`gather`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.cli.app import app, choices, console, emit, output_format, stdout_console

jobs_app = typer.Typer(
    help=("GPU benchmark jobs over a matrix (TOML: profiles/matrix-cpu.toml, profiles/matrix-gpu.toml). Every cell is "
          "`python -m pipeline jobs cell MATRIX --index N --out RESULTS`; trt and ort-cuda cells are recorded skipped "
          "(with the Docker command) where there is no GPU. See docs/jobs.md.\n\n"
          "Examples:\n\n"
          "  python -m pipeline jobs plan profiles/matrix-cpu.toml\n\n"
          "  python -m pipeline jobs run profiles/matrix-cpu.toml --out results\n\n"
          "  python -m pipeline jobs gather results -o report.html"),
    no_args_is_help=True,
)
app.add_typer(jobs_app, name="jobs")

MatrixArgument = Annotated[Path, typer.Argument(help="The matrix .toml.")]
OutOption = Annotated[Path, typer.Option("--out", help="Results folder: cells/<id>.json, logs/, artifacts/.")]
PlanFormat = choices("PlanFormat", ("text", "json"))
GatherFormat = choices("GatherFormat", ("html", "json", "md"))


def _plan(matrix_path: Path):
    from pipeline.jobs.plan import plan
    from pipeline.jobs.spec import load_matrix

    matrix = load_matrix(matrix_path)
    return matrix, plan(matrix)


@jobs_app.command("plan", help="List the matrix's cells: index, stable id, GPU type and what each runs.")
def plan_command(
    matrix_path: MatrixArgument,
    format: Annotated[PlanFormat, typer.Option("--format", "-f", help="Output format.")] = PlanFormat.text,
) -> None:
    matrix, cells = _plan(matrix_path)
    missing = _missing_transformers(matrix)
    note = f"note: {missing}; `jobs run` fails their cells here without it" if missing else None
    if format is PlanFormat.json:  # stdout stays the cell list; the note goes to stderr
        emit(json.dumps([{"index": c.index, "id": c.id, "label": c.label, **c.definition()} for c in cells], indent=2) + "\n", None, is_json=True)
        if note:
            console.print(note, highlight=False, markup=False, soft_wrap=True)
        return
    groups = sorted({c.gpu for c in cells})
    lines = [f"{matrix.name}: {len(cells)} cell{'s' * (len(cells) != 1)} ({len(groups)} GPU type{'s' * (len(groups) != 1)}: {', '.join(groups)})"]
    lines += [f"{c.index:>4}  {c.id}  {c.label}" for c in cells]
    emit("\n".join(lines + ([note] if note else [])) + "\n", None)


def _missing_transformers(matrix) -> str | None:
    """The line saying the matrix's transformers models cannot build here (not installed), said before the run; None where they can."""
    from pipeline.jobs.spec import profile_of
    from pipeline.models.hf import transformers_missing

    names = sorted({profile.name for profile in (profile_of(matrix, entry) for entry in matrix.models) if profile.model.is_hf})
    return transformers_missing(f"model{'s' * (len(names) > 1)} {', '.join(names)} (model.hf/hf_config)") if names else None


@jobs_app.command("run", help="Run every cell here, in order, each as its own process; resumable (done cells are kept unless --force).")
def run_command(matrix_path: MatrixArgument, out: OutOption, force: Annotated[bool, typer.Option(help="Rerun cells already done.")] = False) -> None:
    from rich.progress import Progress

    from pipeline.core.errors import StageFailed
    from pipeline.jobs.runner import run_all

    matrix, cells = _plan(matrix_path)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=len(cells))

        def on_cell(cell, status: str, reason: str | None) -> None:
            progress.update(task, advance=1, description=f"cell {cell.index + 1}/{len(cells)}")
            why = f": {reason}" if reason and status in ("skipped", "failed") else ""
            progress.console.print(f"{cell.index:>4} {cell.id} {status:<12} {cell.label}{why}", highlight=False, markup=False, soft_wrap=True)

        counts = run_all(matrix, cells, out, force=force, on_cell=on_cell)
    stdout_console().print(", ".join(f"{n} {status}" for status, n in counts.items()) + f"; cells in {out / 'cells'}", highlight=False, markup=False)
    if counts["failed"]:
        raise StageFailed(f"{counts['failed']} cell(s) failed; their reasons are in {out / 'cells'} (jobs gather lists them); rerun to retry them")


@jobs_app.command("cell", help="Run one cell (what `jobs run` and each Kubernetes pod run) and write RESULTS/cells/<id>.json.")
def cell_command(
    matrix_path: MatrixArgument,
    out: OutOption,
    index: Annotated[int, typer.Option("--index", envvar="JOB_COMPLETION_INDEX", help="The cell's index (a pod: its completion index).")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Count --index within this GPU type's cells (one Indexed Job per GPU type).")] = None,
) -> None:
    from pipeline.core.errors import StageFailed
    from pipeline.jobs.cell import run_cell
    from pipeline.jobs.plan import select

    matrix, cells = _plan(matrix_path)
    cell = select(cells, index, gpu)
    record = run_cell(matrix, cell, out)
    line = f"{cell.id} {record['status']}: {cell.label}" + (f" ({record['reason']})" if record["reason"] else "")
    stdout_console().print(line, highlight=False, markup=False)
    if record["status"] == "failed":
        raise StageFailed(f"cell {cell.index} ({cell.id}) failed: {record['reason']}")


@jobs_app.command("k8s", help="Write Kubernetes manifests: a ConfigMap with the matrix and one Indexed Job per GPU type (-o), and the gather Job beside it (<name>.gather.yaml).")
def k8s_command(
    matrix_path: MatrixArgument,
    output: Annotated[Path, typer.Option("--output", "-o", help="The cell Jobs' YAML.")],
    parallelism: Annotated[Optional[int], typer.Option(min=1, help="Pods at once per Job [default: the matrix's [cluster] parallelism].")] = None,
) -> None:
    from pipeline.core.fileio import check_outputs, write_text
    from pipeline.jobs.k8s import manifests, to_yaml

    matrix, cells = _plan(matrix_path)
    gather_path = output.with_name(output.name.removesuffix(".yaml").removesuffix(".yml") + ".gather.yaml")
    check_outputs([output, gather_path], [matrix_path])
    jobs, gather = manifests(matrix, cells, parallelism)
    label = f"trt-pipeline/matrix={matrix.name}"
    write_text(output, to_yaml(jobs, f"trt-pipeline jobs of matrix {matrix.name}: {len(cells)} cells.\nkubectl apply -f {output.name}\n"
                                      f"kubectl wait --for=condition=complete --timeout=24h job -l {label}\nthen: kubectl apply -f {gather_path.name}"))
    write_text(gather_path, to_yaml(gather, f"Gathers matrix {matrix.name}'s cells into report.html; apply once its cell Jobs completed."))
    indexed = [d for d in jobs if d["kind"] == "Job"]
    stdout_console().print(f"wrote {output} ({len(indexed)} Indexed Job(s): "
                           + ", ".join(f"{d['metadata']['name']} x{d['spec']['completions']}" for d in indexed) + f") and {gather_path}", highlight=False, markup=False)


@jobs_app.command("gather", help="One report of the cells in RESULTS folders; with --baseline, exit 1 naming every cell slower than --max-slowdown.")
def gather_command(
    results: Annotated[list[Path], typer.Argument(help="Results folders (jobs run/cell --out).")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    format: Annotated[Optional[GatherFormat], typer.Option("--format", "-f", help="[default: from -o's suffix, else md]")] = None,
    baseline: Annotated[Optional[list[Path]], typer.Option(help="Results of an earlier run of the same matrix to compare with.")] = None,
    max_slowdown: Annotated[str, typer.Option(help="With --baseline: the p50 growth allowed per cell.")] = "5%",
) -> None:
    from pipeline.core.errors import StageFailed
    from pipeline.jobs.gather import compare, gather, parse_slowdown, render_html, render_md

    allowed = parse_slowdown(max_slowdown)
    kind = GatherFormat(output_format(format.value if format else None, output, tuple(f.value for f in GatherFormat), default="md",
                                      inputs=list(results) + list(baseline or [])))
    result = gather(results)
    slow = compare(result, gather(baseline), allowed) if baseline else None
    if kind is GatherFormat.json:
        emit(json.dumps({**result, "slow": slow}, indent=1) + "\n", output, is_json=True)
    else:
        emit((render_html if kind is GatherFormat.html else render_md)(result, slow), output)
    if slow:
        raise StageFailed(f"{len(slow)} cell(s) slower than the baseline by more than {max_slowdown}: "
                          + "; ".join(f"{r['id']} {r['label']} {r['change']:+.1%}" for r in slow))
