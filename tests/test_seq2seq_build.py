"""An encoder-decoder (issue 34) as one build of two models: `init --hf` writes its profile, `build` makes the
encoder then the decoder, each in a build folder of its own (OUT/encoder, OUT/decoder) with lines naming the part,
then checks their generation together; OUT/manifest.json lists the parts and the checks, and a command given OUT
where one model's folder is needed names the part folders."""

import json
import re

import onnx
import pytest
from conftest import REPO, run_cli, write_profile

pytest.importorskip("transformers")
import torch  # noqa: E402

from pipeline.core.profiles import load_profile  # noqa: E402

T5 = """name = "t5-parts"
[model]
task = "seq2seq-lm"
hf_config = { model_type = "t5", d_model = 32, d_ff = 64, d_kv = 8, num_heads = 4, num_layers = 1, vocab_size = 128, decoder_start_token_id = 0 }
[dims]
batch = { min = 1, opt = 2, max = 4 }
seq = { min = 1, opt = 8, max = 16 }
[[inputs]]
name = "input_ids"
dtype = "int64"
shape = ["batch", "seq"]
range = [0, 128]
[[inputs]]
name = "attention_mask"
dtype = "int64"
shape = ["batch", "seq"]
fill = "mask"
"""


def stage_lines(stdout: str) -> list[list[str]]:
    """The build's stage and check lines, each as [label, name, status]."""
    return [line.split()[:3] for line in stdout.splitlines() if re.match(r"^(encoder|decoder|e2e) ", line)]


# ---------------------------------------------------------------- init


@pytest.mark.parametrize(("model_type", "task"), [("t5", "seq2seq-lm"), ("bart", "seq2seq-lm"), ("marian", "seq2seq-lm"), ("whisper", "speech2seq-lm")])
def test_init_writes_an_encoder_decoder_profile_whose_model_builds(tmp_path, model_type, task):
    from pipeline.models.hf import load_hf_model
    from pipeline.models.seq2seq_starter import run_encoder_decoder
    from pipeline.models.starter import starter_profile

    path = tmp_path / f"{model_type}.toml"
    path.write_text(starter_profile(model_type, None, model_type, tmp_path))
    profile = load_profile(str(path))
    assert profile.model.task == task and profile.encoder_decoder and profile.parts == ("encoder", "decoder")
    config = load_hf_model(profile).config
    sides = [("encoder_layers", "decoder_layers"), ("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"),
             ("num_layers", "num_decoder_layers")]
    for encoder, decoder in (pair for pair in sides if hasattr(config, pair[0])):
        assert getattr(config, encoder) == getattr(config, decoder) <= 128, (encoder, decoder)  # a small model, both sides alike
    assert config.d_model == 64 and config.vocab_size == 1000
    special = [getattr(config, key, None) for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id")]
    assert all(token is None or token < config.vocab_size for token in special)
    if task == "speech2seq-lm":
        assert [(s.name, s.shape) for s in profile.inputs] == [("input_features", ["batch", config.num_mel_bins, 2 * config.max_source_positions])]
    else:
        assert [s.name for s in profile.inputs] == ["input_ids", "attention_mask"] and profile.dims["seq"].max <= 128
    with torch.no_grad():
        run_encoder_decoder(load_hf_model(profile), profile, None)  # max dims, new_tokens decoder tokens


def test_init_refuses_another_head_of_an_encoder_decoder(tmp_path):
    result = run_cli("init", "--hf", "t5", "--task", "base", "-o", "t5.toml", cwd=tmp_path)
    assert result.returncode == 2 and "T5 is an encoder-decoder; init writes its generation model (--task seq2seq-lm" in result.stderr
    assert not (tmp_path / "t5.toml").exists()


def test_the_sweep_inits_encoder_decoders_for_generation():
    from test_hf_init import sweep_module

    types = sweep_module().model_types()
    assert [types[t] for t in ("t5", "bart", "mbart", "marian", "whisper")] == ["seq2seq-lm"] * 4 + ["speech2seq-lm"]


# ---------------------------------------------------------------- build


def test_t5_builds_encoder_then_decoder_and_checks_their_generation(tmp_path):
    profile = write_profile(tmp_path, T5, "t5.toml")
    result = run_cli("build", "--profile", str(profile), "--fp16", "--int8", "--out", "out", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr
    lines = stage_lines(result.stdout)
    parts = [label for label, _, _ in lines]
    assert parts == ["encoder"] * 8 + ["decoder"] * 8 + ["e2e"] * 3, result.stdout  # encoder first, then decoder, then the checks
    assert [name for label, name, _ in lines if label == "decoder"] == ["export", "optimize", "fp16", "int8", "build", "report", "diff", "bench"]
    assert [(name, status) for label, name, status in lines if label == "e2e"] == [("fp32", "done"), ("fp16", "done"), ("int8", "done")]
    assert re.search(r"^e2e     fp32      done .+ next tokens 100\.0% as torch's \(\d+ tokens\)$", result.stdout, re.M), result.stdout

    out = tmp_path / "out"
    top = json.loads((out / "manifest.json").read_text())
    assert top["profile"] == "t5-parts" and top["parts"] == {"encoder": "encoder", "decoder": "decoder"}
    checks = {check["precision"]: check for check in top["generation"]}
    assert list(checks) == ["fp32", "fp16", "int8"] and checks["fp32"]["metrics"]["token_agreement"] == 1.0
    assert checks["int8"]["models"] == {"encoder": "encoder/model.int8.onnx", "decoder": "decoder/model.int8.onnx"}
    assert checks["int8"]["metrics"]["min_token_agreement"] == 0.5  # the INT8 gate the decoder's stage reads
    for part in ("encoder", "decoder"):
        manifest = json.loads((out / part / "manifest.json").read_text())
        assert manifest["profile_source"] == str(out / part / "profile.toml")
        assert load_profile(str(out / part / "profile.toml")).export.part == part

    again = run_cli("build", "--profile", str(profile), "--fp16", "--int8", "--out", "out", cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stderr
    assert {status for label, _, status in stage_lines(again.stdout) if label != "e2e"} <= {"cached", "skipped"}, again.stdout

    for command in (("diff", "out"), ("bench", "out")):
        refused = run_cli(*command, cwd=tmp_path)
        assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
            "error: out holds a build of several models, each in a build folder of its own (encoder out/encoder, decoder out/decoder); "
            "pass one of those folders (to build, another --out)"], refused.stderr
    bench = run_cli("bench", "out/decoder", "--warmup", "1", "--iterations", "2", cwd=tmp_path)  # the decoder's inputs, as its export derived them
    assert bench.returncode == 0 and "past_key_values.0.encoder.key [2, 4, 8, 8]" in bench.stdout, bench.stderr
    compare = run_cli("compare", "out/decoder/model.opt.onnx", "out/decoder/model.int8.onnx", "--format", "json", cwd=tmp_path)
    assert compare.returncode == 0 and json.loads(compare.stdout), compare.stderr
    # quantize on the decoder part's file gives the stage's model: its derived inputs and the stored encoder outputs
    alone = run_cli("quantize", "out/decoder/model.opt.onnx", "-o", "alone.int8.onnx", "--int8", "--profile", "out/decoder/profile.toml", cwd=tmp_path)
    assert alone.returncode == 0 and "on the encoder output of the export's generation check" in alone.stdout, alone.stderr
    scales = [sorted((i.name, i.raw_data) for i in onnx.load(str(path)).graph.initializer if "scale" in i.name)
              for path in (tmp_path / "alone.int8.onnx", out / "decoder" / "model.int8.onnx")]
    assert scales[0] and scales[0] == scales[1]


def test_a_failed_check_in_the_encoder_does_not_keep_the_decoder_from_building(tmp_path):
    profile = write_profile(tmp_path, T5, "t5.toml")
    result = run_cli("build", "--profile", str(profile), "--int8", "--no-repair", "--min-cosine", "1", "--until", "int8", "--out", "out",
                     cwd=tmp_path, timeout=900)
    assert result.returncode == 1 and result.stderr.startswith("error: int8: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    lines = stage_lines(result.stdout)
    assert ["encoder", "int8", "failed"] in lines and ["decoder", "export", "done"] in lines and ["e2e", "fp32", "done"] in lines, result.stdout
    assert not [line for line in lines if line[:2] == ["e2e", "int8"]]  # no INT8 model in both parts: nothing to check together


def test_a_refusal_in_the_encoder_stops_the_build_and_leaves_nothing(tmp_path):
    profile = write_profile(tmp_path, T5.replace('name = "input_ids"', 'name = "input_idz"'), "t5.toml")
    result = run_cli("build", "--profile", str(profile), "--until", "export", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2 and "input_idz" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: {profile} (encoder): "), result.stderr  # the user's file, not the part's copy never written
    assert [line[:1] for line in stage_lines(result.stdout)] == [["encoder"]]  # refused in the encoder's export: the decoder never starts
    assert not (tmp_path / "out").exists()


def test_until_export_exports_both_parts_and_checks_nothing_together(tmp_path):
    profile = write_profile(tmp_path, T5, "t5.toml")
    result = run_cli("build", "--profile", str(profile), "--until", "export", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert stage_lines(result.stdout) == [["encoder", "export", "done"], ["decoder", "export", "done"]]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["generation"] == []


def test_a_profile_that_picks_a_part_is_one_model_built_as_before(tmp_path):
    profile = write_profile(tmp_path, T5 + '[export]\npart = "encoder"\n', "t5.toml")
    result = run_cli("build", "--profile", str(profile), "--until", "export", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^export    done ", result.stdout, re.M) and not stage_lines(result.stdout), result.stdout
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"][0]["name"] == "export"


@pytest.mark.parametrize(("manifest", "expect"), [
    ({"profile": "t5-parts", "profile_source": None, "stages": []}, "out holds the build of one model; t5-parts is an encoder-decoder"),
    ({"profile": "other", "parts": {"encoder": "encoder", "decoder": "decoder"}}, "records a build of profile 'other', not 't5-parts'"),
])
def test_an_output_folder_of_another_build_is_refused_before_anything_runs(tmp_path, manifest, expect):
    profile = write_profile(tmp_path, T5, "t5.toml")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli("build", "--profile", str(profile), "--out", "out", cwd=tmp_path)
    assert result.returncode == 2 and expect in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json"]


def test_docs_describe_the_build_of_an_encoder_decoder():
    text = (REPO / "docs" / "decoders.md").read_text()
    assert "OUT/encoder/" in text and "OUT/decoder/" in text and "e2e" in text
