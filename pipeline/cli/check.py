"""Commands that check models: lint-qdq (Q/DQ placement), compare (where two models diverge)."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from pipeline.cli.app import app, console, emit, output_format
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.diagnose.compare import Alignment, NodeComparison
    from pipeline.diagnose.divergence import ExportersComparison, TorchComparison


@app.command(
    name="lint-qdq",
    help=(
        "List the Q/DQ placements in an ONNX model (ours or anyone's) that TensorRT's rules say prevent a fusion, "
        "with the nodes and the change to make.\n\n"
        "Examples:\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx --format json -o lint.json\n\n"
        "  python -m pipeline lint-qdq model.int8.onnx --fail-on-findings   # CI: exit 1 when there are findings"
    ),
)
def lint_qdq(
    model: Annotated[Path, typer.Argument(help="ONNX model with QuantizeLinear/DequantizeLinear nodes.")],
    fmt: Annotated[Optional[str], typer.Option("--format", "-f", help="text or json [default: from -o's suffix, else text].")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    max_sequence: Annotated[Optional[int], typer.Option(help="Longest sequence the engine will see (for the attention rule).")] = None,
    fail_on_findings: Annotated[bool, typer.Option("--fail-on-findings", help="Exit 1 when there are findings (for CI) [default: exit 0].")] = False,
) -> None:
    from quant.lint import findings_json, lint_file

    fmt = output_format(fmt, output, ("text", "json"), inputs=[model])
    findings = lint_file(model, max_sequence)
    if fmt == "json":
        emit(json.dumps(findings_json(findings), indent=2) + "\n", output, is_json=True)
    else:
        lines = [f"{model}: {len(findings)} finding{'s' if len(findings) != 1 else ''}" + ("" if findings or _has_qdq(model) else
                 "; it has no QuantizeLinear/DequantizeLinear node, so there was nothing to check: lint its quantized model "
                 "(python -m pipeline quantize MODEL -o OUT --int8 --profile YOURS writes one)")]
        for finding in findings:
            lines += [f"[{finding.rule}] {finding.message}", f"    fix: {finding.suggestion}", f"    nodes: {', '.join(finding.nodes)}"]
        emit("\n".join(lines) + "\n", output)
    if fail_on_findings and findings:
        raise typer.Exit(1)


def _has_qdq(model: Path) -> bool:
    from pipeline.core.graph import QDQ_OPS
    from pipeline.core.onnxfile import load_onnx

    return any(node.op_type in QDQ_OPS for node in load_onnx(model).graph.node)


@app.command(
    help=(
        "Find where two executions of one network part: A (the reference) and B run with every intermediate tensor "
        "exposed, listing the nodes where the error grows most (which Q/DQ or FP16 conversion costs accuracy), each "
        "with the torch module it came from. With --torch, A is the profile's torch model and B the ONNX file: "
        "every submodule is compared with the ONNX tensor it maps to, in the order the modules run, and the first "
        "over the export tolerance is named. Inputs: --inputs FILE.npz (one array per input, samples stacked on its batch axis, axis 0 for most models) or "
        "synthetic samples from --profile.\n\n"
        "Examples:\n\n"
        "  python -m pipeline compare model.opt.onnx model.int8.onnx --profile bert-tiny\n\n"
        "  python -m pipeline compare a.onnx b.onnx --inputs feeds.npz --format json -o divergence.json\n\n"
        "  python -m pipeline compare --torch model.onnx --profile bert-tiny --dump modules/\n\n"
        "When the two models do not share tensor names (two exporters, an optimizer's rewrite, two opsets) or with "
        "--align, both run once with every result kept and the two executions are aligned: one row per pair, "
        "`=` equal, `~` same role with different values, `-` only in A, `+` only in B, the first line naming the "
        "first row where values part (docs/compare.md).\n\n"
        "  python -m pipeline compare dynamo.onnx torchscript.onnx --profile hf-llama-tiny\n\n"
        "  python -m pipeline compare model.opt.onnx model.fp16.onnx --profile bert-tiny --align --format html -o compare.html"
    )
)
def compare(
    reference: Annotated[Optional[Path], typer.Argument(help="A: the reference model (usually FP32); with --torch, the ONNX file to check.")] = None,
    candidate: Annotated[Optional[Path], typer.Argument(help="B: the model to check (FP16, INT8, ...); not with --torch.")] = None,
    torch_model: Annotated[bool, typer.Option("--torch", help="Compare the ONNX file with the profile's torch model, module by module.")] = False,
    exporters: Annotated[bool, typer.Option("--exporters", help="Export --profile's model with both exporters (in a temporary folder), compare each with torch module by module and the two with each other by alignment.")] = False,
    inputs: Annotated[Optional[Path], typer.Option(help="Inputs .npz: one array per model input, samples stacked on its batch axis, axis 0 for most models.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile to draw synthetic inputs from (with --torch: the model) [default: the one the build's manifest records (the ONNX file's folder); with --torch, else bert-tiny].")] = None,
    samples: Annotated[int, typer.Option(min=1, max=256, help="Synthetic samples (with --profile).")] = 4,
    top: Annotated[int, typer.Option(min=1, help="Nodes to list.")] = 15,
    dump: Annotated[Optional[Path], typer.Option(help="With --torch: write each module's inputs and outputs to DIR/<module>.npz.")] = None,
    align: Annotated[bool, typer.Option("--align", help="Align the two executions even when the models share tensor names.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Aligned: print every row [default: the rows where the graphs part, with one around each].")] = False,
    nodes: Annotated[Optional[str], typer.Option(help="Aligned: keep only the results of nodes whose name, op or module matches this regex.")] = None,
    max_trace_mb: Annotated[Optional[float], typer.Option(min=1, help="Aligned: refuse to run when keeping every result needs more memory than this [default: 4096].")] = None,
    tolerance: Annotated[Optional[float], typer.Option(min=0, help="Aligned: max |B-A| / max |A| under which a pair is equal [default: by precision, fp32 1e-4, fp16 2e-2, int8 0.1].")] = None,
    fmt: Annotated[Optional[str], typer.Option("--format", "-f", help="text, json or html: the same comparison and verdict in each [default: from -o's suffix, else text].")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    from pipeline.artifacts import recorded_profile
    from pipeline.core.onnxfile import load_onnx
    from pipeline.diagnose.render import FORMATS, render

    fmt = output_format(fmt, output, FORMATS, inputs=[reference, candidate, inputs])
    if exporters:
        if reference is not None or torch_model:
            raise PipelineError("compare --exporters makes its two models from --profile: give no ONNX file and no --torch")
        if profile is None:
            raise PipelineError("compare --exporters needs --profile NAME: the model to export with both exporters")
        result = _compare_exporters(profile, inputs, nodes, max_trace_mb, tolerance)
    elif reference is None:
        raise PipelineError("compare: give two ONNX files (A, the reference, then B), one with --torch, or --exporters --profile NAME")
    elif torch_model:
        if candidate is not None:
            raise PipelineError(f"compare --torch takes one ONNX file (the torch model comes from --profile); drop {candidate}")
        result = _compare_torch(reference, profile or recorded_profile(reference) or DEFAULT_PROFILE, inputs, dump)
    else:
        if candidate is None:
            raise PipelineError("compare: give two ONNX files (A, the reference, then B), or one with --torch")
        if dump is not None:
            raise PipelineError("--dump writes the torch modules' inputs and outputs: use it with --torch")
        for path in (reference, candidate):  # a file that is no ONNX model is the first thing to say
            load_onnx(path)
        if inputs is None and profile is None:
            profile = recorded_profile(reference) or recorded_profile(candidate)
        if (inputs is None) == (profile is None):
            raise PipelineError("compare: give exactly one of --inputs FILE.npz or --profile NAME (files of a build folder use the profile its manifest records)")
        if align or show_all or nodes or not _same_graph(reference, candidate):
            result = _align_onnx(reference, candidate, inputs, profile, nodes, max_trace_mb, tolerance)
        else:
            result = _compare_onnx(reference, candidate, inputs, profile, samples)
    emit(render(result, fmt, show_all, top), output, is_json=fmt == "json")


def _compare_onnx(reference: Path, candidate: Path, inputs: Optional[Path], profile: Optional[str], samples: int) -> NodeComparison:
    from pipeline.diagnose.compare import compare_models

    feeds = _samples(reference, inputs, profile, samples)
    with tempfile.TemporaryDirectory() as workdir, console.status("running both models with every tensor exposed"):
        return compare_models(reference, candidate, feeds, Path(workdir))


def _same_graph(reference: Path, candidate: Path) -> bool:
    """Whether the models share most tensor names (two precisions of one graph: compared name by name)."""
    from pipeline.diagnose.compare import MIN_JOINED, shared_names

    shared, total = shared_names(reference, candidate)
    return shared >= MIN_JOINED * total


def _samples(reference: Path, inputs: Optional[Path], profile: Optional[str], count: int) -> list[dict]:
    """Feed sets of one sample each: every row of --inputs, or `count` synthetic samples of --profile."""
    from pipeline.core import seeds
    from pipeline.core.samples import batch_axes, load_npz, model_inputs, split, synthetic

    axes = batch_axes(reference)
    if inputs is not None:
        return split(load_npz(inputs, model_inputs(reference), axes), 1, axes)
    from pipeline.artifacts import as_built
    from pipeline.core.profiles import load_profile

    loaded = as_built(load_profile(profile), reference)
    return split(synthetic(loaded, count, seed=seeds.COMPARE, axes=axes), loaded.shape(loaded.inputs[0])[0], axes)


def _align_onnx(reference: Path, candidate: Path, inputs: Optional[Path], profile: Optional[str], nodes: Optional[str],
                max_trace_mb: Optional[float], tolerance: Optional[float]) -> Alignment:
    from pipeline.diagnose.compare import align_models

    if nodes is not None:
        try:
            re.compile(nodes)
        except re.error as err:
            raise PipelineError(f"--nodes {nodes!r}: not a regular expression ({err}); e.g. --nodes 'layers\\.0\\.'") from err
    feeds = _samples(reference, inputs, profile, 1)[0]
    with tempfile.TemporaryDirectory() as workdir, console.status("running both models with every result kept, then aligning them"):
        return align_models(reference, candidate, feeds, Path(workdir), nodes, max_trace_mb, tolerance)


def _compare_exporters(profile: str, inputs: Optional[Path], nodes: Optional[str], max_trace_mb: Optional[float], tolerance: Optional[float]) -> ExportersComparison:
    """Both exports of the profile's model, each against torch module by module, and aligned with each other."""
    from pipeline.core.profiles import load_profile
    from pipeline.diagnose.divergence import ExportCheck, ExportersComparison, compare_to_torch
    from pipeline.export import export_model

    loaded = load_profile(profile)
    if not loaded.model.from_pytorch:
        raise PipelineError(f"{loaded.source}: this profile starts from an ONNX file, so there is nothing to export; pass a profile with a torch model")
    with tempfile.TemporaryDirectory() as workdir:
        folder = Path(workdir)
        paths = {exporter: folder / f"{exporter}.onnx" for exporter in ("dynamo", "torchscript")}
        torch_side = {}
        module, checked = _torch_model(loaded, None)
        for exporter, path in paths.items():
            with console.status(f"exporting {loaded.name} with the {exporter} exporter"):
                exported = export_model(loaded, path, exporter=exporter)
            feeds = _torch_feeds(loaded, checked, module, path, inputs)
            with console.status(f"comparing the {exporter} export with torch, module by module"):
                modules, _ = compare_to_torch(loaded, module, path, feeds, folder)
            worst = max((r for r in modules.rows if r.max_abs_diff is not None), key=lambda r: r.max_abs_diff, default=None)
            torch_side[exporter] = ExportCheck(exported.max_abs_diff, exported.nodes, modules.modules, modules.mapped, modules.tolerance, modules.first_diverging, worst,
                                                 modules.fused)
        aligned = _align_onnx(paths["dynamo"], paths["torchscript"], inputs, profile, nodes, max_trace_mb, tolerance)
    errors = {e: side.outputs_max_abs_diff for e, side in torch_side.items()}
    closer = None if errors["dynamo"] == errors["torchscript"] else min(errors, key=errors.get)
    return ExportersComparison(loaded.name, torch_side, closer, replace(aligned, a="dynamo export", b="torchscript export"))


def _one_part(given, onnx_path: Path):
    """`given`, or for an encoder-decoder's profile (two models) the profile of the part whose build folder holds
    `onnx_path` (OUT/<part>/profile.toml); refused in one line when the file is in no part folder of this profile."""
    from pipeline.artifacts import recorded_profile
    from pipeline.core.profiles import load_profile

    if not given.parts:
        return given
    recorded = recorded_profile(onnx_path)
    part = load_profile(recorded) if recorded is not None else None
    if part is None or part.name != given.name or part.export.part is None:
        raise PipelineError(f"{given.source}: {given.name} is an encoder-decoder, built as two models ({', '.join(given.parts)}) and "
                            f"compare --torch checks one: give a file of a part's build folder (OUT/encoder or OUT/decoder), or "
                            f"--profile the part's profile (OUT/<part>/profile.toml, which sets [export] part)")
    return part


def _torch_model(given, onnx_path: Optional[Path]) -> tuple:
    """The torch model compared with `onnx_path` (a file of a build folder of `given`, or None) and the profile of its inputs:
    the export's (the inputs a decoder's cache or an encoder-decoder part derives). An encoder-decoder's part is the wrapper
    its export ran (pipeline/models/seq2seq.py), built from the part's profile, which names the encoder's inputs."""
    from pipeline.artifacts import as_built
    from pipeline.models.module import build_module

    if given.export.part is not None:
        module, _, _, checked = build_module(given)
        return module, checked
    loaded = as_built(given, onnx_path) if onnx_path is not None else given
    return build_module(loaded)[0], loaded


def _torch_feeds(given, checked, module, onnx_path: Path, inputs: Optional[Path]) -> dict:
    """One sample of `checked`'s inputs (the model's, see `_torch_model`): the first of --inputs, else drawn from the profile;
    a decoder part's cross-attention caches are the torch encoder part's (`_decoder_feeds`)."""
    from pipeline.core import seeds
    from pipeline.core.samples import batch_axes, load_npz, make_inputs, model_inputs, split

    if inputs is None:
        return _decoder_feeds(given, checked, module) if given.export.part == "decoder" else make_inputs(checked, seed=seeds.COMPARE)
    axes = batch_axes(onnx_path)
    first = split(load_npz(inputs, model_inputs(onnx_path), axes), 1, axes)[0]
    feeds = {spec.name: first[spec.name] for spec in checked.inputs if spec.name in first}
    if len(feeds) != len(checked.inputs):
        raise PipelineError(f"{inputs}: has {sorted(first)}, profile {checked.name} takes {[spec.name for spec in checked.inputs]}; give one array per input")
    return feeds


def _decoder_feeds(given, decoder, module) -> dict:
    """A decoder part's feeds: the cross-attention caches (and mask) the torch encoder part computes on a sample of the
    encoder inputs `given` declares, as the generation check feeds them; the tokens and self-attention cache drawn from
    the decoder's profile."""
    from pipeline.core import seeds
    from pipeline.core.samples import make_inputs
    from pipeline.models.seq2seq import ENCODER_SEQ, cross_feeds, run_encoder

    encoder_inputs = make_inputs(given, seed=seeds.COMPARE)
    encoded = {name: tensor.numpy() for name, tensor in run_encoder(module, encoder_inputs, given).items()}
    batch, length = encoded["last_hidden_state"].shape[:2]
    feeds = make_inputs(decoder, seed=seeds.COMPARE, dims={"batch": batch, ENCODER_SEQ: length}) | cross_feeds(encoded, decoder)
    if "encoder_attention_mask" in feeds:
        feeds["encoder_attention_mask"] = encoder_inputs["attention_mask"]
    return feeds


def _compare_torch(onnx_path: Path, profile: str, inputs: Optional[Path], dump: Optional[Path]) -> TorchComparison:
    from pipeline.core.onnxfile import load_onnx
    from pipeline.core.profiles import load_profile
    from pipeline.diagnose.divergence import compare_to_torch, dump_modules

    given = _one_part(load_profile(profile), onnx_path)
    if not given.model.from_pytorch:
        raise PipelineError(f"{given.source}: this profile starts from an ONNX file, so there is no torch model to compare; pass the profile of the export")
    load_onnx(onnx_path)
    module, checked = _torch_model(given, onnx_path)
    feeds = _torch_feeds(given, checked, module, onnx_path, inputs)
    with tempfile.TemporaryDirectory() as workdir, console.status("running torch with a hook on every module, and the ONNX model with every tensor exposed"):
        result, captures = compare_to_torch(checked, module, onnx_path, feeds, Path(workdir))
    if dump is not None:
        written = dump_modules(captures, dump)
        console.print(f"wrote {len(written)} module dumps to {dump}", highlight=False, markup=False)
    return result
