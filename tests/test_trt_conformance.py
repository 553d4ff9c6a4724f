"""TensorRT API conformance: the project's trt/ code against the real bindings of TensorRT 10.8.0.43 (the
Docker image's), 10.13.0.35 and 11.4.0.106, with strict doubles of the factories on a simulated GPU
(tests/conformance). What a version's flags must be comes from that version's real enums (`facts`). Mutation tests
run the same scenarios on trt/build.py with one mistake made (tests/conformance/mutations.py) and check each fails for its reason."""

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest
from conformance.mutations import MUTATIONS, mutated_source, source_path
from conformance.scenarios import OLD_CACHE, PROFILE_RUNS, PROFILE_WARMUP, TIMED_RUNS, TIMING_WARMUP
from conftest import REPO, TESTS
from trt_bindings import LAYER_INFORMATION, VERSIONS

pytestmark = pytest.mark.conformance
EVERY_VERSION = pytest.mark.parametrize("version", VERSIONS)
BOTH_BUILDERS = pytest.mark.parametrize("builder", ["python", "polygraphy"])


def outcome(conformance, version: str, scenario: str) -> dict:
    return conformance(version)[scenario]


def value(conformance, version: str, scenario: str) -> dict:
    result = outcome(conformance, version, scenario)
    assert result["error"] is None, result.get("traceback", result["error"])
    return result["value"]


def facts(conformance, version: str) -> dict:
    return value(conformance, version, "facts")


def calls(result: dict, name: str) -> list[dict]:
    return [entry["args"] | {"returns": entry.get("returns")} for entry in result["journal"] if entry.get("call") == name]


def network_flags_problem(conformance, version: str, result: dict, wanted: tuple[str, ...] = ("STRONGLY_TYPED",)) -> str | None:
    """What is wrong with the network-creation flags the code asked for, read as this version's NetworkDefinitionCreationFlag members."""
    (call,) = calls(result, "Builder.create_network")
    asked = [name for name, bit in facts(conformance, version)["NetworkDefinitionCreationFlag"].items() if call["flags"] & 1 << bit]
    return None if asked == list(wanted) else f"create_network asked TensorRT {version} for {asked}, not {list(wanted)}"


def sets(result: dict, name: str) -> list:
    return [entry["value"] for entry in result["journal"] if entry.get("set") == name]


def after_build(result: dict, key: str) -> list[dict]:
    """Journal or device-log entries after the scenario's engine was built."""
    entries = result[key]
    marks = [i for i, entry in enumerate(entries) if entry.get("mark") == "built" or entry.get("op") == "mark"]
    return entries[marks[0] + 1:]


def trtexec_median(values: list[float]) -> float:
    ordered, middle = sorted(values), len(values) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@EVERY_VERSION
def test_the_bindings_are_the_version_asked_for(conformance, version):
    assert facts(conformance, version)["version"] == version


@EVERY_VERSION
@BOTH_BUILDERS
def test_build_makes_a_strongly_typed_network_and_configures_it_from_the_profile(conformance, version, builder):
    result = outcome(conformance, version, f"{builder}_build")
    assert result["error"] is None, result.get("traceback")
    assert network_flags_problem(conformance, version, result) is None
    assert calls(result, "OnnxParser.parse_from_file")[0]["model"].endswith("tiny.onnx")
    assert sets(result, "IBuilderConfig.profiling_verbosity") == ["ProfilingVerbosity.DETAILED"]
    assert sets(result, "IBuilderConfig.builder_optimization_level") == [4]
    assert [(c["pool"], c["pool_size"]) for c in calls(result, "IBuilderConfig.set_memory_pool_limit")] == [("MemoryPoolType.WORKSPACE", 2048 << 20)]
    assert [(c["input"], c["min"], c["opt"], c["max"]) for c in calls(result, "IOptimizationProfile.set_shape")] == [("x", [1, 8], [4, 8], [16, 8])]
    flags = [c["flag"] for c in calls(result, "IBuilderConfig.set_flag")]
    # Polygraphy clears TF32 unless told: the polygraphy builder asks for it, the python builder keeps TensorRT's default
    assert flags == (["BuilderFlag.TF32"] if builder == "polygraphy" else [])
    assert not calls(result, "IBuilderConfig.clear_flag")


@EVERY_VERSION
@BOTH_BUILDERS
def test_build_writes_engine_layer_information_log_and_the_new_timing_cache(conformance, version, builder):
    result = value(conformance, version, f"{builder}_build")
    layers = LAYER_INFORMATION.read_text()
    assert result["engine"].startswith("simulated engine") and result["layers"] == layers
    assert calls(outcome(conformance, version, f"{builder}_build"), "EngineInspector.get_engine_information")[0]["format"] == "LayerInformationFormat.JSON"
    assert result["metrics"] | {"layers": None} == {"builder": builder, "tensorrt": version, "engine_bytes": len(result["engine"]), "layers": None,
                                                    "timing_cache": "reused"}
    assert result["metrics"]["layers"] == len(json.loads(layers)["Layers"])
    assert result["timing_cache"] == f"timing cache of TensorRT {version}"  # what the builder's cache serialized to
    log = result["build_log"]
    assert "[simulated] Detected 1 inputs" in log and "[simulated] Tactic selection is limited" in log
    assert "[simulated] Applying generic optimizations" not in log, "VERBOSE messages are below the profile's log_severity (info)"


@EVERY_VERSION
@BOTH_BUILDERS
def test_the_timing_cache_read_from_disk_is_the_one_the_build_uses(conformance, version, builder):
    result = outcome(conformance, version, f"{builder}_build")
    created = {c["returns"]: c["serialized_timing_cache"] for c in calls(result, "IBuilderConfig.create_timing_cache")}
    last = calls(result, "IBuilderConfig.set_timing_cache")[-1]
    assert created[last["cache"]] == "bytes:" + OLD_CACHE.decode() and last["ignore_mismatch"] is False and last["returns"] is True


@EVERY_VERSION
@BOTH_BUILDERS
def test_a_rejected_timing_cache_is_logged_and_rebuilt_from_empty(conformance, version, builder):
    result = outcome(conformance, version, f"{builder}_build_cache_rejected")
    assert result["error"] is None, result.get("traceback")
    created = {c["returns"]: c["serialized_timing_cache"] for c in calls(result, "IBuilderConfig.create_timing_cache")}
    ours = [(created[c["cache"]], c["returns"]) for c in calls(result, "IBuilderConfig.set_timing_cache")][-2:]
    assert ours == [("bytes:" + OLD_CACHE.decode(), False), ("bytes:", True)]
    built = result["value"]
    assert built["metrics"]["timing_cache"] == "rejected"
    assert "[pipeline] TensorRT rejected the timing cache" in built["build_log"] and "building with an empty cache" in built["build_log"]
    assert built["timing_cache"] == f"timing cache of TensorRT {version}", "the rejected file is replaced by the new build's cache"


@EVERY_VERSION
@BOTH_BUILDERS
def test_weak_fp16_sets_the_flag_on_10_and_is_refused_before_building_on_11(conformance, version, builder):
    result = outcome(conformance, version, f"{builder}_build_weak_fp16")
    if facts(conformance, version)["BuilderFlag.FP16"]:
        assert result["error"] is None, result.get("traceback")
        assert calls(result, "Builder.create_network")[0]["flags"] == 0, "weak typing: not a strongly typed network"
        assert "BuilderFlag.FP16" in [c["flag"] for c in calls(result, "IBuilderConfig.set_flag")]
    else:
        assert result["error"].startswith("InputError: --weak-fp16 needs TensorRT 10.x; TensorRT 11.x removed weak typing")
        assert not [entry for entry in result["journal"] if entry.get("call") == "Builder"], "nothing may be built once the version rules it out"


@EVERY_VERSION
@BOTH_BUILDERS
def test_parser_errors_name_the_node_in_one_line_and_nothing_is_written(conformance, version, builder):
    result = outcome(conformance, version, f"{builder}_build_parser_errors")
    assert result["error"].startswith("StageFailed: ") and "\n" not in result["error"]
    assert "/block/FancyOp" in result["error"] and "No importer registered for op: FancyOp" in result["error"]
    assert not calls(result, "Builder.build_serialized_network")
    assert not [entry for entry in result["device"] if entry["op"] == "malloc"]


@EVERY_VERSION
def test_profile_warms_up_then_profiles_every_layer_as_trtexec_reports_it(conformance, version):
    result = outcome(conformance, version, "profile")
    profiled = value(conformance, version, "profile")
    journal = after_build(result, "journal")
    attached = next(i for i, entry in enumerate(journal) if entry.get("set") == "IExecutionContext.profiler")
    runs = [i for i, entry in enumerate(journal) if entry.get("call") == "IExecutionContext.execute_async_v3"]
    assert (sum(i < attached for i in runs), sum(i > attached for i in runs)) == (PROFILE_WARMUP, PROFILE_RUNS)
    assert all(entry["returns"] is True for entry in journal if entry.get("call") == "IExecutionContext.execute_async_v3")
    reports = defaultdict(list)
    for layer, ms in result["reports"]:
        reports[layer].append(ms)
    header, rows = profiled["profile"][0], profiled["profile"][1:]
    assert header == {"count": PROFILE_RUNS} and profiled["layers"] == len(rows) == len(profiled["engine_layers"])
    assert [row["name"] for row in rows] == profiled["engine_layers"]
    total = sum(map(sum, reports.values()))
    for row in rows:
        times = reports[row["name"]]
        assert len(times) == PROFILE_RUNS
        assert row["timeMs"] == pytest.approx(sum(times)) and row["averageMs"] == pytest.approx(sum(times) / len(times))
        assert row["medianMs"] == pytest.approx(trtexec_median(times)) and row["percentage"] == pytest.approx(100 * sum(times) / total)
    assert any(row["medianMs"] != pytest.approx(sorted(reports[row["name"]])[PROFILE_RUNS // 2]) for row in rows), \
        "the data must tell trtexec's median (mean of the two middle values) from the upper middle value"


@EVERY_VERSION
@pytest.mark.parametrize(("scenario", "expected"), [
    ("profile_one_layer_short", "9 of 9 layers reported, 1 of them fewer than 6 times; e.g. 'node_max_pool2d' reported 4 times"),
    ("profile_no_reports", "0 of 9 layers reported"),
])
def test_a_profile_short_of_reports_fails_in_one_line_and_is_not_written(conformance, version, scenario, expected):
    result = value(conformance, version, scenario)
    assert expected in result["failed"] and "\n" not in result["failed"] and "IProfiler.report_layer_time raises" in result["failed"]
    assert result["written"] is False


@EVERY_VERSION
def test_timing_brackets_each_run_with_cuda_events_after_the_warmup(conformance, version):
    result = value(conformance, version, "timing")
    assert result["times"] == pytest.approx(result["run_latencies"][TIMING_WARMUP:])
    assert len(result["run_latencies"]) == TIMING_WARMUP + TIMED_RUNS
    assert result["steps"] == [[step, TIMED_RUNS] for step in range(1, TIMED_RUNS + 1)]
    records = [entry["args"]["stream"] for entry in after_build(outcome(conformance, version, "timing"), "journal") if entry.get("call") == "Event.record"]
    assert len(records) == 2 * TIMED_RUNS and len(set(records)) == 1, "both events on the inference stream"


@EVERY_VERSION
@pytest.mark.parametrize("scenario", ["profile", "timing"])
def test_inputs_are_copied_on_the_stream_the_engine_runs_on(conformance, version, scenario):
    result = outcome(conformance, version, scenario)
    assert result["error"] is None and result["hazards"] == []
    device = after_build(result, "device")
    copies = [entry for entry in device if entry["op"] == "copy to device"]
    runs = [entry for entry in device if entry["op"] == "enqueue"]
    inference = {entry["stream"] for entry in runs}
    assert len(inference) == 1 and copies and {entry["stream"] for entry in copies} == inference
    assert device.index(copies[-1]) < device.index(runs[0])
    stream = next(entry for entry in device if entry["op"] == "create_stream" and entry["stream"] in inference)
    assert stream["non_blocking"] is True


@EVERY_VERSION
def test_the_harness_sees_the_race_the_old_buffers_had(conformance, version):
    """Copy on the default stream, run on a non-blocking stream (what `_Buffers` did): the simulated GPU flags it."""
    result = outcome(conformance, version, "bite_race")
    assert result["error"] is None
    assert len(result["hazards"]) == 1 and "written on stream 0x0 with no synchronization" in result["hazards"][0]


@EVERY_VERSION
def test_bf16_and_fp8_outputs_get_buffers_of_their_size_and_the_accuracy_check_says_why_it_skips(conformance, version):
    result = outcome(conformance, version, "odd_output_types")
    assert result["error"] is None, result.get("traceback")
    assert result["value"]["profiled_layers"] == 9 and result["value"]["timed_runs"] == TIMED_RUNS
    sizes = [entry["bytes"] for entry in after_build(result, "device") if entry["op"] == "malloc"]
    batch, width = 4, 4
    assert sizes[:3] == [batch * 8 * 4, batch * width * 2, batch * width * 1], "x FP32, y BF16 (2 bytes), z FP8 (1 byte)"
    assert "no numpy type" in result["value"]["not_compared"] and "bfloat16" in result["value"]["not_compared"]


@EVERY_VERSION
def test_engine_accuracy_compares_the_engine_with_onnxruntime_fp32_through_polygraphy(conformance, version):
    result = outcome(conformance, version, "accuracy")
    checked = value(conformance, version, "accuracy")
    assert checked["not_compared"] == "" and checked["samples"] == 3
    assert checked["onnx_equals_onnxruntime"] and checked["engine_equals_rounded"]
    figures = checked["figures"]
    assert figures["max_abs_diff"] == checked["independent_max_abs_diff"] > 0
    assert 0.9999 < figures["cosine_centered"] < 1.0
    journal = after_build(result, "journal")
    assert len([e for e in journal if e.get("call") == "IExecutionContext.execute_async_v3"]) == 3, "one engine run per held-out sample"
    assert result["hazards"] == []


@EVERY_VERSION
@BOTH_BUILDERS
def test_the_build_stage_records_the_engine_and_its_accuracy_in_the_manifest(conformance, version, builder):
    result = value(conformance, version, f"stage_{builder}")
    assert result["exit"] == 0
    stages = result["stages"]
    assert [stages[name]["status"] for name in ("build", "report", "bench")] == ["done", "done", "done"]
    built = stages["build"]["metrics"]["fp32"]
    assert (built["builder"], built["tensorrt"], built["profiled_layers"]) == (builder, version, 9)
    accuracy = built["accuracy"]
    assert accuracy["samples"] == 3 and 0 < accuracy["max_abs_diff"] < 1e-3 and 0.9999 < accuracy["cosine_centered"] < 1.0
    assert stages["bench"]["metrics"]["fp32"] > 0
    assert {"fp32.engine", "fp32.layers.json", "fp32.profile.json", "fp32.build.log", "timing.cache", "bench.trt.json"} <= set(result["files"])
    assert "[simulated] Detected 1 inputs" in result["fp32_build_log"]
    assert outcome(conformance, version, f"stage_{builder}")["hazards"] == []


@EVERY_VERSION
@pytest.mark.parametrize(("scenario", "error"), [
    ("bite_removed_method", "AttributeError: Mock object has no attribute 'build_engine'"),
    ("bite_read_only_property", "AttributeError: property of"),
    ("bite_missing_argument", "TypeError: IBuilderConfig.set_timing_cache(): incompatible function arguments"),
    ("bite_wrong_type", "TypeError: IBuilderConfig.profiling_verbosity: incompatible property value 'detailed'"),
    ("bite_misspelt_method", "AttributeError: Mock object has no attribute 'set_memory_pool_limits'"),
])
def test_wrong_calls_fail_on_every_version(conformance, version, scenario, error):
    assert (outcome(conformance, version, scenario)["error"] or "accepted").startswith(error)


@EVERY_VERSION
@pytest.mark.parametrize(("scenario", "error"), [
    ("bite_fp16_flag", "AttributeError: type object 'tensorrt_bindings.tensorrt.BuilderFlag' has no attribute 'FP16'"),
    ("bite_removed_in_11", "AttributeError: Mock object has no attribute 'platform_has_fast_fp16'"),
])
def test_what_11_removed_fails_there_and_works_on_10(conformance, version, scenario, error):
    result = outcome(conformance, version, scenario)
    if facts(conformance, version)["BuilderFlag.FP16"]:
        assert result["error"] is None and result["value"] == {"accepted": True}
    else:
        assert (result["error"] or "accepted").startswith(error)


@pytest.mark.parametrize(("ci", "outcome_line"), [("", "1 skipped"), ("true", "1 failed")])
def test_without_a_compiler_the_tests_skip_here_and_fail_under_ci(tmp_path, ci, outcome_line):
    """No `cc` on PATH and an empty cache: the bindings cannot be prepared; CI=true turns the skip into a failure."""
    env = {**os.environ, "PATH": str(tmp_path), "TRT_PIPELINE_CACHE": str(tmp_path / "cache"), "CI": ci,
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(REPO)])}
    test = "tests/test_trt_conformance.py::test_the_bindings_are_the_version_asked_for[10.8.0.43]"
    run = subprocess.run([sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider", "-rsf"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert outcome_line in run.stdout and "no C compiler (cc) to build the stub TensorRT libraries" in run.stdout, run.stdout[-2000:]


@EVERY_VERSION
def test_the_trtexec_builder_runs_the_versions_command_line_and_the_stage_records_its_files(conformance, version):
    """The third implementation of the builder interface: trtexec (a stand-in on PATH hands back the simulated
    engine); its command line is the one trt/versions.py makes for this version, and the stage goes on as with
    the others (accuracy through Polygraphy, report from trtexec's per-layer profile)."""
    result = value(conformance, version, "stage_trtexec")
    assert result["exit"] == 0
    stages = result["stages"]
    assert [stages[name]["status"] for name in ("build", "report", "bench")] == ["done", "done", "done"]
    built = stages["build"]["metrics"]["fp32"]
    assert (built["builder"], built["tensorrt"]) == ("trtexec", version)
    argv = result["argv"]
    assert built["command"][1:] == argv
    strongly_typed = facts(conformance, version)["BuilderFlag.FP16"]  # 10.x needs the flags 11.x made no-ops
    assert ("--stronglyTyped" in argv, "--separateProfileRun" in argv) == (strongly_typed, strongly_typed)
    assert not {"--fp16", "--int8", "--best"} & set(argv)
    assert {"--minShapes=x:1x8", "--optShapes=x:4x8", "--maxShapes=x:16x8", "--profilingVerbosity=detailed"} <= set(argv)
    assert 0.9999 < built["accuracy"]["cosine_centered"] <= 1.0
    assert {"fp32.engine", "fp32.layers.json", "fp32.profile.json", "fp32.build.log", "timing.cache"} <= set(result["files"])
    assert "PASSED TensorRT.trtexec (simulated)" in result["fp32_build_log"]


@EVERY_VERSION
def test_a_profile_that_leaves_out_a_dynamic_input_fails_the_build_with_tensorrts_message(conformance, version):
    result = value(conformance, version, "python_build_profile_for_another_input")
    assert "TensorRT could not build an engine" in result["failed"]
    assert "[ERROR] [simulated] x: dynamic input is missing dimensions in profile 0." in result["build_log"]


@EVERY_VERSION
def test_network_flags_must_be_members_of_the_versions_enum_and_the_plugin_preferences_exclusive(conformance, version):
    members = facts(conformance, version)["NetworkDefinitionCreationFlag"]
    bit_3 = outcome(conformance, version, "bite_flag_bit_3")["error"] or "accepted"  # PREFER_AOT_PYTHON_PLUGINS in 10.13 only
    assert bit_3.startswith("accepted" if 3 in members.values() else "ValueError: Builder.create_network: flags 0x8 set bits 0x8, which name no")
    both = outcome(conformance, version, "bite_both_plugin_preferences")["error"] or "accepted"
    expected = "ValueError: Builder.create_network: PREFER_AOT_PYTHON_PLUGINS cannot be used" if "PREFER_AOT_PYTHON_PLUGINS" in members else "AttributeError"
    assert both.startswith(expected)


def test_every_mutation_edits_the_current_source():
    """A mutation whose text moved in trt/ fails here, by name, without any TensorRT bindings."""
    for name, mutation in MUTATIONS.items():
        assert mutated_source(mutation) != source_path(mutation).read_text(), name


@EVERY_VERSION
@pytest.mark.parametrize(("mutation", "failure", "logged"), [
    ("no_profile", "TensorRT could not build an engine", "[ERROR] [simulated] Network has dynamic or shape inputs, but no optimization profile has been defined."),
    ("opt_above_max", "RuntimeError: Shape provided for max is inconsistent with other shapes.", None),
    ("method_as_value", "TypeError: ParserError.node_name is a method, used here as a value (truth test): call it, node_name(...)", None),
])
def test_a_mutated_build_fails_on_every_version_for_the_rule_it_breaks(conformance, version, mutation, failure, logged):
    """The project's trt/build.py with one mistake each (tests/conformance/mutations.py). Real TensorRT refuses the first
    two on every version; the third passes silently on a GPU (a method is always true, its text "<bound method ...>"),
    the doubles refuse it."""
    result = value(conformance, version, f"mutant_{mutation}")
    assert failure in (result["failed"] or "it passed"), result
    assert logged is None or logged in result["build_log"]


@EVERY_VERSION
def test_the_10x_strongly_typed_bit_written_as_a_literal_fails_on_11_only(conformance, version):
    """`1 << 1` is STRONGLY_TYPED on 10.x; on 11.x it is PREFER_JIT_PYTHON_PLUGINS, a valid flag real TensorRT builds
    with (11.x networks are strongly typed anyway), so the build passes and the flags read by name fail."""
    result = outcome(conformance, version, "mutant_flag_bit_literal")
    assert value(conformance, version, "mutant_flag_bit_literal")["failed"] is None
    problem = network_flags_problem(conformance, version, result)
    if version.startswith("10."):
        assert problem is None
    else:
        assert problem == f"create_network asked TensorRT {version} for ['PREFER_JIT_PYTHON_PLUGINS'], not ['STRONGLY_TYPED']"
