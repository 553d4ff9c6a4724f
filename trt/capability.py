"""Can this machine build TensorRT engines? If not: why, and how to run the job where it can."""

from __future__ import annotations

from pipeline.devices import cuda_device_present

DOCKER_NEXT_STEP = (
    "run the GPU stages in our image on a machine with an NVIDIA GPU: "
    "docker build -t trt-pipeline . && docker run --rm --gpus all -v \"$PWD/artifacts:/work/artifacts\" "
    "trt-pipeline build --fp16 --int8 --strict"
)


def tensorrt_missing() -> str | None:
    """None when TensorRT imports and a CUDA device is present, else the reason."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as err:
        return f"TensorRT is not installed here (import tensorrt: {err})"
    if not cuda_device_present():
        return "no CUDA device on this machine (/dev/nvidiactl is missing)"
    return None
