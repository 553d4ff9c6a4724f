"""`python -m pipeline ...`: the command-line interface (typer + rich).

Only light modules are imported here; each command imports its stage's heavy
dependencies (torch, onnxruntime, modelopt, tensorrt) when it runs.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from pipeline import __version__
from pipeline.errors import PipelineError
from pipeline.profiles import DEFAULT_PROFILE

app = typer.Typer(
    name="pipeline",
    help=(
        "PyTorch/ONNX -> TensorRT deployment pipeline with fusion reports.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build                      # default profile bert-tiny\n\n"
        "  python -m pipeline build --profile bert-base --until export\n\n"
        "  python -m pipeline export --exporter torchscript -o bert.onnx"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(stderr=True)


def stdout_console() -> Console:
    """Rich output on stdout; 140 columns when piped so tables and paths are not cut."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=140)
_debug = False


class Exporter(str, Enum):
    dynamo = "dynamo"
    torchscript = "torchscript"


class StageName(str, Enum):
    export = "export"


ProfileOption = Annotated[
    str, typer.Option("--profile", "-p", help="Profile name (profiles/NAME.toml) or path to a .toml file.")
]


def _version(value: bool) -> None:
    if value:
        print(f"trt-pipeline {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    global _debug
    _debug = debug


@app.command(
    help=(
        "Run the pipeline stages for a profile into OUT (default artifacts/<profile>), "
        "recording each in OUT/manifest.json. Unchanged stages are reported `cached`.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build\n\n"
        "  python -m pipeline build --profile my_model.toml --out runs/a --force\n\n"
        "  python -m pipeline build --onnx model.onnx --profile bert-tiny"
    )
)
def build(
    profile: ProfileOption = DEFAULT_PROFILE,
    onnx: Annotated[Optional[Path], typer.Option(help="Start from this ONNX file instead of exporting.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder [default: artifacts/<profile>].")] = None,
    until: Annotated[Optional[StageName], typer.Option(help="Stop after this stage.")] = None,
    strict: Annotated[bool, typer.Option(help="Fail (exit 3) instead of skipping a stage this machine cannot run.")] = False,
    force: Annotated[bool, typer.Option(help="Rerun stages even when cached.")] = False,
) -> None:
    from pipeline.manifest import Manifest
    from pipeline.profiles import load_profile
    from pipeline.runner import Context, Runner
    from pipeline.stages import build_plan

    loaded = load_profile(profile)
    out_dir = out or Path("artifacts") / loaded.name
    manifest = Manifest.load_or_new(out_dir / "manifest.json", loaded.name)
    ctx = Context(loaded, out_dir, manifest, {"onnx": onnx})
    Runner(ctx, stdout_console(), force=force, strict=strict).run(build_plan(ctx), until=until.value if until else None)


@app.command(
    help=(
        "Export the profile's PyTorch model to ONNX and verify it against torch on onnxruntime (CPU).\n\n"
        "Examples:\n\n"
        "  python -m pipeline export -o model.onnx\n\n"
        "  python -m pipeline export --profile bert-tiny --exporter torchscript -o bert_ts.onnx"
    )
)
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="ONNX file to write.")],
    profile: ProfileOption = DEFAULT_PROFILE,
    exporter: Annotated[
        Optional[Exporter], typer.Option(help="Override the profile's exporter [default: from the profile].")
    ] = None,
) -> None:
    from pipeline.export import export_model
    from pipeline.profiles import load_profile

    loaded = load_profile(profile)
    if loaded.model.factory is None:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file (model.onnx); there is nothing to export")
    with console.status(f"exporting {loaded.name}") as spinner:
        result = export_model(loaded, output, exporter.value if exporter else None, status=spinner.update)
    stdout_console().print(
        f"wrote {output}: {result.nodes} nodes, {result.exporter} exporter, opset {result.opset}, "
        f"max_abs_diff vs torch {result.max_abs_diff:.2e}",
        highlight=False,
    )


def main() -> None:
    """Entry point: one line and the error's exit code for a PipelineError, unless --debug.

    Usage errors (unknown option, missing argument) are typer's: a message and exit 2.
    """
    try:
        app()
    except PipelineError as err:
        if _debug:
            raise
        console.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
