"""A GPU box, as far as the code under test can tell, on a CPU machine with the real TensorRT bindings.

`World(trt, journal).install()` replaces only TensorRT's factories (`Builder`, `Runtime`,
`OnnxParser`) with strict doubles (doubles.py) that behave like TensorRT where it matters:
- the parser reads the real ONNX file; the builder (building.py) refuses what the real one refuses
  (network-creation flags, optimization profiles); the "engine" built runs the model on onnxruntime
  (CPU), outputs rounded through float16 (the error of a reduced-precision engine) and stored in
  the output's TensorRT type (BF16 and FP8 through ml_dtypes);
- the engine's inspector returns real TensorRT layer information (tests/data/trt), and a profiler
  attached to a context gets one report per layer of it per run, as enqueue_emits_profile does;
- set_timing_cache rejects a non-empty cache when told to (another GPU or TensorRT version);
- CuPy and Polygraphy's CUDA wrapper are strict doubles of the real ones over one `Device`: memory,
  streams, CUDA-event clocks, and the ordering rule whose violation is a race on a real GPU.
Everything the code asks is in the journal (doubles.py) and `device.log`; races in `device.hazards`.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import sys
import types
from collections import defaultdict
from typing import Any
from unittest import mock

import numpy as np
from conformance.building import SimulatedBuilder, SimulatedEngine, check_documented, numpy_type
from conformance.doubles import Doubles, signatures

FACTORIES = ("Builder", "Runtime", "OnnxParser")
ORIGINALS: dict[str, Any] = {}  # the real factories and CuPy, kept across the scenarios run in one process


class Device:
    """Simulated GPU memory and streams.

    The rule a real GPU enforces silently: work on a stream sees what another stream wrote only
    once that stream was synchronized, or when one of the two is the legacy default stream (0) and
    the other a blocking stream. A synchronous copy (no stream) completes before it returns.
    """

    def __init__(self):
        self.memory: dict[int, bytearray] = {}
        self.pending: dict[int, int] = {}  # allocation -> stream of its last write not known complete
        self.non_blocking: dict[int, bool] = {0: False}
        self.clocks: dict[int, float] = defaultdict(float)
        self.log: list[dict[str, Any]] = []
        self.hazards: list[str] = []
        self._pointers = itertools.count(0x7F0000000000, 1 << 20)
        self._streams = itertools.count(0x5000, 0x10)

    def create_stream(self, non_blocking: bool) -> int:
        stream = next(self._streams)
        self.non_blocking[stream] = non_blocking
        self.log.append({"op": "create_stream", "stream": stream, "non_blocking": non_blocking})
        return stream

    def malloc(self, nbytes: int) -> int:
        if nbytes >= 1 << 20:
            raise MemoryError(f"simulated device: {nbytes} bytes is more than a test needs")
        pointer = next(self._pointers)
        self.memory[pointer] = bytearray(max(nbytes, 1))
        self.log.append({"op": "malloc", "ptr": pointer, "bytes": nbytes})
        return pointer

    def free(self, pointer: int) -> None:
        if pointer and self.memory.pop(pointer, None) is None:
            raise RuntimeError(f"simulated device: free of {pointer:#x}, which is not an allocation")

    def write(self, pointer: int, data: bytes, stream: int | None, op: str) -> None:
        base, offset = self._allocation(pointer, len(data))
        self._check(base, 0 if stream is None else stream, op)
        self.memory[base][offset: offset + len(data)] = data
        if stream is None:
            self.pending.pop(base, None)
        else:
            self.pending[base] = stream
        self.log.append({"op": op, "stream": stream, "ptr": pointer, "bytes": len(data)})

    def read(self, pointer: int, nbytes: int, stream: int | None, op: str) -> bytes:
        base, offset = self._allocation(pointer, nbytes)
        self._check(base, 0 if stream is None else stream, op)
        self.log.append({"op": op, "stream": stream, "ptr": pointer, "bytes": nbytes})
        return bytes(self.memory[base][offset: offset + nbytes])

    def synchronize(self, stream: int) -> None:
        self.pending = {base: writer for base, writer in self.pending.items() if writer != stream}
        self.log.append({"op": "synchronize", "stream": stream})

    def _allocation(self, pointer: int, nbytes: int) -> tuple[int, int]:
        for base, memory in self.memory.items():
            if base <= pointer and pointer + nbytes <= base + len(memory):
                return base, pointer - base
        raise RuntimeError(f"simulated device: illegal address {pointer:#x} (+{nbytes} bytes)")

    def _check(self, base: int, stream: int, op: str) -> None:
        writer = self.pending.get(base)
        if writer is None or writer == stream:
            return
        legacy_ordered = (writer == 0 and not self.non_blocking[stream]) or (stream == 0 and not self.non_blocking[writer])
        if not legacy_ordered:
            self.hazards.append(f"{op} on stream {stream:#x} uses memory at {base:#x} written on stream {writer:#x} with no synchronization between")


class World:
    def __init__(self, trt, journal: list[dict[str, Any]], layer_information: str):
        self.trt, self.journal = trt, journal
        self.doubles = Doubles(trt, journal)
        self.device = Device()
        self.layer_information = layer_information
        self.layers = [layer["Name"] if isinstance(layer, dict) else layer for layer in json.loads(layer_information)["Layers"]]
        self.timing_cache_accepted = True
        self.parser_errors: list[tuple[str, str, str]] = []  # (node name, op, message)
        self.output_dtypes: dict[str, str] = {}  # engine output -> TensorRT DataType name, instead of the ONNX type
        self.dropped_reports: dict[str, int] = {}  # layer -> how many of its profiler reports TensorRT drops
        self.reports: list[tuple[str, float]] = []  # (layer, ms) as delivered to the profiler
        self.latencies: list[float] = []  # device time of each run
        self.engines: dict[bytes, SimulatedEngine] = {}
        self.runs = 0
        self.events: dict[int, dict[str, float]] = {}
        self.building = SimulatedBuilder(self)

    # --- installation ------------------------------------------------------------------------
    def install(self) -> World:
        import polygraphy.cuda.cuda as polygraphy_cuda

        import trt.capability as capability

        for name in FACTORIES:
            ORIGINALS.setdefault(name, getattr(self.trt, name))
        check_documented(self.trt, ORIGINALS)
        self.trt.Builder = self._factory("Builder", self.building.builder)
        self.trt.Runtime = self._factory("Runtime", self._runtime)
        self.trt.OnnxParser = self._factory("OnnxParser", self.building.parser)
        sys.modules["cupy"] = self._cupy()
        polygraphy_cuda.G_CUDA = self._polygraphy_cuda(polygraphy_cuda)
        capability.cuda_device_present = lambda: True  # the simulated GPU is there
        return self

    def _factory(self, name: str, answers):
        real = ORIGINALS[name]
        init = signatures(real.__init__)

        def create(*args, **kwargs):
            _, bound = self.doubles.bind(name, init, args, kwargs)
            double = self.doubles.make(real, answers(**bound))
            self.doubles.record({"call": name, "on": self.doubles.labels[id(double)], "args": {k: self.doubles.render(v) for k, v in bound.items()}})
            return double

        return create

    # --- running -------------------------------------------------------------------------------
    def _runtime(self, logger) -> dict[str, Any]:
        def deserialize_cuda_engine(serialized):
            model = self.engines.get(bytes(serialized))
            if model is None:
                logger.log(self.trt.ILogger.Severity.ERROR, "[simulated] the engine plan file is not compatible with this version of TensorRT")
                return None
            return self._engine(model)

        return {"deserialize_cuda_engine": deserialize_cuda_engine, "logger": logger}

    def _engine(self, model: SimulatedEngine):
        trt, holder = self.trt, {}
        engine = self.doubles.make(trt.ICudaEngine, {
            "num_io_tensors": lambda: len(model.tensors),
            "get_tensor_name": lambda index: model.tensors[index]["name"],
            "get_tensor_mode": lambda name: trt.TensorIOMode.INPUT if model.tensor(name)["input"] else trt.TensorIOMode.OUTPUT,
            "get_tensor_dtype": lambda name: model.tensor(name)["dtype"],
            "get_tensor_shape": lambda name: trt.Dims(model.tensor(name)["shape"]),
            "get_tensor_format": lambda *args: trt.TensorFormat.LINEAR,
            "get_tensor_location": lambda name: trt.TensorLocation.DEVICE,
            "is_shape_inference_io": lambda name: False,
            "num_layers": lambda: len(self.layers),
            "num_optimization_profiles": 1,
            "name": "simulated",
            "create_execution_context": lambda *args, **kwargs: self._context(model, holder["engine"]),
            "create_engine_inspector": lambda: self.doubles.make(trt.EngineInspector, {
                "get_engine_information": lambda format: self.layer_information,
                "get_layer_information": lambda layer_index, format: json.dumps(json.loads(self.layer_information)["Layers"][layer_index]),
            }),
        })
        holder["engine"] = engine
        return engine

    def _context(self, model: SimulatedEngine, engine):
        trt, state, holder = self.trt, {"shapes": {}, "addresses": {}, "allocators": {}}, {}
        inputs = [t["name"] for t in model.tensors if t["input"]]

        def set_input_shape(name, shape) -> bool:
            if name not in inputs or len(shape) != len(model.tensor(name)["shape"]):
                return False
            state["shapes"][name] = tuple(shape)
            return True

        def get_tensor_shape(name):
            if name in inputs:
                return trt.Dims(state["shapes"].get(name, model.tensor(name)["shape"]))
            if set(state["shapes"]) != set(inputs):
                return trt.Dims(model.tensor(name)["shape"])
            return trt.Dims(model.output_shapes(state["shapes"])[name])

        def set_tensor_address(name, memory) -> bool:
            state["addresses"][name] = memory
            return True

        def set_output_allocator(name, output_allocator) -> bool:
            state["allocators"][name] = output_allocator
            return True

        context = self.doubles.make(trt.IExecutionContext, {
            "set_input_shape": set_input_shape, "get_tensor_shape": get_tensor_shape,
            "set_tensor_address": set_tensor_address, "get_tensor_address": lambda name: state["addresses"].get(name, 0),
            "set_output_allocator": set_output_allocator,
            "execute_async_v3": lambda stream_handle: self._execute(model, holder["context"], state, stream_handle),
            "report_to_profiler": lambda: self._report(holder["context"]),
            "engine": lambda: engine, "active_optimization_profile": 0,
        })
        holder["context"] = context
        return context

    def _execute(self, model: SimulatedEngine, context, state: dict[str, Any], stream: int) -> bool:
        feeds = {}
        for tensor in model.tensors:
            if tensor["input"]:
                shape, dtype = state["shapes"][tensor["name"]], numpy_type(tensor["dtype"].name)
                data = self.device.read(state["addresses"][tensor["name"]], math.prod(shape) * np.dtype(dtype).itemsize, stream, "enqueue")
                feeds[tensor["name"]] = np.frombuffer(data, dtype).reshape(shape)
        for name, value in model.run(feeds).items():
            data = value.tobytes()
            if name in state["allocators"]:
                allocator = state["allocators"][name]
                address = allocator.reallocate_output_async(name, 0, len(data), 256, stream)
                allocator.notify_shape(name, self.trt.Dims(value.shape))
            else:
                address = state["addresses"][name]
            self.device.write(address, data, stream, "enqueue")
        self.runs += 1
        latency = sum(self._layer_ms(index) for index in range(len(self.layers)))
        self.device.clocks[stream] += latency
        self.latencies.append(latency)
        if context.profiler is not None and context.enqueue_emits_profile:
            self._report(context)
        return True

    def _layer_ms(self, index: int) -> float:
        """A deterministic time per layer and run, varying between runs (so means and medians differ)."""
        return 0.010 * (index + 1) * (1.0 + 0.25 * ((self.runs + index) % 4))

    def _report(self, context) -> bool:
        """One report per layer, as TensorRT delivers them; a dropped one stands for the exception
        the binding prints and swallows when report_layer_time raises."""
        for index, layer in enumerate(self.layers):
            if self.dropped_reports.get(layer, 0) > 0:
                self.dropped_reports[layer] -= 1
                print(f"[simulated TensorRT] exception in IProfiler.report_layer_time for {layer!r} ignored", file=sys.stderr)
                continue
            ms = self._layer_ms(index)
            context.profiler.report_layer_time(layer, ms)
            self.reports.append((layer, ms))
        return True

    # --- CuPy and Polygraphy's CUDA wrapper ----------------------------------------------------------
    def _cupy(self) -> types.ModuleType:
        if "cupy" not in ORIGINALS:
            import cupy

            ORIGINALS["cupy"] = cupy
        real = ORIGINALS["cupy"]
        device, doubles = self.device, self.doubles
        module, cuda = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
        module.cuda, module.uint8 = cuda, real.uint8

        def stream(null=False, non_blocking=False, ptds=False, priority=None):
            pointer = device.create_stream(non_blocking)
            return doubles.make(real.cuda.Stream, {"ptr": pointer, "synchronize": lambda: device.synchronize(pointer)}, instance_attributes=("ptr",))

        def event(block=False, disable_timing=False, interprocess=False):
            state: dict[str, float] = {}
            double = doubles.make(real.cuda.Event, {"record": lambda stream=None: state.update(ms=device.clocks[stream.ptr if stream else 0]),
                                                    "synchronize": lambda: None})
            self.events[id(double)] = state
            return double

        def elapsed(start_event, end_event) -> float:
            return self.events[id(end_event)]["ms"] - self.events[id(start_event)]["ms"]

        def empty(shape, dtype=float, order="C"):
            shape = (shape,) if isinstance(shape, int) else tuple(shape)
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            pointer = device.malloc(nbytes)

            def set_(arr, stream=None):
                if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != np.dtype(dtype):
                    raise ValueError(f"simulated cupy: cannot set a {np.dtype(dtype)} array of shape {shape} from {arr!r:.80}")
                device.write(pointer, np.ascontiguousarray(arr).tobytes(), stream.ptr if stream else 0, "copy to device")

            return doubles.make(real.ndarray, {"shape": shape, "dtype": np.dtype(dtype), "nbytes": nbytes, "set": set_,
                                               "data": doubles.make(real.cuda.MemoryPointer, {"ptr": pointer})})

        cuda.Stream = mock.create_autospec(real.cuda.Stream, side_effect=stream)
        cuda.Event = mock.create_autospec(real.cuda.Event, side_effect=event)
        cuda.get_elapsed_time = self._checked(real.cuda.get_elapsed_time, "cupy.cuda.get_elapsed_time", elapsed)
        module.empty = mock.create_autospec(real.empty, side_effect=empty)
        return module

    def _checked(self, real, name: str, implementation):
        overloads = signatures(real)

        def call(*args, **kwargs):
            self.doubles.bind(name, overloads, args, kwargs)
            return implementation(*args, **kwargs)

        return call

    def _polygraphy_cuda(self, polygraphy_cuda: types.ModuleType):
        device = self.device

        def memcpy(dst, src, nbytes, kind, stream_ptr=None):
            if kind == polygraphy_cuda.MemcpyKind.HostToDevice:
                device.write(dst, ctypes.string_at(src, nbytes), stream_ptr, "copy to device")
            elif kind == polygraphy_cuda.MemcpyKind.DeviceToHost:
                ctypes.memmove(dst, device.read(src, nbytes, stream_ptr, "copy to host"), nbytes)
            else:
                raise RuntimeError(f"simulated device: memcpy kind {kind} is not simulated")

        return self.doubles.make(polygraphy_cuda.Cuda, {
            "create_stream": lambda: device.create_stream(non_blocking=False),  # cudaStreamCreate: a blocking stream
            "stream_synchronize": device.synchronize, "destroy_stream": lambda ptr: None,
            "malloc": device.malloc, "free": device.free, "memcpy": memcpy, "check": lambda status: None,
        })
