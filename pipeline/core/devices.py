"""What compute this machine has, checked without importing torch or creating GPU contexts."""

from __future__ import annotations

from pathlib import Path


def cuda_device_present() -> bool:
    """An NVIDIA driver device node exists (Linux); a CUDA-capable onnxruntime is a separate question."""
    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()


def onnxruntime_providers() -> list[str]:
    """Providers to run models with: CUDA first when a device and the provider are both there."""
    import onnxruntime as ort

    if cuda_device_present() and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
