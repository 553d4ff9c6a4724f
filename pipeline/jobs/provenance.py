"""Where a cell ran, as MLPerf system descriptions record it: GPU (NVML via nvidia-ml-py: name, UUID,
memory, driver, CUDA driver version, clocks, power limit, temperature, clock-lock and throttle state),
library versions, the image digest when the environment gives it, the host CPU. Without a GPU (or
without NVML) the GPU fields are `null` and `gpu_absent` says why."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

PACKAGES = ("tensorrt", "nvidia-modelopt", "onnxruntime-gpu", "onnxruntime", "torch", "onnx", "trt-pipeline")
# clock event reasons that mean the GPU slowed itself (not idle, not an application clock setting)
_THROTTLE_MASK_NAMES = ("SwPowerCap", "HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown")


def host() -> dict[str, Any]:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "versions": versions,
        "python": platform.python_version(),
        "image_digest": os.environ.get("IMAGE_DIGEST") or None,
        "host": {"machine": platform.machine(), "cpu": _cpu_name(), "cpus": os.cpu_count(), "system": platform.platform(terse=True)},
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_state() -> dict[str, Any]:
    """The first GPU's identity and state now; {"gpu_absent": reason} when NVML cannot tell. (nvidia-ml-py
    12.535, the oldest pyproject.toml allows, and later return names as str, not bytes.)"""
    try:
        import pynvml
    except ImportError as err:
        return {"gpu_absent": f"nvidia-ml-py is not installed ({err})"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"gpu_absent": f"NVML did not start: {err} (no NVIDIA driver or GPU here)"}
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return {"gpu_absent": "NVML sees no GPU"}
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        reasons = _optional(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        throttles = [name for name in _THROTTLE_MASK_NAMES
                     if reasons and reasons & getattr(pynvml, f"nvmlClocksEventReason{name}", 0)]
        locked = _optional(pynvml.nvmlDeviceGetGpuLockedClocks, handle) if hasattr(pynvml, "nvmlDeviceGetGpuLockedClocks") else None
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "gpu_absent": None,
            "name": pynvml.nvmlDeviceGetName(handle),
            "uuid": pynvml.nvmlDeviceGetUUID(handle),
            "memory_mib": memory.total // (1 << 20),
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "cuda_driver": _optional(pynvml.nvmlSystemGetCudaDriverVersion_v2),
            "sm_clock_mhz": _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "memory_clock_mhz": _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": (_optional(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle) or 0) / 1000 or None,
            "temperature_c": _optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            "clocks_locked": bool(locked) if locked is not None else None,
            "throttle_reasons": throttles,
        }
    finally:
        pynvml.nvmlShutdown()


def _optional(call, *args):
    """An NVML query some GPUs or drivers do not support: None then."""
    import pynvml

    try:
        return call(*args)
    except pynvml.NVMLError:
        return None
