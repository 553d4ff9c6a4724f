"""Verdicts lead with the answer (issue 27, item 5): the first line of `diff` and `report` on real
TensorRT files says what a user asked (is B faster, what stayed in float, where is it split), and the
caveats and how the engines were joined come after it."""

from conftest import TRT_DATA, run_cli

RESNET50 = "trex_tf_resnet50_RTX3090_{}.{}.json"


def first_line(*args: str) -> str:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[0]


def test_resnet50_int8_against_fp16_opens_with_the_speed_what_stayed_in_float_and_the_qdq_layers():
    from trt.diff import diff_from_files

    files = {(prec, kind): str(TRT_DATA / RESNET50.format(prec, kind)) for prec in ("fp16", "qat_int8") for kind in ("graph", "profile")}
    line = first_line("diff", files["fp16", "graph"], files["qat_int8", "graph"], "--timing-a", files["fp16", "profile"], "--timing-b", files["qat_int8", "profile"])
    diff = diff_from_files(files["fp16", "graph"], files["qat_int8", "graph"], timing_a=files["fp16", "profile"], timing_b=files["qat_int8", "profile"])
    time = diff.totals["total_time_ms"]
    assert time.b < time.a
    answer, how = line.split(" How: ")
    assert answer.startswith(f"B (INT8) is faster: {time.b:.3g} ms of layer time where A (FP16) takes {time.a:.3g} ms ({time.b / time.a:.2f}x)")
    float_regions = [r for r in diff.aligned if r.b and r.b.precision != "INT8"]
    assert f"; {len(float_regions)} of " in answer and "compute regions stayed in FP32" in answer
    assert answer.endswith(f"{len(diff.b.breakdown.qdq_layers)} standalone Q/DQ layer in B (INT8).")
    assert how.startswith("the engines share too few ONNX node names to join")


def test_resnet18_without_times_says_how_to_get_them_before_how_it_joined():
    line = first_line("diff", str(TRT_DATA / "trex_resnet18_A100_fp16.graph.json"), str(TRT_DATA / "trex_resnet18_A100_qat_int8.graph.json"))
    assert line.startswith("B (INT8) has 37 layers where A (FP16) has 36 (no layer times: give --timing-a/--timing-b")
    assert line.index("10 standalone Q/DQ layers") < line.index("How: ")


def test_a_names_only_report_gives_the_regions_first_and_the_listing_caveat_last():
    line = first_line("report", str(TRT_DATA / "trt852_namesonly_yolo_qdq_int8.layers.json"))
    answer, caveat = line.split("; ")
    assert answer == "INT8 engine: the network runs as 2 Myelin regions and 80 other layers, 12 of them standalone Q/DQ layers (plus 4 reformat/copy layers)"
    assert caveat.startswith("each Myelin region is listed as one ForeignNode layer, not its kernels")
