"""trtexec --exportProfile per-layer times on real files, merged into the layers they time."""

import json

import pytest

from trt.parsers import merge_timing, parse_layer_info, parse_timing

PAIRS = [
    ("trt852_namesonly_yolo_qdq_int8.layers.json", "trt852_namesonly_yolo_qdq_int8.profile.json"),
    ("trex_tf_resnet50_RTX3090_fp16.graph.json", "trex_tf_resnet50_RTX3090_fp16.profile.json"),
    ("trex_tf_resnet50_RTX3090_qat_int8.graph.json", "trex_tf_resnet50_RTX3090_qat_int8.profile.json"),
]


@pytest.mark.parametrize(("layers", "profile"), PAIRS)
def test_profile_records_land_on_their_layers(trt_fixtures, layers, profile):
    records = [r for r in json.loads((trt_fixtures / profile).read_text()) if "name" in r]
    plan = parse_layer_info(trt_fixtures / layers)
    timing = parse_timing(trt_fixtures / profile)
    assert [(t.name, t.average_ms) for t in timing] == [(r["name"], r["averageMs"]) for r in records]
    unmatched = merge_timing(plan, timing)
    names = {layer.name for layer in plan.layers}
    assert unmatched == [r["name"] for r in records if r["name"] not in names]
    assert sum(layer.time_ms for layer in plan.layers if layer.time_ms is not None) == pytest.approx(sum(r["averageMs"] for r in records if r["name"] in names))


def test_names_are_read_verbatim_when_not_valid_json(tmp_path, trt_fixtures):
    """trtexec writes names without escaping: a quote or backslash in a name makes the file invalid JSON."""
    text = (trt_fixtures / "trt852_namesonly_yolo_qdq_int8.profile.json").read_text()
    broken = text.replace('"/neck/Resize"', '"/neck/Resize "quoted" \\ back"', 1)
    assert broken != text
    path = tmp_path / "profile.json"
    path.write_text(broken)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
    records = parse_timing(path)
    names = [r.name for r in records]
    assert '/neck/Resize "quoted" \\ back' in names and len(names) == text.count('"name"')
    assert [r.average_ms for r in records] == [r["averageMs"] for r in json.loads(text) if "name" in r]


def test_second_profile_names_merge_by_name(tmp_path, trt_fixtures):
    """Layers of a second optimization profile carry ` [profile 1]`; their times merge by that name."""
    plan = parse_layer_info(trt_fixtures / "trt10.16_engineinspector_oneline_fp16_2profiles.log")
    name = next(layer.name for layer in plan.layers if layer.profile == 1 and not layer.myelin)
    timing = tmp_path / "p.json"
    timing.write_text(json.dumps([{"count": 3}, {"name": name, "timeMs": 3.0, "averageMs": 1.0, "medianMs": 1.0, "percentage": 50.0}]))
    assert merge_timing(plan, parse_timing(timing)) == []
    assert [(layer.name, layer.profile, layer.time_ms) for layer in plan.layers if layer.time_ms is not None] == [(name, 1, 1.0)]
