"""TensorRT 10.x vs 11.x: the version table (checked against each version's real bindings) and the
trtexec command lines per version. The Python API calls per version are tests/test_trt_conformance.py's."""

import sys
from pathlib import Path

import pytest
from trt_bindings import VERSIONS as BINDINGS

from pipeline.core.errors import InputError
from trt.versions import VERSIONS, for_version, trtexec_command

SHAPES = {"ids": ((1, 8), (1, 128), (32, 512))}


def test_version_rows():
    assert for_version("10.13.3.9") is VERSIONS[10] and for_version("11.4.0") is VERSIONS[11] and for_version("12.0") is VERSIONS[11]
    with pytest.raises(InputError, match="use 10.x or 11.x"):
        for_version("8.6.1")
    with pytest.raises(InputError, match="not understood"):
        for_version("ten")


@pytest.mark.conformance
@pytest.mark.parametrize("version", BINDINGS)
def test_the_table_says_what_the_real_bindings_have(conformance, version):
    """weak_fp16 means BuilderFlag.FP16 exists; 11.x's renumbered STRONGLY_TYPED and removed EXPLICIT_BATCH."""
    result = conformance(version)["facts"]
    assert result["error"] is None
    facts, row = result["value"], for_version(version)
    assert row.weak_fp16 == facts["BuilderFlag.FP16"]
    assert (facts["STRONGLY_TYPED"], facts["EXPLICIT_BATCH"]) == ((1, True) if row.major == 10 else (0, False))


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


def test_tensorrt_is_not_imported_by_the_cli_or_report():
    assert "tensorrt" not in sys.modules
