"""The builder side of the simulated GPU (world.py): network, ONNX parser, builder config, optimization
profiles and the build, refusing what the real builder refuses.

The rules, as the real bindings of each version document them (their docstrings are checked for the
sentences below when a world is made, so a version that drops one shows up) and NVIDIA's sources say:
- Network-creation flags: `Builder.create_network` takes "NetworkDefinitionCreationFlag s combined
  using bitwise OR"; the members are this version's real enum (10.8: EXPLICIT_BATCH 0, STRONGLY_TYPED 1;
  10.13 adds PREFER_JIT_PYTHON_PLUGINS 2, PREFER_AOT_PYTHON_PLUGINS 3; 11.4: STRONGLY_TYPED 0,
  "deprecated ... ignored", PREFER_JIT 1, PREFER_AOT 2). NvInfer.h (NVIDIA/TensorRT, 10.13 and 11.x):
  the two PREFER flags "Cannot be used in conjunction". How the library reports a bit that names no
  member is not documented: the harness raises ValueError. So `1 << 1` is STRONGLY_TYPED on 10.x and
  a valid PREFER_JIT_PYTHON_PLUGINS on 11.x (which builds; the tests check flags by member name).
- `IOptimizationProfile.set_shape(input, min, opt, max)`: the docstring's conditions (1) equal ranks,
  (2) 0 <= min <= opt <= max, (3) a static network dimension equals min, opt and max. The binding
  (python/src/infer/pyCore.cpp, 10.8 to 11.1) calls setDimensions for min, opt, max in turn and raises
  RuntimeError("Shape provided for <selector> is inconsistent with other shapes.") at the first that
  returns false (its docstring says ValueError; the source raises RuntimeError). NvInferRuntime.h:
  setDimensions checks against what was set before for the input; "a full validation is performed at
  engine build time", where (3) is checked here. `bool(profile)` is isValid (pyCore.cpp), and
  `add_optimization_profile` returns -1 for an invalid profile (its docstring).
- A dynamic input (a -1 dimension) needs an optimization profile covering it: `add_optimization_profile`
  "must be called at least once if the network has dynamic or shape input tensors", `set_shape` "must
  be called for any network input tensor that has dynamic dimensions" (the bindings' docstrings; NVIDIA,
  "Working with Dynamic Shapes": "Specify one or more optimization profiles at build time"). The real
  builder logs an error and `build_serialized_network` returns None, with these messages: "Network has
  dynamic or shape inputs, but no optimization profile has been defined." (TensorRT 10.0, issue 1 of
  daniel89710/trt-depth-anything; 7.x, NVIDIA/TensorRT#768) and "x: dynamic input is missing dimensions
  in profile 0." (8.2, NVIDIA/TensorRT#1812).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SELECTORS = ("min", "opt", "max")
PLUGIN_PREFERENCES = {"PREFER_AOT_PYTHON_PLUGINS", "PREFER_JIT_PYTHON_PLUGINS"}
DOCUMENTED = (("Builder", "create_network", ":class:`NetworkDefinitionCreationFlag` s combined using bitwise OR"),
              ("IOptimizationProfile", "set_shape", "0 <= ``min[i]`` <= ``opt[i]`` <= ``max[i]``"),
              ("IOptimizationProfile", "set_shape", "must be called for any network input tensor that has dynamic dimensions"),
              ("IBuilderConfig", "add_optimization_profile", "must be called at least once if the network has dynamic or shape input tensors"))
BUILD_MESSAGES = (("INFO", "[simulated] Detected 1 inputs and 1 output network tensors."),
                  ("WARNING", "[simulated] Tactic selection is limited by the workspace size."),
                  ("VERBOSE", "[simulated] Applying generic optimizations to the graph for inference."))


def numpy_type(dtype_name: str):
    import ml_dtypes

    types_ = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_,
              "UINT8": np.uint8, "BF16": ml_dtypes.bfloat16, "FP8": ml_dtypes.float8_e4m3fn}
    return types_[dtype_name]


def check_documented(trt, classes: dict[str, type]) -> None:
    """The rules this module enforces are still in this version's docstrings (`classes`: the real factories)."""
    for owner, method, sentence in DOCUMENTED:
        doc = " ".join((getattr(classes.get(owner) or getattr(trt, owner), method).__doc__ or "").split())
        if sentence not in doc:
            raise AssertionError(f"harness: TensorRT {trt.__version__}'s {owner}.{method} no longer says {sentence!r}; review tests/conformance/building.py")


def flag_members(trt, flags: int) -> list[str]:
    """The NetworkDefinitionCreationFlag members `flags` sets, by this version's real enum; ValueError otherwise."""
    bits = {name: 1 << int(member) for name, member in trt.NetworkDefinitionCreationFlag.__members__.items()}
    unknown = flags & ~sum(bits.values())
    if unknown:
        raise ValueError(f"Builder.create_network: flags {flags:#x} set bits {unknown:#x}, which name no NetworkDefinitionCreationFlag of "
                         f"TensorRT {trt.__version__} ({', '.join(f'{name} = 1 << {int(m)}' for name, m in trt.NetworkDefinitionCreationFlag.__members__.items())})")
    named = [name for name, bit in bits.items() if flags & bit]
    if PLUGIN_PREFERENCES <= set(named):
        raise ValueError("Builder.create_network: PREFER_AOT_PYTHON_PLUGINS cannot be used in conjunction with PREFER_JIT_PYTHON_PLUGINS")
    return named


def set_dimensions(known: dict[str, tuple[int, ...]], selector: str, dims: tuple[int, ...]) -> bool:
    """IOptimizationProfile::setDimensions for one selector: False where `dims` contradicts a selector set
    before for the input (rank; 0 <= min <= opt <= max), else recorded in `known`."""
    if selector == "min" and any(d < 0 for d in dims):
        return False
    for other, dims_before in known.items():
        low, high = (dims_before, dims) if SELECTORS.index(other) < SELECTORS.index(selector) else (dims, dims_before)
        if len(dims_before) != len(dims) or any(a > b for a, b in zip(low, high)):
            return False
    known[selector] = dims
    return True


def profile_problem(inputs: dict[str, tuple[int, ...]], profiles: list[dict[str, dict[str, tuple[int, ...]]]]) -> str | None:
    """Why the builder refuses the network's inputs with these optimization profiles, or None."""
    dynamic = [name for name, shape in inputs.items() if -1 in shape]
    if dynamic and not profiles:
        return "Network has dynamic or shape inputs, but no optimization profile has been defined."
    for index, profile in enumerate(profiles):
        for name, shape in inputs.items():
            if name not in profile:
                if name in dynamic:
                    return f"{name}: dynamic input is missing dimensions in profile {index}."
                continue
            for selector, dims in profile[name].items():
                if len(dims) != len(shape) or any(n not in (-1, d) for n, d in zip(shape, dims)):
                    return f"{name}: the {selector} dimensions {list(dims)} of profile {index} do not fit the network's {list(shape)} (rank, static dimensions)"
    return None


class SimulatedEngine:
    """What an engine built from an ONNX file computes, and its I/O tensors as TensorRT describes them."""

    def __init__(self, trt, onnx_path: Path, output_dtypes: dict[str, str]):
        import onnx
        import onnxruntime as ort

        graph = onnx.load(str(onnx_path), load_external_data=False).graph
        onnx_types = {onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF", onnx.TensorProto.INT32: "INT32",
                      onnx.TensorProto.INT64: "INT64", onnx.TensorProto.BOOL: "BOOL", onnx.TensorProto.INT8: "INT8"}
        initializers = {i.name for i in graph.initializer}

        def describe(value, is_input):
            tensor = value.type.tensor_type
            dtype = onnx_types[tensor.elem_type] if is_input else output_dtypes.get(value.name, onnx_types[tensor.elem_type])
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
            return {"name": value.name, "input": is_input, "dtype": getattr(trt.DataType, dtype), "shape": shape}

        self.tensors = [describe(v, True) for v in graph.input if v.name not in initializers] + [describe(v, False) for v in graph.output]
        self.session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        self.shapes: dict[tuple, dict[str, tuple]] = {}

    def tensor(self, name: str) -> dict[str, Any]:
        return next(t for t in self.tensors if t["name"] == name)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = dict(zip([o.name for o in self.session.get_outputs()], self.session.run(None, feeds)))
        outputs = {}
        for tensor in self.tensors:
            if not tensor["input"]:
                value = results[tensor["name"]]
                if np.issubdtype(value.dtype, np.floating):
                    value = value.astype(np.float16).astype(np.float32)
                outputs[tensor["name"]] = value.astype(numpy_type(tensor["dtype"].name))
        return outputs

    def output_shapes(self, input_shapes: dict[str, tuple]) -> dict[str, tuple]:
        key = tuple(sorted(input_shapes.items()))
        if key not in self.shapes:
            feeds = {name: np.zeros(shape, numpy_type(self.tensor(name)["dtype"].name)) for name, shape in input_shapes.items()}
            self.shapes[key] = {name: value.shape for name, value in self.run(feeds).items()}
        return self.shapes[key]


class SimulatedBuilder:
    """Answers for the doubles of Builder, OnnxParser and what they make; `world` holds what a scenario sets
    (parser_errors, output_dtypes, timing_cache_accepted) and the engines built (`world.engines`)."""

    def __init__(self, world):
        self.world, self.trt, self.doubles = world, world.trt, world.doubles
        self.networks: dict[int, dict[str, Any]] = {}
        self.configs: dict[int, dict[str, Any]] = {}
        self.profiles: dict[int, dict[str, dict[str, tuple[int, ...]]]] = {}  # profile -> input -> selector -> dims
        self.cache_sources: dict[int, bytes] = {}

    def builder(self, logger) -> dict[str, Any]:
        return {
            "create_network": lambda flags=0: self._network(flags),
            "create_builder_config": self._config,
            "create_optimization_profile": self._profile,
            "build_serialized_network": lambda network, config, *kernel_text: self._build(logger, network, config),
            "logger": logger,
        }

    def _network(self, flags: int):
        state: dict[str, Any] = {"inputs": [], "outputs": [], "shapes": {}, "onnx": None, "flags": flag_members(self.trt, int(flags))}
        network = self.doubles.make(self.trt.INetworkDefinition, {
            "num_inputs": lambda: len(state["inputs"]), "get_input": lambda index: state["inputs"][index],
            "num_outputs": lambda: len(state["outputs"]), "get_output": lambda index: state["outputs"][index],
            "num_layers": 0, "__len__": 0,
        })
        self.networks[id(network)] = state
        return network

    def parser(self, network, logger) -> dict[str, Any]:
        trt, state, world = self.trt, self.networks[id(network)], self.world

        def parse_from_file(model: str) -> bool:
            engine = SimulatedEngine(trt, Path(model), world.output_dtypes)
            for tensor in engine.tensors:
                double = self.doubles.make(trt.ITensor, {"name": tensor["name"], "shape": trt.Dims(tensor["shape"]), "dtype": tensor["dtype"],
                                                         "is_shape_tensor": False, "is_network_input": tensor["input"],
                                                         "is_network_output": not tensor["input"]})
                state["inputs" if tensor["input"] else "outputs"].append(double)
                if tensor["input"]:
                    state["shapes"][tensor["name"]] = tensor["shape"]
            state["onnx"] = Path(model)
            return not world.parser_errors

        def error(index: int):
            node, op, message = world.parser_errors[index]
            return self.doubles.make(trt.ParserError, {"desc": lambda: message, "node": lambda: index, "node_name": lambda: node,
                                                       "node_operator": lambda: op, "code": lambda: trt.ErrorCode.UNSUPPORTED_NODE,
                                                       "__str__": lambda: f"In node {index} with name: {node} and operator: {op}: {message}"})

        return {"parse_from_file": parse_from_file, "num_errors": lambda: len(world.parser_errors), "get_error": error}

    def _profile(self):
        shapes: dict[str, dict[str, tuple[int, ...]]] = {}

        def set_shape(input, min, opt, max) -> None:
            shapes[input] = {}
            for selector, dims in zip(SELECTORS, (min, opt, max)):
                if not set_dimensions(shapes[input], selector, tuple(dims)):
                    raise RuntimeError(f"Shape provided for {selector} is inconsistent with other shapes.")

        profile = self.doubles.make(self.trt.IOptimizationProfile, {
            "set_shape": set_shape, "__bool__": lambda: all(len(known) == len(SELECTORS) for known in shapes.values()),
        })
        self.profiles[id(profile)] = shapes
        return profile

    def _config(self):
        trt, world = self.trt, self.world
        state = {"cache": None, "profiles": [], "flags": {trt.BuilderFlag.TF32}, "pools": {}}  # TF32 is on by default

        def create_timing_cache(serialized_timing_cache) -> Any:
            cache = self.doubles.make(trt.ITimingCache, {"serialize": lambda: self.doubles.host_memory(f"timing cache of TensorRT {trt.__version__}".encode())})
            self.cache_sources[id(cache)] = bytes(serialized_timing_cache)
            return cache

        def set_timing_cache(cache, ignore_mismatch) -> bool:
            accepted = not self.cache_sources.get(id(cache)) or world.timing_cache_accepted
            if accepted:
                state["cache"] = cache
            return accepted

        def add_optimization_profile(profile) -> int:
            if not profile:
                return -1
            state["profiles"].append(self.profiles[id(profile)])
            return len(state["profiles"]) - 1

        config = self.doubles.make(trt.IBuilderConfig, {
            "create_timing_cache": create_timing_cache, "set_timing_cache": set_timing_cache,
            "get_timing_cache": lambda: state["cache"], "add_optimization_profile": add_optimization_profile,
            "num_optimization_profiles": lambda: len(state["profiles"]),
            "set_flag": lambda flag: state["flags"].add(flag), "clear_flag": lambda flag: state["flags"].discard(flag),
            "get_flag": lambda flag: flag in state["flags"],
            "set_memory_pool_limit": lambda pool, pool_size: state["pools"].update({pool: pool_size}),
            "get_memory_pool_limit": lambda pool: state["pools"].get(pool, 0),
        })
        self.configs[id(config)] = state
        return config

    def _build(self, logger, network, config):
        trt, state, world = self.trt, self.networks[id(network)], self.world
        for severity, message in BUILD_MESSAGES:
            logger.log(getattr(trt.ILogger.Severity, severity), message)
        if state["onnx"] is None:
            logger.log(trt.ILogger.Severity.ERROR, "[simulated] the network has no layers")
            return None
        problem = profile_problem(state["shapes"], self.configs[id(config)]["profiles"])
        if problem:
            logger.log(trt.ILogger.Severity.ERROR, f"[simulated] {problem}")
            return None
        serialized = f"simulated engine {len(world.engines) + 1} of {state['onnx'].name}".encode()
        world.engines[serialized] = SimulatedEngine(trt, state["onnx"], world.output_dtypes)
        return self.doubles.host_memory(serialized)
