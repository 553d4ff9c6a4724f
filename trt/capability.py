"""Can this machine build TensorRT engines? If not: why, and the command that runs the job where it can."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from pipeline.core.devices import cuda_device_present

IMAGE = "trt-pipeline"
REPOSITORY = Path(__file__).resolve().parent.parent


RUN_IN_IMAGE = "; run it in our image on a machine with an NVIDIA GPU, from this folder: "


def needs_tensorrt(what: str, missing: str, command: str) -> str:
    """`what` needs TensorRT and a GPU: why it is missing here, then the command that runs it in our image (last: the
    build's summary prints it once, under the stage lines, pipeline/summary.py)."""
    return f"{what} needs TensorRT and a GPU: {missing}{RUN_IN_IMAGE}{command}"


def tensorrt_missing() -> str | None:
    """None when TensorRT imports and a CUDA device is present, else the reason."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as err:
        return f"TensorRT is not installed here (import tensorrt: {err})"
    if not cuda_device_present():
        return "no CUDA device on this machine (/dev/nvidiactl is missing)"
    return None


def profile_argument(profile) -> str | Path:
    """What to pass as --profile in the container: a built-in profile's name, any other profile's file."""
    return profile.name if profile.packaged else Path(profile.source)


def docker_command(arguments: list[str | Path], also_mount: list[Path] = ()) -> str:
    """The shell command that runs `python -m pipeline ARGUMENTS` in our image on a machine with a GPU, from the
    current folder (mounted at the same path: paths under it stay relative); folders of paths elsewhere, and
    `also_mount`'s, are mounted at their own path."""
    here = Path.cwd().resolve()
    mounts: list[Path] = []
    for path in [a.resolve() for a in [*arguments, *also_mount] if isinstance(a, Path)]:
        folder = path if path.is_dir() else path.parent
        if _inside(folder, here) is None and not any(folder == m or m in folder.parents for m in mounts):
            mounts.append(folder)
    rendered = [(_inside(a.resolve(), here) or str(a.resolve())) if isinstance(a, Path) else a for a in arguments]
    volumes = " ".join(f"-v {shlex.quote(f'{m}:{m}')}" for m in mounts)
    return (f"docker build -t {IMAGE} {shlex.quote(_inside(REPOSITORY, here) or str(REPOSITORY))} && "
            f"docker run --rm --gpus all -v \"$PWD:$PWD\" -w \"$PWD\" {volumes + ' ' if volumes else ''}"
            f"{IMAGE} {shlex.join(rendered)}")


def _inside(path: Path, here: Path) -> str | None:
    """`path` relative to `here` ("." for `here` itself), or None when it is elsewhere."""
    return os.path.relpath(path, here) if path == here or here in path.parents else None


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability (nvidia-smi's `compute_cap`), or None without a GPU or driver tool."""
    import subprocess

    if not cuda_device_present():
        return None
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.split()
        major, minor = text[0].split(".")
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def below_compute_capability(precision: str, required: tuple[int, int], found: tuple[int, int] | None) -> str | None:
    """Why `precision` engines cannot be built here (the GPU is absent or older than `required`), or None."""
    if found is not None and found >= required:
        return None
    here = "no GPU's capability could be read here" if found is None else f"this GPU is {found[0]}.{found[1]}"
    return f"{precision} engines need a GPU of compute capability {'.'.join(map(str, required))}+ (Ada, Hopper, Blackwell); {here}"
