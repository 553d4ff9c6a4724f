"""What compute this machine has, checked without importing torch or creating GPU contexts."""

from __future__ import annotations

from pathlib import Path


def cuda_device_present() -> bool:
    """An NVIDIA driver device node exists (Linux); a CUDA-capable onnxruntime is a separate question."""
    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()

