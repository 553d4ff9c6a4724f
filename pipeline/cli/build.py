"""The build command: every stage of a profile into an artifacts folder."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, get_args

import typer

from pipeline import precisions as registry
from pipeline.cli.app import app, choices, console, precision_flags, stdout_console
from pipeline.core import DEFAULT_PROFILE
from pipeline.core.errors import PipelineError
from pipeline.core.profiles import BuildSection
from quant.presets import PRESET_NAMES

if TYPE_CHECKING:
    from pipeline.settings import Options

PresetName = choices("PresetName", PRESET_NAMES)
PresetOption = Annotated[Optional[PresetName], typer.Option(
    help="Q/DQ placement of the precisions that place Q/DQ (" + ", ".join(p.name for p in registry.optional() if p.placed)
         + ") [default: from the profile; auto: the preset of the model's family, trt-fusion, decoder or cnn].")]


REPAIR_HELP = (f"When the {'/'.join(p.label for p in registry.optional() if p.repairable)} accuracy gate fails, find the fewest nodes to keep "
               "in higher precision and rerun (docs/precisions.md, 'Repair'); --no-repair: fail with the gate's hint.")


Verbosity = choices("Verbosity", get_args(BuildSection.model_fields["verbosity"].annotation))


def _gate_defaults(gate: str) -> str:
    return ", ".join(f"{getattr(p, gate)} {p.label}" for p in registry.gated(gate))


@app.command(
    help=(
        "Run the pipeline stages for a profile into OUT (default artifacts/<profile>), "
        "recording each in OUT/manifest.json. Unchanged stages are reported `cached`. An encoder-decoder (task seq2seq-lm, "
        "speech2seq-lm) is two models: its encoder and decoder are built into OUT/encoder and OUT/decoder, then their "
        "generation is checked together (docs/decoders.md).\n\n"
        "Examples:\n\n"
        "  python -m pipeline build\n\n"
        "  python -m pipeline build --profile my_model.toml --out runs/a --force\n\n"
        "  python -m pipeline build --onnx model.onnx --profile bert-tiny\n\n"
        "  python -m pipeline build --fp16 --int8 --preset trt-fusion\n\n"
        "  python -m pipeline build --profile hf-resnet-tiny --fp8 --int4 --preset cnn"
    )
)
@precision_flags
def build(
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help=f"Profile name (profiles/NAME.toml) or path to a .toml file [default: {DEFAULT_PROFILE}; with --onnx, required].")] = None,
    onnx: Annotated[Optional[Path], typer.Option(help="Start from this ONNX file instead of exporting.")] = None,
    precisions: frozenset[str] = frozenset(),
    calib: Annotated[Optional[Path], typer.Option(help="Calibration data .npz (one array per input, samples stacked on its batch axis, axis 0 for most models) [default: synthetic from the profile].")] = None,
    preset: PresetOption = None,
    min_cosine: Annotated[Optional[float], typer.Option(min=0, max=1, help=f"Accuracy gate vs FP32 (cosine_centered) [default: {_gate_defaults('min_cosine')}].")] = None,
    min_token_agreement: Annotated[Optional[float], typer.Option(min=0, max=1, help=f"A decoder's gate: share of steps where, fed torch's greedy tokens, it picks torch's next one [default: {_gate_defaults('min_token_agreement')}; docs/decoders.md].")] = None,
    verbosity: Annotated[Optional[Verbosity], typer.Option(help="Engine profiling verbosity [default: detailed, which the report needs].")] = None,
    weak_fp16: Annotated[bool, typer.Option("--weak-fp16", help="TensorRT 10.x only: also let the builder pick FP16 kernels (legacy weak typing).")] = False,
    repair: Annotated[bool, typer.Option("--repair/--no-repair", help=REPAIR_HELP)] = True,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder [default: artifacts/<profile>].")] = None,
    until: Annotated[Optional[str], typer.Option(help="Stop after this stage (export, optimize, a precision, build, report, diff, bench).")] = None,
    strict: Annotated[bool, typer.Option(help="Fail (exit 3) instead of skipping a stage this machine cannot run.")] = False,
    force: Annotated[bool, typer.Option(help="Rerun stages even when cached.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="If another build is writing to OUT, wait for it instead of exiting.")] = False,
) -> None:
    from pipeline.core.profiles import shadowed_profile
    from pipeline.folderbuild import FolderBuild
    from pipeline.settings import Options
    from pipeline.summary import print_next_steps, shown_path

    options = Options(precisions, onnx, calib, preset.value if preset else None, min_cosine, min_token_agreement,
                      verbosity.value if verbosity else None, weak_fp16, repair=repair)
    loaded, plan, out_dir = _checked(options, profile, until, strict, out)
    out_console = stdout_console(keep_going=True)
    out_console.print(f"profile {loaded.name} from {shown_path(loaded.source) if loaded.source else 'the built-in defaults'}", highlight=False, markup=False)
    if (outside := _factory_outside(loaded)) is not None:
        out_console.print(f"note: model.factory {loaded.model.factory} runs code from {outside} (outside the profile's folder and the installed packages)",
                          highlight=False, markup=False)
    if (ignored := shadowed_profile(profile or DEFAULT_PROFILE)) is not None:
        out_console.print(f"note: {ignored} is not used: the packaged profile {loaded.name!r} is; pass --profile {ignored} to use yours", highlight=False, markup=False)
    folder = FolderBuild(options, plan, until, strict, force, wait, out_console, console, rerun_hint=lambda: _docker_hint(loaded, options, out_dir))
    if loaded.parts:
        from pipeline.parts import build_parts

        manifest, records = build_parts(loaded, out_dir, folder)
    else:
        records = folder.run(loaded, out_dir)
        manifest = out_dir / "manifest.json"
    print_next_steps(out_console, loaded, manifest, records)


def _checked(options: Options, profile: Optional[str], until: Optional[str], strict: bool, out: Optional[Path]):
    """The profile, the plan and the output folder, after every check that needs no stage to run: a bad input
    is refused before anything is written or computed."""
    from pipeline.core.profiles import load_profile
    from pipeline.settings import check_gates
    from pipeline.stages import build_plan

    check_build_options(options)
    if options.onnx is not None and profile is None:
        raise PipelineError(f"build --onnx {options.onnx} needs --profile: a profile names the model's inputs and the sizes to build for "
                            f"({_onnx_inputs(options.onnx)}); write one (docs/models.md, \"Starting from an ONNX file\") and pass --profile FILE.toml")
    plan = build_plan(options)
    names = [stage.name for stage in plan]
    if until is not None and until not in names:
        raise PipelineError(f"Invalid value for '--until': {until!r} is not a stage of this build; use one of {', '.join(names)}")
    loaded = load_profile(profile or DEFAULT_PROFILE)
    check_gates(loaded)
    if options.onnx is not None and loaded.parts:
        raise PipelineError(f"build --onnx {options.onnx}: profile {loaded.name} is an encoder-decoder (task {loaded.model.task}), built as "
                            f"two models ({', '.join(loaded.parts)}); one ONNX file is one of them: set [export] part to the one it is")
    if options.calib is not None:
        _check_calibration_file(options.calib, loaded)
    out_dir = out or Path("artifacts") / loaded.name
    if strict:
        _fail_early_without_tensorrt(plan[: names.index(until) + 1] if until else plan, lambda: _docker_hint(loaded, options, out_dir))
    return loaded, plan, out_dir


def _check_calibration_file(path: Path, profile) -> None:
    """--calib read before any stage runs: a readable .npz with an array of the right dtype for each of the profile's
    inputs (the model's own check, shapes included, comes with its calibration)."""
    from pipeline.core.errors import InputError
    from pipeline.core.fileio import require_file
    from pipeline.core.samples import read_npz

    data = read_npz(require_file(path, "calibration file", "pass an existing .npz (one array per model input, samples stacked on its batch axis, axis 0 for most models)"))
    for spec in profile.inputs:
        if spec.name not in data:
            raise InputError(f"{path}: no array for input {spec.name!r} of profile {profile.name} (has {sorted(data)}); add one per input")
        if data[spec.name].dtype != spec.dtype:
            raise InputError(f"{path}: input {spec.name!r} has dtype {data[spec.name].dtype}, profile {profile.name} says {spec.dtype}; "
                             f"convert it with .astype({spec.dtype!r})")


def _fail_early_without_tensorrt(plan, rerun_hint) -> None:
    """--strict on a machine without TensorRT fails before the CPU stages, not after them."""
    from pipeline.core.errors import CapabilityMissing
    from trt.capability import needs_tensorrt, tensorrt_missing

    if any(stage.name in ("build", "bench") for stage in plan) and (missing := tensorrt_missing()):
        raise CapabilityMissing(needs_tensorrt("--strict: building engines", missing, rerun_hint()))


def check_build_options(options: Options) -> None:
    """Options that only a stage not requested would read are mistakes, not silently ignored."""
    asked = [p for p in registry.optional() if p.name in options.precisions]
    readers = {"calib": ("calibration data", "calibrated"), "preset": ("Q/DQ placement", "placed"),
               "min_cosine": ("accuracy gate", "min_cosine"), "min_token_agreement": ("generation gate", "min_token_agreement")}
    if not options.repair and not any(p.repairable for p in asked):
        repairable = [p for p in registry.optional() if p.repairable]
        raise PipelineError(f"--no-repair turns off the repair of the {'/'.join(p.label for p in repairable)} accuracy gates, which this build "
                            f"does not run; add {registry.listed(repairable)}, or drop --no-repair")
    for option, (what, attribute) in readers.items():
        if getattr(options, option) is None:
            continue
        precisions = [p for p in registry.optional() if getattr(p, attribute)]
        if not any(p in precisions for p in asked):
            flag = "--" + option.replace("_", "-")
            raise PipelineError(f"{flag} is the {what} of the {'/'.join(p.label for p in precisions)} stages, which this build does not run; "
                                f"add {registry.listed(precisions)}, or drop {flag}")


def _onnx_inputs(path: Path) -> str:
    """`its inputs: input_ids int64 [batch, seq], ...`, read without the weights."""
    import onnx

    from pipeline.core.fileio import require_file
    from pipeline.core.onnxfile import load_onnx

    model = load_onnx(require_file(path, "ONNX file", "pass an existing .onnx path"))
    weights = {i.name for i in model.graph.initializer}
    described = []
    for value in (v for v in model.graph.input if v.name not in weights):
        tensor = value.type.tensor_type
        dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?") for d in tensor.shape.dim]
        described.append(f"{value.name} {onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)} [{', '.join(dims)}]")
    return "its inputs: " + ", ".join(described)


def _factory_outside(profile) -> Optional[Path]:
    """The factory module's file, when it is neither beside the profile nor installed nor ours: the code a build runs
    that the user may not expect (a module that happens to be on PYTHONPATH or in the current folder)."""
    from pipeline.core.modelsource import factory_file

    path = factory_file(profile)
    if path is None:
        return None
    path = path.resolve()
    known = [profile.folder, Path(__file__).resolve().parents[2], *(sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib"))]
    return None if any(path.is_relative_to(Path(folder).resolve()) for folder in known) else path


def _docker_hint(profile, options: Options, out: Path) -> str:
    """The command that runs this build, with the user's profile, options and output folder, in our image."""
    from trt.capability import docker_command, profile_argument

    arguments: list[str | Path] = ["build", "--profile", profile_argument(profile)]
    if options.onnx:
        arguments += ["--onnx", Path(options.onnx)]
    arguments += [f"--{p.name}" for p in registry.optional() if p.name in options.precisions]
    arguments += ["--weak-fp16"] if options.weak_fp16 else []
    arguments += [] if options.repair else ["--no-repair"]
    if options.calib:
        arguments += ["--calib", Path(options.calib)]
    for key in ("preset", "min_cosine", "min_token_agreement", "verbosity"):
        if getattr(options, key) is not None:
            arguments += ["--" + key.replace("_", "-"), str(getattr(options, key))]
    from pipeline.core.modelsource import local_folder

    files = [profile.onnx_path(), local_folder(profile) if profile.model.hf else None]  # a save_pretrained folder: "../checkpoint"
    return docker_command([*arguments, "--out", out, "--strict"], also_mount=[path for path in files if path is not None])
