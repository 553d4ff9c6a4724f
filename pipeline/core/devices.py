"""What compute this machine has, checked without importing torch or creating GPU contexts."""

from __future__ import annotations

from pathlib import Path


def cuda_device_present() -> bool:
    """An NVIDIA driver device node exists (Linux); a CUDA-capable onnxruntime is a separate question."""
    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()


def onnxruntime_cuda_missing() -> str | None:
    """Why onnxruntime cannot run a model on a CUDA GPU here, or None when it lists its CUDA provider on a machine
    with a GPU (whether the provider starts, with CUDA's libraries found, shows only when a session is made)."""
    if not cuda_device_present():
        return "no CUDA GPU here"
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"this machine has a GPU but its onnxruntime {ort.__version__} has no CUDA provider (install onnxruntime-gpu)"
    return None
