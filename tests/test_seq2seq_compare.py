"""`compare --torch` on an encoder-decoder's parts (issue 34): each part's ONNX file is compared with the wrapper its
export ran, the decoder fed the cross-attention caches the torch encoder part computes."""

import json

import numpy as np
import pytest
from conftest import run_cli, write_profile
from test_seq2seq_build import T5

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def t5_build(tmp_path_factory):
    """A small t5 built to its optimized models (OUT/encoder, OUT/decoder); the folder holding t5.toml and out/."""
    folder = tmp_path_factory.mktemp("t5")
    write_profile(folder, T5, "t5.toml")
    result = run_cli("build", "--profile", "t5.toml", "--until", "optimize", "--out", "out", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


@pytest.mark.parametrize(("part", "model"), [("encoder", "model.opt.onnx"), ("decoder", "model.opt.onnx"), ("decoder", "model.onnx")])
def test_compare_torch_checks_each_part_against_its_export_wrapper(t5_build, part, model):
    result = run_cli("compare", "--torch", f"out/{part}/{model}", "--format", "json", cwd=t5_build)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    compared = [row for row in report["rows"] if row["max_abs_diff"] is not None]
    assert report["first_diverging"] is None and report["verdict"].startswith("no mapped module exceeds")
    assert max(row["max_abs_diff"] for row in compared) < 1e-5
    names = {row["module"] for row in compared}
    if part == "decoder":  # the step's own modules, the cross-attention reading the given caches included
        assert {"decoder.block.0.layer.1.EncDecAttention.q", "decoder.block.0.layer.1.EncDecAttention", "lm_head"} <= names
        assert report["mapped"] == report["modules"] or model == "model.opt.onnx"
    else:  # the encoder, and the cross-attention projections that make the caches
        assert {"encoder.block.0.layer.0.SelfAttention", "decoder.block.0.layer.1.EncDecAttention.k", "decoder.block.0.layer.1.EncDecAttention.v"} <= names


def test_the_decoder_is_fed_the_caches_the_encoder_part_computes(t5_build, monkeypatch):
    from pipeline.cli.check import _torch_feeds, _torch_model
    from pipeline.core import seeds
    from pipeline.core.profiles import load_profile
    from pipeline.core.samples import make_inputs
    from pipeline.core.verify import OnnxSession

    monkeypatch.chdir(t5_build)
    given = load_profile("out/decoder/profile.toml")
    module, decoder = _torch_model(given, t5_build / "out/decoder/model.onnx")
    feeds = _torch_feeds(given, decoder, module, t5_build / "out/decoder/model.onnx", None)
    assert list(feeds) == [spec.name for spec in decoder.inputs]
    encoder_inputs = make_inputs(given, seed=seeds.COMPARE)
    encoded = OnnxSession(t5_build / "out/encoder/model.onnx").run_named(encoder_inputs)
    np.testing.assert_allclose(feeds["past_key_values.0.encoder.key"], encoded["present.0.encoder.key"], atol=1e-5)
    np.testing.assert_array_equal(feeds["encoder_attention_mask"], encoder_inputs["attention_mask"])


def test_the_whole_profile_means_the_part_of_the_files_folder(t5_build):
    result = run_cli("compare", "--torch", "out/decoder/model.opt.onnx", "--profile", "t5.toml", "--format", "json", cwd=t5_build)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["first_diverging"] is None
    (t5_build / "loose.onnx").write_bytes((t5_build / "out/decoder/model.onnx").read_bytes())
    refused = run_cli("compare", "--torch", "loose.onnx", "--profile", "t5.toml", cwd=t5_build)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "t5-parts is an encoder-decoder, built as two models (encoder, decoder) and compare --torch checks one" in refused.stderr
