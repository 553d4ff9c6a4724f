"""Malformed layer information: one error naming the format, the place and what was expected; the CLI
prints it on one line and exits 2. A hypothesis fuzz test over mutations of every real file checks that
parsing, the report and its rendering never fail any other way (bench/fuzz_parsers.py runs it at scale).
"""

import json
import re

import pytest
from conftest import TRT_DATA, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import InputError, PipelineError
from trt.diff import build_diff
from trt.parsers import LayerInfoParseError, parse_layer_info, parse_timing
from trt.render import FORMATS, render
from trt.report import build_report

FIXTURES = sorted(p.name for p in TRT_DATA.iterdir() if p.suffix in (".json", ".log"))
# CI runs a small share of what bench/fuzz_parsers.py runs; no example database, so no failure is kept
# between runs (a failing example is printed with its reproduction blob instead)
FUZZ = settings(max_examples=150, deadline=None, database=None, print_blob=True, suppress_health_check=[HealthCheck.function_scoped_fixture])


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


def test_binary_not_utf8_empty_missing(tmp_path):
    with pytest.raises(InputError, match=r"model.engine: a serialized engine, not TensorRT layer information as text: export its layer "
                                         r"information, e.g. trtexec --loadEngine="):
        parse_layer_info(write(tmp_path, b"ftrt\x00\x01\x02engine bytes", "model.engine"))
    with pytest.raises(InputError, match=r"binary file: byte 4: a NUL byte"):
        parse_layer_info(write(tmp_path, b"ftrt\x00\x01\x02engine bytes", "blob.bin"))
    with pytest.raises(InputError, match=r"model.onnx: an ONNX model, not TensorRT layer information: TensorRT writes that when it builds"):
        parse_layer_info(write(tmp_path, b"\x08\x08\x12\x00pytorch", "model.onnx"))
    with pytest.raises(LayerInfoParseError, match="not UTF-8"):
        parse_layer_info(write(tmp_path, b'{"Layers": ["\xff\xfe"]}'))
    with pytest.raises(LayerInfoParseError, match="empty file: byte 0: the file is empty"):
        parse_layer_info(write(tmp_path, "  \n"))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such layer information file"):
        parse_layer_info(tmp_path / "nope.json")


def test_unknown_layer_type_is_kept_verbatim(tmp_path, mnist):
    """New TensorRT versions add kernel types: an unknown type string is data, not an error."""
    data = json.loads(mnist)
    data["Layers"][0]["LayerType"] = "FutureKernelType"
    assert parse_layer_info(write(tmp_path, json.dumps(data))).layers[0].type == "FutureKernelType"


@pytest.mark.parametrize("value", [7, None, ""])
def test_layer_type_of_the_wrong_kind(tmp_path, mnist, value):
    data = json.loads(mnist)
    data["Layers"][3]["LayerType"] = value
    with pytest.raises(LayerInfoParseError, match=re.escape("Layers[3].LayerType") + ": got .*; expected a layer type string"):
        parse_layer_info(write(tmp_path, json.dumps(data)))


def test_duplicate_layer_names_in_one_engine(tmp_path, mnist):
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
    with pytest.raises(LayerInfoParseError, match="per-layer timing, not layer information; expected the --exportLayerInfo file as LAYERINFO; pass this file with --timing"):
        parse_layer_info(trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json")


def test_text_without_layer_lines(tmp_path):
    with pytest.raises(LayerInfoParseError, match=r"text: lines 1-3: no TensorRT layer lines found"):
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


BAD_NUMBERS = [
    ("deep.json", "[" * 1000, "nested deeper than a JSON reader follows"),
    ("digits.layers.json", None, "an integer with more than 4,300 digits"),
    ("inf.profile.json", '[{"count": 1}, {"name": "node_relu", "timeMs": 1e309, "averageMs": 1e309}]', "averageMs: a number out of range"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_NUMBERS)
def test_numbers_and_nesting_python_refuses_are_one_clear_line(tmp_path, mnist, name, text, message):
    if text is None:  # a real file with one dimension grown to 5,000 digits
        text = mnist.replace("[1,1,28,28]", "[1,1,28," + "9" * 5000 + "]", 1)
    path = write(tmp_path, text, name)
    args = ["report", str(TRT_DATA / "trt10.16_detailed_mnist_myelin.layers.json"), "--timing", str(path)] if "profile" in name else ["report", str(path)]
    result = run_cli(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: {path}: ") and message in lines[0]


def test_cli_malformed_is_one_line_exit_2_and_writes_nothing(tmp_path, mnist):
    path = write(tmp_path, mnist[:100])
    result = run_cli("report", str(path), "-o", str(tmp_path / "out.html"), "-f", "html")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: JSON: line")
    assert not (tmp_path / "out.html").exists()


# ---------------------------------------------------------------- fuzzing

TOKENS = [b"", b"]", b"}", b"[", b"{", b",", b'"', b"\n", b"\r\n", b"\x1e", b"\x1f", b"\x1b]0;x\x07", b"Name: ", b", LayerType: ", b"Metadata:",
          b"[ONNX Layer: ", b"{ForeignNode[", b"...", b" [profile 1]", b"_myl3_7", b"Layer(Myelin): ", b", Tactic: ", b" -> ", b"[Half(1,2)]",
          b" (Int8[1])", b"    Layer 7    | x [Op: gemm]", b"--- Layer 1 ---\n{", b"1e309", b"9" * 5000, b"[" * 1200, b"-nan", b"PWN(" * 50]


def mutate(data: st.DataObject, original: bytes) -> bytes:
    """One mutation of a real file: cut a span and insert random bytes, a token of the formats, or a repeated chunk."""
    start = data.draw(st.integers(0, len(original)))
    stop = data.draw(st.integers(start, min(len(original), start + 400)))
    insert = data.draw(st.binary(max_size=12) | st.sampled_from(TOKENS) | st.builds(lambda b, n: b * n, st.sampled_from(TOKENS[1:]), st.integers(1, 200)))
    return original[:start] + insert + original[stop:]


def exercise(path, original=None) -> None:
    """Everything `report` does with a file, in every output format, and `diff` against the file it was
    mutated from: only the project's errors may escape."""
    try:
        plan = parse_layer_info(path)
    except PipelineError:
        return
    report = build_report(plan)
    for fmt in FORMATS:
        render(report, fmt)
    if original is not None:
        try:
            diff = build_diff(parse_layer_info(original), parse_layer_info(path))
        except PipelineError:
            return
        for fmt in FORMATS:
            render(diff, fmt)


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_files(tmp_path, trt_fixtures, data):
    name = data.draw(st.sampled_from(FIXTURES))
    path = write(tmp_path, mutate(data, (trt_fixtures / name).read_bytes()), "fuzz" + (".json" if name.endswith(".json") else ".log"))
    exercise(path, None if name.endswith(".profile.json") else trt_fixtures / name)
    try:
        parse_timing(path)
    except PipelineError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(["Name", "LayerType", "Inputs", "Outputs", "Metadata", "Layers", "Origin", "Dimensions", "Format/Datatype", "Datatype", "I/O Tensors", "Bindings", "count", "name", "averageMs", "timeMs"]) | st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


@FUZZ
@given(value=json_values)
def test_fuzz_json_structures(tmp_path, value):
    exercise(write(tmp_path, json.dumps({"Layers": value} if isinstance(value, list) else value)))
    try:
        parse_timing(write(tmp_path, json.dumps(value), "p.json"))
    except PipelineError:
        pass
