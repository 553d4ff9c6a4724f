"""Conformance scenarios: the project's real trt/ functions, and the build stage through the CLI, run
against the real TensorRT bindings of one version with strict doubles on a simulated GPU (world.py).

Each scenario returns JSON; `run` adds what the code asked TensorRT (journal), what happened on the
device (log, hazards) and what the profiler was given. tests/test_trt_conformance.py asserts on it.
`mutant_*` scenarios run one scenario on the project's code with one mistake made (mutations.py).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from conformance.mutations import MUTATIONS, mutated
from conformance.world import World

SHAPES = {"x": ((1, 8), (4, 8), (16, 8))}
PROFILE_RUNS, PROFILE_WARMUP, TIMED_RUNS, TIMING_WARMUP = 6, 3, 5, 2
OLD_CACHE = b"timing cache from an earlier build"


def tiny_onnx(path: Path, second_output: bool = False) -> Path:
    """y = Sigmoid(x @ W + b) for x of shape [batch, 8] (and z = Relu(x @ W) when asked)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"], name="/fc/MatMul"), helper.make_node("Add", ["xw", "b"], ["h"], name="/fc/Add"),
             helper.make_node("Sigmoid", ["h"], ["y"], name="/act/Sigmoid")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])]
    if second_output:
        nodes.append(helper.make_node("Relu", ["xw"], ["z"], name="/act/Relu"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 4]))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])], outputs,
                              [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W"),
                               numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)}


def _paths(workdir: Path, prec: str = "fp32"):
    from trt.build import BuildPaths

    return BuildPaths(workdir / f"{prec}.engine", workdir / f"{prec}.layers.json", workdir / f"{prec}.build.log", workdir / "timing.cache")


def _settings(**changes):
    from trt.build import BuildSettings

    return BuildSettings(**{"verbosity": "detailed", "workspace_mib": 2048, "optimization_level": 4, "log_severity": "info", **changes})


def _written(paths) -> dict[str, Any]:
    return {name: path.read_text() if path.is_file() else None for name, path in
            (("engine", paths.engine), ("layers", paths.layers_json), ("build_log", paths.build_log), ("timing_cache", paths.timing_cache))}


def _built(world: World, workdir: Path, second_output: bool = False):
    """An engine built from the tiny model by the python builder, and the journal marked after it."""
    from trt.build import build_engine

    paths = _paths(workdir)
    build_engine(tiny_onnx(workdir / "tiny.onnx", second_output), paths, SHAPES, _settings())
    world.doubles.record({"mark": "built"})
    world.device.log.append({"op": "mark"})
    return paths


# --- facts of the bindings --------------------------------------------------------------------------
def facts(world: World, workdir: Path) -> dict[str, Any]:
    trt = world.trt
    return {"version": trt.__version__, "STRONGLY_TYPED": int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED),
            "BuilderFlag.FP16": hasattr(trt.BuilderFlag, "FP16"), "EXPLICIT_BATCH": hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"),
            "NetworkDefinitionCreationFlag": {name: int(member) for name, member in trt.NetworkDefinitionCreationFlag.__members__.items()}}


# --- builds -------------------------------------------------------------------------------------
def _build(builder: str, weak_fp16: bool = False, cache_accepted: bool = True, parser_errors: tuple = (), shapes=SHAPES):
    def scenario(world: World, workdir: Path) -> dict[str, Any]:
        from trt.builders import builder as named

        world.timing_cache_accepted = cache_accepted
        world.parser_errors = list(parser_errors)
        paths = _paths(workdir)
        paths.timing_cache.write_bytes(OLD_CACHE)
        build, _ = named(builder)  # the builder interface the build stage uses
        try:
            metrics = build(tiny_onnx(workdir / "tiny.onnx"), paths, shapes, _settings(weak_fp16=weak_fp16))
        finally:
            written = _written(paths)
        return {"metrics": metrics, **written}

    return scenario


def _failing(scenario: Callable[[World, Path], dict[str, Any]]):
    """`scenario`'s value, or how it failed and the build log it left."""
    def wrapped(world: World, workdir: Path) -> dict[str, Any]:
        try:
            return {"failed": None, "value": scenario(world, workdir)}
        except Exception as err:  # the outcome the tests assert
            log = _paths(workdir).build_log
            return {"failed": f"{type(err).__name__}: {err}", "build_log": log.read_text() if log.is_file() else None}

    return wrapped


def _mutant(name: str):
    """The mutation's scenario run on the project's code with that one edit (mutations.py)."""
    def scenario(world: World, workdir: Path) -> dict[str, Any]:
        mutation = MUTATIONS[name]
        with mutated(mutation, workdir):
            return _failing(SCENARIOS[mutation.scenario])(world, workdir)

    return scenario


# --- running ------------------------------------------------------------------------------------
def profile(world: World, workdir: Path) -> dict[str, Any]:
    from trt.run import profile_engine

    paths = _built(world, workdir)
    layers = profile_engine(paths.engine, workdir / "profile.json", feeds(), PROFILE_RUNS, PROFILE_WARMUP)
    return {"layers": layers, "profile": json.loads((workdir / "profile.json").read_text()), "engine_layers": world.layers}


def profile_missing(dropped: dict[str, int] | None):
    def scenario(world: World, workdir: Path) -> dict[str, Any]:
        from pipeline.core.errors import StageFailed
        from trt.run import profile_engine

        paths = _built(world, workdir)
        world.dropped_reports = dropped or {layer: 10**6 for layer in world.layers}
        try:
            profile_engine(paths.engine, workdir / "profile.json", feeds(), PROFILE_RUNS, PROFILE_WARMUP)
        except StageFailed as err:
            return {"failed": str(err), "written": (workdir / "profile.json").exists()}
        return {"failed": None, "written": (workdir / "profile.json").exists()}

    return scenario


def timing(world: World, workdir: Path) -> dict[str, Any]:
    from trt.run import time_engine

    paths = _built(world, workdir)
    steps = []
    times = time_engine(paths.engine, feeds(), TIMING_WARMUP, TIMED_RUNS, on_step=lambda done, total: steps.append([done, total]))
    return {"times": times, "run_latencies": world.latencies, "steps": steps}


def odd_output_types(world: World, workdir: Path) -> dict[str, Any]:
    """Engine outputs in BF16 and FP8, types numpy and trt.nptype do not have."""
    from trt.engine_accuracy import run_engine_and_onnx
    from trt.run import profile_engine, time_engine

    world.output_dtypes = {"y": "BF16", "z": "FP8"}
    paths = _built(world, workdir, second_output=True)
    profiled = profile_engine(paths.engine, workdir / "profile.json", feeds(), PROFILE_RUNS, PROFILE_WARMUP)
    times = time_engine(paths.engine, feeds(), TIMING_WARMUP, TIMED_RUNS)
    accuracy = run_engine_and_onnx(paths.engine, workdir / "tiny.onnx", [feeds(1)])
    return {"profiled_layers": profiled, "timed_runs": len(times), "not_compared": accuracy.not_compared}


def accuracy(world: World, workdir: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from quant.accuracy import agreement
    from trt.engine_accuracy import run_engine_and_onnx

    paths = _built(world, workdir)
    held_out = [feeds(seed) for seed in (11, 12, 13)]
    run = run_engine_and_onnx(paths.engine, workdir / "tiny.onnx", held_out)
    session = ort.InferenceSession(str(workdir / "tiny.onnx"), providers=["CPUExecutionProvider"])
    reference = [session.run(None, f)[0] for f in held_out]
    rounded = [r.astype(np.float16).astype(np.float32) for r in reference]
    return {"figures": agreement(run.onnx, run.engine), "samples": len(run.engine), "not_compared": run.not_compared,
            "onnx_equals_onnxruntime": all(np.array_equal(a[0], b) for a, b in zip(run.onnx, reference)),
            "engine_equals_rounded": all(np.array_equal(a[0], b) for a, b in zip(run.engine, rounded)),
            "independent_max_abs_diff": float(max(np.abs(r - q).max() for r, q in zip(reference, rounded)))}


# --- the build stage, as a user runs it -----------------------------------------------------------------
PROFILE = """
name = "tiny"
[model]
onnx = "tiny.onnx"
[dims.batch]
min = 1
opt = 4
max = 16
[[inputs]]
name = "x"
dtype = "float32"
shape = ["batch", 8]
[quant]
accuracy_samples = 3
[build]
builder = "{builder}"
profile_warmup = 2
profile_iterations = 4
bench_warmup = 2
bench_iterations = 5
"""


def stage(builder: str):
    def scenario(world: World, workdir: Path) -> dict[str, Any]:
        from pipeline.cli import main

        tiny_onnx(workdir / "tiny.onnx")
        (workdir / "tiny.toml").write_text(PROFILE.format(builder=builder))
        out = workdir / "out"
        sys.argv = ["pipeline", "build", "--profile", str(workdir / "tiny.toml"), "--out", str(out), "--strict"]
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        manifest = json.loads((out / "manifest.json").read_text())
        return {"exit": code, "stages": {s["name"]: s for s in manifest["stages"]}, "files": sorted(p.name for p in out.iterdir()),
                "fp32_build_log": (out / "fp32.build.log").read_text() if (out / "fp32.build.log").exists() else None}

    return scenario


FAKE_TRTEXEC = """#!{python}
# trtexec as this scenario's simulated GPU knows it: writes the engine the python builder built (the only plan
# the world deserializes), its layer information and a per-layer profile in trtexec's format; records its argv
import json, shutil, sys
arguments = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
json.dump(sys.argv[1:], open({argv!r}, "w"))
shutil.copyfile({engine!r}, arguments["saveEngine"])
shutil.copyfile({layers!r}, arguments["exportLayerInfo"])
names = [l if isinstance(l, str) else l["Name"] for l in json.load(open({layers!r}))["Layers"]]
json.dump([{{"count": 10}}] + [{{"name": n, "timeMs": 1.0, "averageMs": 0.1, "medianMs": 0.1, "percentage": 100 / len(names)}} for n in names],
          open(arguments["exportProfile"], "w"))
open(arguments["timingCacheFile"], "wb").write(b"trtexec timing cache")
print("&&&& PASSED TensorRT.trtexec (simulated)")
"""


def stage_trtexec(world: World, workdir: Path) -> dict[str, Any]:
    """The build stage with `builder = "trtexec"`: the command line trt/versions.py makes for this version, run
    by a stand-in trtexec on PATH that hands back an engine the simulated GPU runs."""
    import os

    prebuilt = workdir / "prebuilt"
    prebuilt.mkdir()
    built = _built(world, prebuilt)
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "trtexec"
    fake.write_text(FAKE_TRTEXEC.format(python=sys.executable, argv=str(workdir / "trtexec.argv.json"), engine=str(built.engine),
                                        layers=str(built.layers_json)))
    fake.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = stage("trtexec")(world, workdir)
    return result | {"argv": json.loads((workdir / "trtexec.argv.json").read_text())}


# --- bites: wrong calls the harness must refuse as the real bindings do -----------------------------------
def _bite(wrong: Callable[[Any, Any, Any], Any]):
    def scenario(world: World, workdir: Path) -> dict[str, Any]:
        trt = world.trt
        builder = trt.Builder(trt.Logger())
        network = builder.create_network(0)
        wrong(trt, builder, network)
        return {"accepted": True}

    return scenario


def race(world: World, workdir: Path) -> dict[str, Any]:
    """What `_Buffers` did before: the input copied on the default stream, the engine run on a non-blocking one."""
    import cupy as cp

    paths = _built(world, workdir)
    engine = world.trt.Runtime(world.trt.Logger()).deserialize_cuda_engine(paths.engine.read_bytes())
    context = engine.create_execution_context()
    stream = cp.cuda.Stream(non_blocking=True)
    x, y = cp.empty((4, 8), dtype=np.float32), cp.empty((64,), dtype=cp.uint8)
    x.set(feeds()["x"])
    context.set_input_shape("x", (4, 8))
    context.set_tensor_address("x", x.data.ptr)
    context.set_tensor_address("y", y.data.ptr)
    context.execute_async_v3(stream.ptr)
    return {"accepted": True}


SCENARIOS: dict[str, Callable[[World, Path], dict[str, Any]]] = {
    "facts": facts,
    "python_build": _build("python"),
    "python_build_cache_rejected": _build("python", cache_accepted=False),
    "python_build_weak_fp16": _build("python", weak_fp16=True),
    "python_build_parser_errors": _build("python", parser_errors=(("/block/FancyOp", "FancyOp", "No importer registered for op: FancyOp"),)),
    "python_build_profile_for_another_input": _failing(_build("python", shapes={"w": SHAPES["x"]})),
    "polygraphy_build": _build("polygraphy"),
    "polygraphy_build_cache_rejected": _build("polygraphy", cache_accepted=False),
    "polygraphy_build_weak_fp16": _build("polygraphy", weak_fp16=True),
    "polygraphy_build_parser_errors": _build("polygraphy", parser_errors=(("/block/FancyOp", "FancyOp", "No importer registered for op: FancyOp"),)),
    "profile": profile,
    "profile_one_layer_short": profile_missing({"node_max_pool2d": 2}),
    "profile_no_reports": profile_missing(None),
    "timing": timing,
    "odd_output_types": odd_output_types,
    "accuracy": accuracy,
    "stage_python": stage("python"),
    "stage_polygraphy": stage("polygraphy"),
    "stage_trtexec": stage_trtexec,
    "bite_removed_method": _bite(lambda trt, builder, network: builder.build_engine(network, builder.create_builder_config())),
    "bite_removed_in_11": _bite(lambda trt, builder, network: builder.platform_has_fast_fp16),
    "bite_fp16_flag": _bite(lambda trt, builder, network: builder.create_builder_config().set_flag(trt.BuilderFlag.FP16)),
    "bite_read_only_property": _bite(lambda trt, builder, network: setattr(builder.create_builder_config(), "num_optimization_profiles", 1)),
    "bite_missing_argument": _bite(lambda trt, builder, network: builder.create_builder_config().set_timing_cache(builder.create_builder_config().create_timing_cache(b""))),
    "bite_wrong_type": _bite(lambda trt, builder, network: setattr(builder.create_builder_config(), "profiling_verbosity", "detailed")),
    "bite_misspelt_method": _bite(lambda trt, builder, network: builder.create_builder_config().set_memory_pool_limits(trt.MemoryPoolType.WORKSPACE, 1)),
    "bite_flag_bit_3": _bite(lambda trt, builder, network: builder.create_network(1 << 3)),
    "bite_both_plugin_preferences": _bite(lambda trt, builder, network: builder.create_network(
        1 << int(trt.NetworkDefinitionCreationFlag.PREFER_AOT_PYTHON_PLUGINS) | 1 << int(trt.NetworkDefinitionCreationFlag.PREFER_JIT_PYTHON_PLUGINS))),
    "bite_race": race,
    **{f"mutant_{name}": _mutant(name) for name in MUTATIONS},
}


def run(name: str, trt, workdir: Path, layer_information: str) -> dict[str, Any]:
    """One scenario in a fresh world: its value or error, and what the code asked and did."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal: list[dict[str, Any]] = []
    world = World(trt, journal, layer_information).install()
    result: dict[str, Any] = {"value": None, "error": None}
    try:
        result["value"] = SCENARIOS[name](world, workdir)
    except Exception as err:  # the scenario's outcome, asserted by the tests
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()
    return result | {"journal": journal, "device": world.device.log, "hazards": world.device.hazards,
                     "reports": world.reports, "runs": world.runs}
