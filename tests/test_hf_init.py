"""`init --hf MODEL_TYPE` writes a config the architecture accepts (issue 38): per-stage and per-layer
lists cut together, rotary dims within the head, seq max within the positions the model takes; the
model is built and run before the profile is written, and one that does not run is refused in one
line. The sweep over every model type (bench/hf_sweep.py) runs here on a fixed sample."""

import importlib.util
import json
import os
import subprocess
import sys

import onnx
import pytest
from conftest import REPO, run_cli

from pipeline.core.errors import InputError
from pipeline.core.profiles import load_profile
from pipeline.core.samples import make_inputs

pytest.importorskip("transformers")
import torch  # noqa: E402


def init_profile(tmp_path, model_type: str, task: str = "base"):
    from pipeline.models.starter import starter_profile

    path = tmp_path / f"{model_type}.toml"
    path.write_text(starter_profile(model_type, task, model_type, tmp_path))
    return load_profile(str(path))


def runs_at_max(profile) -> None:
    """The model the written profile describes, built anew, runs on inputs at the profile's max dims."""
    from pipeline.models.decoder import prepare
    from pipeline.models.hf import load_hf_model

    model, export_profile = prepare(load_hf_model(profile), profile)
    with torch.no_grad():
        model(*(torch.from_numpy(a) for a in make_inputs(export_profile, seed=3, which="max").values()))


@pytest.mark.parametrize(("model_type", "lists"), [("mobilevit", {"hidden_sizes": 3}), ("levit", {"hidden_sizes": 3, "depths": 3})])
def test_a_fixed_stage_count_keeps_its_lists_at_their_length(tmp_path, model_type, lists):
    """mobilevit's three transformer stages and levit's down_ops (one per stage boundary) refuse two stages: init retries
    with the per-stage lists at their own length (the widths and depths stay small) instead of refusing."""
    from transformers import AutoConfig

    profile = init_profile(tmp_path, model_type)
    fields = dict(profile.model.hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert {key: len(getattr(config, key)) for key in lists} == lists
    runs_at_max(profile)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("gpt_neo", {"num_layers": 2, "attention_layers": ["global", "local"]}),  # the default's 12 runs of 2: 24 layers
        ("segformer", {"num_encoder_blocks": 2, "depths": [1, 1], "hidden_sizes": [32, 64], "num_attention_heads": [1, 2], "sr_ratios": [8, 4]}),
        ("gptj", {"n_embd": 64, "n_head": 4, "rotary_dim": 16}),  # 64 by default: wider than a head of 16
        ("convnext", {"num_stages": 2, "hidden_sizes": [96, 192], "depths": [1, 1], "out_features": ["stage2"]}),
        ("swin", {"num_layers": 2, "depths": [1, 1], "num_heads": [3, 6]}),  # one head count per stage, not init's 4
        ("xlnet", {"d_model": 64, "n_head": 4, "d_head": 16}),  # d_head 64 by default; no position limit (max_position_embeddings -1)
        ("funnel", {"d_head": 16, "block_sizes": [4, 4]}),  # and two base classes: from_config needs the first named
        ("glm4_moe_lite", {"num_attention_heads": 4, "num_key_value_heads": 4}),  # latent attention: every query head has its keys and values
    ],
)
def test_init_cuts_per_stage_and_per_layer_fields_together(tmp_path, model_type, expected):
    from transformers import AutoConfig

    profile = init_profile(tmp_path, model_type)
    fields = dict(profile.model.hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert {key: getattr(config, key) for key in expected} == expected
    runs_at_max(profile)


@pytest.mark.parametrize(("model_type", "full_layer"), [("gemma4_text", {"head_dim": 32}), ("embedding_gemma2_text", {"head_dim": 32, "num_key_value_heads": 1})])
def test_a_heterogeneous_config_keeps_its_per_layer_sizes_scaled_on_the_layer_of_their_type(tmp_path, model_type, full_layer):
    """Gemma 4's full-attention layers (its 6th, 12th, ...) have a head twice as wide as the global one (and the embedding
    model one KV head): the global per-layer attributes cannot even be read, which was an internal error. The small config's
    full-attention layer (its 2nd) keeps those overrides, scaled as the global sizes were; its cache is read from the model."""
    from transformers import AutoConfig

    profile = init_profile(tmp_path, model_type)
    fields = dict(profile.model.hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert {key: getattr(config.per_layer_config[1], key) for key in full_layer} == full_layer
    assert config.per_layer_config[0].head_dim == 16
    cache = {spec.name: list(spec.shape) for spec in profile.inputs if spec.name.startswith("past_key_values")}
    if cache:  # the decoder: its full-attention layer's cache is as wide as that layer's head
        assert cache["past_key_values.1.key"][-1] == 32 and cache["past_key_values.0.key"][-1] == 16
    runs_at_max(profile)


@pytest.mark.parametrize("model_type", ["qwen2_vl_text", "glm4v_text"])
def test_init_splits_a_multimodal_rotary_embedding_within_the_small_head(tmp_path, model_type):
    """Qwen2-VL's language model splits its rotary frequencies into time, height and width sections, [16, 24, 24] for a
    128-wide head in its modeling code: a 16-wide head refused it ("split_with_sizes expects split_sizes to sum exactly to
    8"), and the composite model's refusal points its users at exactly this init."""
    from transformers import AutoConfig

    profile = init_profile(tmp_path, model_type)
    fields = dict(profile.model.hf_config)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    rotary = int(16 * config.rope_parameters.get("partial_rotary_factor", 1.0))
    assert sum(config.rope_parameters["mrope_section"]) == rotary // 2
    runs_at_max(profile)


@pytest.mark.parametrize("model_type", ["xlm-roberta", "mpnet"])
def test_init_seq_max_is_the_longest_the_model_takes(tmp_path, model_type):
    """Their positions start after the padding index (1): 256 positions hold 254 tokens, found by trying."""
    profile = init_profile(tmp_path, model_type)
    assert profile.model.hf_config["max_position_embeddings"] == 256 and profile.dims["seq"].max == 254
    assert "the longest sequence" in (tmp_path / f"{model_type}.toml").read_text()
    runs_at_max(profile)


def test_init_caps_the_image_of_a_small_config_and_its_export_runs(tmp_path):
    """EfficientNet's default 600x600 becomes 224 in the small config; a convnext profile exports."""
    from transformers import AutoConfig

    from pipeline.export import export_model
    from pipeline.models.size import small_config_fields

    assert small_config_fields(AutoConfig.for_model("efficientnet"))["image_size"] == 224
    profile = init_profile(tmp_path, "convnext")
    assert [s.shape for s in profile.inputs] == [["batch", 3, 224, 224]]
    result = export_model(profile, tmp_path / "m.onnx", exporter="torchscript")
    assert result.outputs == ["last_hidden_state", "pooler_output"]


def test_a_mixture_of_experts_whose_routing_cannot_run_on_meta_is_tried_on_the_cpu(monkeypatch):
    """init first looks for a KV cache on the meta device; a MoE's routing cannot run there and read as no cache, so a
    small MoE over CPU_TRY_PARAMETERS (axk1's, 77M) got an encoder's dims, which init then refused itself. Here the
    limit is lowered to put Mixtral's small config over it."""
    import transformers

    from pipeline.models import starter
    from pipeline.models.size import small_config_fields

    config = transformers.AutoConfig.for_model("mixtral", **small_config_fields(transformers.AutoConfig.for_model("mixtral")))
    monkeypatch.setattr(starter, "CPU_TRY_PARAMETERS", 0)
    assert starter._returns_cache(transformers.MixtralModel, config, small=True)
    assert not starter._returns_cache(transformers.MixtralModel, config, small=False)  # a real-sized config is not built


def test_a_small_mixture_of_experts_has_small_experts():
    """AXK1's 192 experts kept their default width (moe_intermediate_size 2048): 77M parameters in the small config, and
    init refused it for memory (24 GiB at batch 16). Every feed-forward width is cut to intermediate_size's."""
    import transformers

    from pipeline.models.size import SMALL_CONFIG, count_parameters, small_config_fields

    fields = small_config_fields(transformers.AutoConfig.for_model("axk1"))
    assert fields["moe_intermediate_size"] == fields["intermediate_size"] == SMALL_CONFIG["intermediate_size"]
    assert count_parameters(transformers.AutoModel, transformers.AutoConfig.for_model("axk1", **fields)) < 10_000_000
    shared = small_config_fields(transformers.AutoConfig.for_model("qwen2_moe"))["shared_expert_intermediate_size"]
    assert shared == SMALL_CONFIG["intermediate_size"], "Qwen2-MoE's shared expert (5632 wide by default) too"


def test_a_cache_shared_by_the_last_layers_is_scaled_to_the_small_depth_and_refused_by_name(tmp_path):
    """Gemma 3n: its last 15 of 35 layers reuse an earlier layer's cache. Kept at 15 against 2 layers, every layer shared
    one and the config refused itself ("The set of layer types producing a cache is different ..."). Scaled, the small
    model runs, returning a cache whose second layer is a DummyLayer, which the with-past export refuses by name."""
    import transformers

    from pipeline.models.size import small_config_fields

    fields = small_config_fields(transformers.AutoConfig.for_model("gemma3n_text"))
    assert fields["num_kv_shared_layers"] == 1 and fields["num_hidden_layers"] == 2
    config = transformers.AutoConfig.for_model("gemma3n_text", **fields)
    assert [type(layer).__name__ for layer in transformers.AutoModel.from_config(config)(input_ids=torch.ones(1, 4, dtype=torch.long),
                                                                                          use_cache=True).past_key_values.layers][1] == "DummyLayer"
    made = run_cli("init", "--hf", "gemma3n_text", "-o", str(tmp_path / "g.toml"))
    assert made.returncode == 2 and len(made.stderr.strip().splitlines()) == 1 and not (tmp_path / "g.toml").exists(), made.stderr
    assert "reuses an earlier layer's cache (KV sharing)" in made.stderr


def test_a_config_drawing_its_weights_near_zero_gets_the_usual_std(tmp_path):
    """SAM's vision config defaults initializer_range to 1e-10: its random weights made every output near 1e-20, under
    FP16's smallest value, and the FP16 check read cosine 0. The small config draws with 0.02, and the outputs are
    of the size a LayerNorm gives."""
    from pipeline.models.hf import load_hf_model

    profile = init_profile(tmp_path, "sam_vision_model")
    assert profile.model.hf_config["initializer_range"] == 0.02
    feeds = {name: torch.from_numpy(array) for name, array in make_inputs(profile, seed=0).items()}
    with torch.no_grad():
        output = load_hf_model(profile)(**feeds).last_hidden_state
    assert 0.1 < float(output.abs().max()) < 100


@pytest.mark.parametrize("model_type", ["videomae", "timesformer"])
def test_a_video_model_takes_its_frames_before_the_channels(tmp_path, model_type):
    """VideoMAE and TimeSformer take pixel_values [batch, frames, channels, height, width]: init wrote an image's 4-D
    input and refused its own profile ("not enough values to unpack (expected 5, got 4)")."""
    from pipeline.models.hf import load_hf_model

    profile = init_profile(tmp_path, model_type)
    frames = {"videomae": 16, "timesformer": 8}[model_type]
    assert [list(spec.shape) for spec in profile.inputs] == [["batch", frames, 3, 224, 224]]
    feeds = {name: torch.from_numpy(array) for name, array in make_inputs(profile, seed=0, dims={"batch": 1}).items()}
    with torch.no_grad():
        assert load_hf_model(profile)(**feeds).last_hidden_state.shape[0] == 1


def test_a_forward_drawing_its_masking_noise_is_fed_it_and_exports_deterministic(tmp_path):
    """ViTMAE draws its masking noise with torch.rand unless passed `noise`: its export was refused (RandomUniformLike).
    init sees the draw [batch, patches] in its trial run and adds the input; fed, two runs agree and the export has no
    random node. HieraModel takes `noise` but draws none: no input is added."""
    from pipeline.export import export_model

    profile = init_profile(tmp_path, "vit_mae")
    noise = [spec for spec in profile.inputs if spec.name == "noise"]
    assert [(spec.shape, spec.range) for spec in noise] == [(["batch", (224 // 16) ** 2], (0.0, 1.0))]
    export_model(profile, tmp_path / "m.onnx")  # checked against torch: refused when the outputs differ
    model = onnx.load(tmp_path / "m.onnx")
    assert "noise" in [value.name for value in model.graph.input]
    assert not {node.op_type for node in model.graph.node} & {"RandomUniform", "RandomUniformLike"}
    assert "noise" not in [spec.name for spec in init_profile(tmp_path, "hiera").inputs]


def test_a_waveform_encoder_takes_raw_audio_from_its_shortest_frame_to_two_seconds(tmp_path):
    """wav2vec2's family (HuBERT, WavLM, data2vec-audio, ...) takes input_values [batch, samples]: init refused them
    ("takes neither input_ids nor pixel_values"). The samples run from a tenth of a second (or the fewest its feature
    encoder turns into one frame, where more: 400 for 7 convolutions, kernels 10, 3, ..., strides 5, 2, ...) to two
    seconds at 16 kHz."""
    from pipeline.models.decoder import autocast_feeds
    from pipeline.models.hf import load_hf_model

    profile = init_profile(tmp_path, "wav2vec2")
    assert [(spec.name, list(spec.shape)) for spec in profile.inputs] == [("input_values", ["batch", "samples"])]
    samples = profile.dims["samples"]
    assert (samples.min, samples.opt, samples.max) == (1600, 16000, 32000)  # a tenth of a second, above the shortest frame
    model = load_hf_model(profile)
    with torch.no_grad():
        assert model(input_values=torch.zeros(1, 400)).last_hidden_state.shape[1] == 1  # the encoder's shortest frame
        with pytest.raises(RuntimeError):  # one sample fewer makes no frame
            model(input_values=torch.zeros(1, 399))
    # AutoCast's FP32 reference run gives each dynamic dim 1 on its own inputs: it gets the profile's, at min
    assert autocast_feeds(profile)["input_values"].shape == (1, 1600)


def test_a_router_its_init_leaves_at_zero_is_drawn_so_experts_are_chosen_by_score_not_tie_order(tmp_path):
    """AFMoE zero-initializes its router: every expert scored 0.5, top-6 of 64 went by TopK's tie order, which torch and
    onnxruntime break differently, and the export check read 1.07 off torch. Drawn, the scores differ."""
    from pipeline.models.hf import load_hf_model

    model = load_hf_model(init_profile(tmp_path, "afmoe"))
    router = model.layers[1].mlp.router
    logits = []
    router.register_forward_hook(lambda module, inputs, output: logits.append(output[0]))
    with torch.no_grad():
        model(input_ids=torch.randint(0, 1000, (2, 8)))
    scores = torch.sigmoid(logits[0]).sort(dim=1, descending=True).values
    assert float((scores[:, 5] - scores[:, 6]).min()) > 0  # the 6th and 7th experts no longer tie


def test_init_refuses_a_model_that_does_not_run_in_one_line(tmp_path):
    """A vision-language model (LLaVA: its images stand in for image tokens the random prompt does not hold) is refused
    naming why and its parts, exit 2, nothing written."""
    with pytest.raises(InputError) as refused:
        init_profile(tmp_path, "llava")
    assert str(refused.value).startswith("init --hf llava: ") and "\n" not in str(refused.value)
    assert "Image features and image tokens do not match" in str(refused.value)
    assert "it combines models (vision_config is clip_vision_model, text_config is llama)" in str(refused.value)
    made = run_cli("init", "--hf", "llava", "-o", str(tmp_path / "llava-cli.toml"))
    assert made.returncode == 2 and "Traceback" not in made.stderr and len(made.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "llava-cli.toml").exists()


def test_init_writes_a_dual_encoder_small_in_each_part_with_texts_and_images(tmp_path):
    """CLIP's config is two models (text_config, vision_config) and its forward takes token ids and images: init was
    refused ("no attribute num_channels"). It writes each part small, the text inputs within the text part's vocabulary
    and the images at the vision part's channels and size, and the model runs on them."""
    from pipeline.models.hf import load_hf_model

    profile = init_profile(tmp_path, "clip")
    fields = profile.model.hf_config
    assert fields["text_config"]["hidden_size"] == fields["vision_config"]["hidden_size"] == 64
    assert [(spec.name, list(spec.shape)) for spec in profile.inputs] == [("input_ids", ["batch", "seq"]), ("attention_mask", ["batch", "seq"]),
                                                                        ("pixel_values", ["batch", 3, 224, 224])]
    assert profile.inputs[0].range[1] == fields["text_config"]["vocab_size"] == 1000
    assert sum(p.numel() for p in load_hf_model(profile).parameters()) < 2_000_000


# ---------------------------------------------------------------- the sweep (bench/hf_sweep.py)


def sweep_module():
    spec = importlib.util.spec_from_file_location("bench_hf_sweep", REPO / "bench" / "hf_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_sample_inits_and_exports(tmp_path):
    """CI's sample of the sweep: init and build --until export as a user runs them; no internal error. One decoder
    (its cache derived), the encoders' init and export having tests of their own (CI's time)."""
    results = tmp_path / "sweep.json"
    run = subprocess.run([sys.executable, str(REPO / "bench" / "hf_sweep.py"), "--types", "gptj", "--until", "export",
                          "--results", str(results)], cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    runs = json.loads(results.read_text())["runs"]
    assert sorted(runs) == ["gptj"]
    for model_type, record in runs.items():
        assert record["init"]["status"] == "ok", (model_type, record["init"]["line"])
        assert record["build"]["status"] == "ok" and record["build"]["stages"]["export"]["status"] == "done", (model_type, record["build"])
        assert "max_abs_diff=" in record["build"]["stages"]["export"]["line"]


def test_the_sweep_covers_every_type_a_task_maps_and_docs_show_the_recorded_results():
    import transformers

    sweep = sweep_module()
    types = sweep.model_types()
    assert types["bert"] == "base" and types["gpt2"] == "base" and len(types) > 500
    results = json.loads(sweep.RESULTS.read_text())
    assert results["transformers"] == transformers.__version__ and results["types_supported"] == len(types)
    assert not [t for t, r in results["runs"].items() if r["init"]["status"] == "internal"], "init: no internal error on any type"
    text = (REPO / "docs" / "models.md").read_text()
    assert text[text.index(sweep.START) + len(sweep.START): text.index(sweep.END)] == "\n" + sweep.table(results)


def test_init_names_the_exporter_that_exports_swin(tmp_path):
    """The dynamo exporter cannot decompose Swin at a dynamic batch; init's export trial finds the torchscript exporter
    exports and verifies, and writes it with dynamo's reason (the build then exports: no refusal to act on by hand)."""
    profile = init_profile(tmp_path, "swin")
    assert profile.export.exporter == "torchscript"
    assert "# torchscript: the dynamo exporter could not decompose the model at its dynamic dims" in (tmp_path / "swin.toml").read_text()


def test_the_random_draw_record_reads_every_way_torch_takes_a_size():
    """torch.rand(2, 3), rand((2, 3)), rand(size=...), a 0-d tensor size: the record reads each; it never raises (a
    model's call it cannot read is the model's to make)."""
    from pipeline.models.trial import random_draws

    with random_draws() as draws:
        torch.rand(2, 3)
        torch.randn((4, 5))
        torch.rand(size=(3, 3))
        torch.rand(torch.tensor(2), 3)
        torch.rand_like(torch.zeros(2))  # not torch.rand: not recorded
    assert draws == [(2, 3), (4, 5), (3, 3), (2, 3)]
