"""TensorRT 10.x vs 11.x: the version table, the API calls per version (recording double), trtexec lines."""

import enum
import sys
import types
from pathlib import Path

import pytest

from pipeline.errors import InputError
from trt.engine import BuildSettings, configure
from trt.versions import VERSIONS, for_version, trtexec_command

SHAPES = {"ids": ((1, 8), (1, 128), (32, 512))}


def test_version_rows():
    assert for_version("10.13.3.9") is VERSIONS[10] and for_version("11.4.0") is VERSIONS[11] and for_version("12.0") is VERSIONS[11]
    assert VERSIONS[10].weak_fp16 and not VERSIONS[11].weak_fp16
    assert (VERSIONS[10].inspector_io_key, VERSIONS[11].inspector_io_key) == ("Bindings", "I/O Tensors")
    with pytest.raises(InputError, match="use 10.x or 11.x"):
        for_version("8.6.1")


def command(major, **kwargs):
    return trtexec_command(VERSIONS[major], Path("m.onnx"), Path("e.engine"), Path("l.json"), Path("p.json"), "detailed", SHAPES, 1024, 3, Path("t.cache"), **kwargs)


def test_trtexec_10():
    line = command(10)
    assert "--stronglyTyped" in line and "--separateProfileRun" in line and "--fp16" not in line
    assert {"--profilingVerbosity=detailed", "--exportLayerInfo=l.json", "--exportProfile=p.json", "--minShapes=ids:1x8",
            "--optShapes=ids:1x128", "--maxShapes=ids:32x512", "--memPoolSize=workspace:1024M", "--builderOptimizationLevel=3"} <= set(line)
    weak = command(10, weak_fp16=True)
    assert "--fp16" in weak and "--stronglyTyped" not in weak


def test_trtexec_11_has_no_precision_flags():
    line = command(11)
    assert not {"--stronglyTyped", "--separateProfileRun", "--fp16", "--int8", "--best"} & set(line)
    with pytest.raises(InputError, match="--weak-fp16 needs TensorRT 10.x"):
        command(11, weak_fp16=True)


class Recorder:
    """A stand-in for the tensorrt module that records the API calls made on it (no engines, no layer info)."""

    def __init__(self, version: str, strongly_typed_value: int, parse_ok: bool = True):
        self.calls: list[tuple] = []
        self.__version__ = version
        record = self.calls

        class Flag(enum.IntEnum):
            STRONGLY_TYPED = strongly_typed_value

        self.NetworkDefinitionCreationFlag = Flag
        self.ProfilingVerbosity = types.SimpleNamespace(NONE="NONE", LAYER_NAMES_ONLY="LAYER_NAMES_ONLY", DETAILED="DETAILED")
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        if version.startswith("10."):
            self.BuilderFlag = types.SimpleNamespace(FP16="FP16")

        class Config:
            def __setattr__(self, key, value):
                record.append(("config." + key, value))

            def set_memory_pool_limit(self, pool, size):
                record.append(("set_memory_pool_limit", pool, size))

            def set_flag(self, flag):
                record.append(("set_flag", flag))

            def create_timing_cache(self, data):
                record.append(("create_timing_cache", data))
                return "cache"

            def set_timing_cache(self, cache, ignore_mismatch):
                record.append(("set_timing_cache", cache, ignore_mismatch))

            def add_optimization_profile(self, profile):
                record.append(("add_optimization_profile",))

        class Profile:
            def set_shape(self, name, low, opt, high):
                record.append(("set_shape", name, low, opt, high))

        class Builder:
            def __init__(self, logger):
                record.append(("Builder",))

            def create_network(self, flags):
                record.append(("create_network", flags))
                return "network"

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

        class Error:
            def desc(self):
                return "No importer registered for op: FancyOp"

            def node(self):
                return 3

            def node_name(self):
                return "/block/FancyOp"

            def node_operator(self):
                return "FancyOp"

        class Parser:
            num_errors = 0 if parse_ok else 1

            def __init__(self, network, logger):
                record.append(("OnnxParser", network))

            def parse_from_file(self, path):
                record.append(("parse_from_file", path))
                return parse_ok

            def get_error(self, index):
                return Error()

        self.Builder, self.OnnxParser = Builder, Parser


@pytest.mark.parametrize(("version", "value"), [("10.13.3.9", 0), ("11.4.0.106", 5)])
def test_strongly_typed_network_and_config_per_version(version, value):
    trt = Recorder(version, value)
    configure(trt, None, Path("m.onnx"), SHAPES, BuildSettings(verbosity="detailed", workspace_mib=2048, optimization_level=4), b"")
    calls = trt.calls
    assert ("create_network", 1 << value) in calls, "flags must be 1 << int(STRONGLY_TYPED), whatever its number"
    assert ("config.profiling_verbosity", "DETAILED") in calls
    assert ("set_memory_pool_limit", "WORKSPACE", 2048 << 20) in calls and ("config.builder_optimization_level", 4) in calls
    assert ("set_shape", "ids", (1, 8), (1, 128), (32, 512)) in calls and ("add_optimization_profile",) in calls
    assert ("set_timing_cache", "cache", False) in calls
    assert not any(c[0] == "set_flag" for c in calls)


def test_weak_fp16_on_10_and_refused_on_11():
    trt10 = Recorder("10.13.3.9", 0)
    configure(trt10, None, Path("m.onnx"), {}, BuildSettings(verbosity="layer_names_only", weak_fp16=True), b"")
    assert ("create_network", 0) in trt10.calls and ("set_flag", "FP16") in trt10.calls
    assert ("config.profiling_verbosity", "LAYER_NAMES_ONLY") in trt10.calls
    trt11 = Recorder("11.4.0", 5)
    with pytest.raises(InputError, match="--weak-fp16 needs TensorRT 10.x"):
        configure(trt11, None, Path("m.onnx"), {}, BuildSettings(weak_fp16=True), b"")
    assert trt11.calls == [], "nothing may be built once the version rules it out"


def test_parser_errors_name_each_node():
    trt = Recorder("10.13.3.9", 0, parse_ok=False)
    with pytest.raises(InputError, match=r"TensorRT's ONNX parser failed: /block/FancyOp \(FancyOp\): No importer registered for op: FancyOp"):
        configure(trt, None, Path("m.onnx"), {}, BuildSettings(), b"")


def test_tensorrt_is_not_imported_by_the_cli_or_report():
    assert "tensorrt" not in sys.modules
