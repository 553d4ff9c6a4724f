"""Malformed layer information: one error naming the format, the place and what was expected.
A hypothesis fuzz test checks the parsers never fail any other way."""

import json
import re

import pytest
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import InputError
from trt.parsers import LayerInfoParseError, parse_layer_info, parse_timing
from trt.plan import EnginePlan


def write(tmp_path, data, name="bad.json"):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.fixture
def mnist(trt_fixtures):
    return (trt_fixtures / "trt10.16_detailed_mnist_myelin.layers.json").read_text()


def test_truncated_json(tmp_path, mnist):
    path = write(tmp_path, mnist[: len(mnist) // 2])
    with pytest.raises(LayerInfoParseError, match=r"JSON: line \d+ column \d+: .*expected inspector JSON"):
        parse_layer_info(path)


@pytest.mark.parametrize("top", ["[1, 2, 3]", '"layers"', "42", '{"Bindings": []}', '{"Layers": {"a": 1}}'])
def test_wrong_top_level_type(tmp_path, top):
    with pytest.raises(LayerInfoParseError, match="top level: got .*; expected an object with a 'Layers' list"):
        parse_layer_info(write(tmp_path, top))


def test_binary_file(tmp_path):
    with pytest.raises(LayerInfoParseError, match=r"binary file: byte 4: a NUL byte"):
        parse_layer_info(write(tmp_path, b"ftrt\x00\x01\x02engine bytes", "model.engine"))


def test_not_utf8(tmp_path):
    with pytest.raises(LayerInfoParseError, match="not UTF-8"):
        parse_layer_info(write(tmp_path, b'{"Layers": ["\xff\xfe"]}'))


def test_empty_file(tmp_path):
    with pytest.raises(LayerInfoParseError, match="empty file: byte 0: the file is empty"):
        parse_layer_info(write(tmp_path, "  \n"))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such layer information file"):
        parse_layer_info(tmp_path / "nope.json")


def test_unknown_layer_type_is_kept_verbatim(tmp_path, mnist):
    """New TensorRT versions add kernel types: an unknown type string is data, not an error."""
    data = json.loads(mnist)
    data["Layers"][0]["LayerType"] = "FutureKernelType"
    plan = parse_layer_info(write(tmp_path, json.dumps(data)))
    assert plan.layers[0].type == "FutureKernelType"


@pytest.mark.parametrize(("value", "where"), [(7, "Layers[0].LayerType"), (None, "Layers[0].LayerType"), ("", "Layers[0].LayerType")])
def test_layer_type_of_the_wrong_kind(tmp_path, mnist, value, where):
    data = json.loads(mnist)
    data["Layers"][0]["LayerType"] = value
    with pytest.raises(LayerInfoParseError, match=re.escape(where) + ": got .*; expected a layer type string"):
        parse_layer_info(write(tmp_path, json.dumps(data)))


def test_duplicate_layer_names(tmp_path, mnist):
    data = json.loads(mnist)
    data["Layers"].append(data["Layers"][1])
    with pytest.raises(LayerInfoParseError, match=r"layers 1 and 9: duplicate layer name 'node_max_pool2d'"):
        parse_layer_info(write(tmp_path, json.dumps(data)))


def test_mixed_string_and_object_layers(tmp_path, mnist):
    data = json.loads(mnist)
    data["Layers"][2] = "just a name"
    with pytest.raises(LayerInfoParseError, match=r"Layers\[2\]: a string among layer objects"):
        parse_layer_info(write(tmp_path, json.dumps(data)))


def test_profile_given_as_layer_info(trt_fixtures):
    with pytest.raises(LayerInfoParseError, match="per-layer timing, not layer information; expected it passed with --timing"):
        parse_layer_info(trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json")


def test_text_without_layer_lines(tmp_path):
    with pytest.raises(LayerInfoParseError, match=r"text: lines 1-2: no TensorRT layer lines found"):
        parse_layer_info(write(tmp_path, "[I] building engine\n[I] done\n", "build.log"))


def test_log_layer_line_without_type(tmp_path):
    with pytest.raises(LayerInfoParseError, match="line 2: a layer line without Name or LayerType"):
        parse_layer_info(write(tmp_path, "[V] [TRT] Layers:\nName: x, LayerType: , Inputs: []\n", "b.log"))


def test_forced_format_mismatch(trt_fixtures):
    with pytest.raises(LayerInfoParseError, match="JSON: line 1 column"):
        parse_layer_info(trt_fixtures / "bert-fp16-trt10.10.detailed.log", input_format="json")


def test_timing_file_malformed(tmp_path):
    with pytest.raises(LayerInfoParseError, match="line 2: a record without timeMs/averageMs"):
        parse_timing(write(tmp_path, '[\n{ "name" : "a", "averageMs" : \n'))
    with pytest.raises(LayerInfoParseError, match="top level"):
        parse_timing(write(tmp_path, '{"name": "a"}'))
    # found by the fuzz test: a number with two dots in a file that is not valid JSON
    with pytest.raises(LayerInfoParseError, match="line 2: a record without timeMs/averageMs"):
        parse_timing(write(tmp_path, '[\n{ "name" : "a"b", "timeMs" : 1.2.02714, "averageMs" : 1.0 }\n]'))


def test_cli_malformed_is_one_line_exit_2(tmp_path, mnist):
    path = write(tmp_path, mnist[:100])
    result = run_cli("report", str(path), "-o", str(tmp_path / "out.html"), "-f", "html")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: JSON: line")
    assert not (tmp_path / "out.html").exists()


# ---------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["Name", "LayerType", "Inputs", "Outputs", "Metadata", "Layers", "Origin", "Dimensions", "Format/Datatype", "Datatype", "I/O Tensors", "Bindings", "count", "name", "averageMs"]) | st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


def _parses_or_raises_ours(tmp_path, data: bytes, parser=parse_layer_info) -> None:
    path = tmp_path / "fuzz.in"
    path.write_bytes(data)
    try:
        result = parser(path)
    except InputError:
        return
    assert isinstance(result, (EnginePlan, list))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
def test_fuzz_json_structures(tmp_path, value):
    _parses_or_raises_ours(tmp_path, json.dumps({"Layers": value} if isinstance(value, list) else value).encode())
    _parses_or_raises_ours(tmp_path, json.dumps(value).encode(), parse_timing)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_real_files(tmp_path, trt_fixtures, data):
    name = data.draw(st.sampled_from(sorted(p.name for p in trt_fixtures.iterdir() if p.suffix in (".json", ".log"))))
    original = (trt_fixtures / name).read_bytes()
    start = data.draw(st.integers(0, len(original)))
    stop = data.draw(st.integers(start, min(len(original), start + 400)))
    insert = data.draw(st.binary(max_size=8) | st.sampled_from([b"", b"]", b"}", b"[", b"{", b",", b'"', b"\n", b"Name: ", b", LayerType: "]))
    _parses_or_raises_ours(tmp_path, original[:start] + insert + original[stop:])
    _parses_or_raises_ours(tmp_path, original[:start] + insert + original[stop:], parse_timing)
