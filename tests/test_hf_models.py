"""Hugging Face models through the pipeline (random-config models, nothing downloaded): the HF
route, outputs by name, a factory beside its profile, the FP16 shape fix, and the Q/DQ lint's
negative checks on a real HF BERT after our int8 stage. The rest of the corpus is bench/models.py."""

import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import REPO, run_cli, write_profile

from pipeline.core.errors import InputError, ProfileError
from pipeline.core.graph import GraphIndex
from pipeline.core.profiles import load_profile
from pipeline.core.qdq import LINT_RULES, mask_adds
from pipeline.core.verify import OnnxSession, run_onnx
from pipeline.export import export_model
from pipeline.models.module import flatten_outputs
from quant.lint import lint_model
from quant.patterns import attention_shapes

pytest.importorskip("transformers")
import torch  # noqa: E402

BERT_CONFIG = 'model_type = "bert"\nvocab_size = 128\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\nintermediate_size = 64\nmax_position_embeddings = 64\n'


def text_profile(name: str, model: str, seq: str = '"seq"', dims_seq: bool = True, mask_dtype: str = "int64") -> str:
    dims = "[dims.batch]\nmin = 1\nopt = 2\nmax = 8\n" + ("[dims.seq]\nmin = 4\nopt = 16\nmax = 64\n" if dims_seq else "")
    inputs = (f'[[inputs]]\nname = "input_ids"\ndtype = "int64"\nshape = ["batch", {seq}]\nrange = [0, 128]\n'
              f'[[inputs]]\nname = "attention_mask"\ndtype = "{mask_dtype}"\nshape = ["batch", {seq}]\nfill = "mask"\n')
    return f'name = "{name}"\n{model}\n{dims}{inputs}'


# ---------------------------------------------------------------- outputs


def test_outputs_are_flattened_in_a_documented_order():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    profile = load_profile("hf-bert-tiny")
    assert [n for n, _ in flatten_outputs(a, profile)] == ["output"]
    assert [n for n, _ in flatten_outputs(BaseModelOutputWithPooling(last_hidden_state=a, pooler_output=b), profile)] == ["last_hidden_state", "pooler_output"]
    assert [n for n, _ in flatten_outputs({"logits": a, "hidden_states": (b, c), "attentions": None}, profile)] == ["logits", "hidden_states_0", "hidden_states_1"]
    # MaskFormer-Swin's spatial dims (numbers) and SAM-HQ's empty list beside its tensors are no graph outputs
    assert [n for n, _ in flatten_outputs({"logits": a, "hidden_states_spatial_dimensions": ((7, 7),), "intermediate_embeddings": []}, profile)] == ["logits"]
    # FLAVA returns its image embeddings twice (image_embeddings, image_output.last_hidden_state): one output
    assert [n for n, _ in flatten_outputs({"image_embeddings": a, "image_output": {"last_hidden_state": a, "pooler_output": b}}, profile)] == [
        "image_embeddings", "image_output_pooler_output"]
    assert [n for n, _ in flatten_outputs([a, (b, c)], profile)] == ["output_0", "output_1_0", "output_1_1"]
    with pytest.raises(InputError, match="the model's output 'past' is a str, not a tensor"):
        flatten_outputs({"past": "cache"}, profile)


FACTORY_MODULE = '''
from transformers import BertConfig, BertModel


def bert():
    """A factory returning the HF model itself: forward(input_ids, attention_mask) -> ModelOutput."""
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    return BertModel(config)
'''


def test_factory_beside_its_profile_returning_a_model_output(tmp_path):
    """No PYTHONPATH: the profile's folder is on the import path for its factory; outputs keep their HF names."""
    (tmp_path / "my_models.py").write_text(FACTORY_MODULE)
    profile = write_profile(tmp_path, text_profile("mine", '[model]\nfactory = "my_models:bert"\n'))
    env_path = [p for p in sys.path if p]  # the tests' own path, not tmp_path
    result = subprocess.run([sys.executable, "-m", "pipeline", "export", "--profile", str(profile), "-o", str(tmp_path / "m.onnx")],
                            cwd=REPO, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(env_path)})
    assert result.returncode == 0, result.stderr
    assert str(tmp_path) not in env_path
    names = [o.name for o in onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.output]
    assert names == ["last_hidden_state", "pooler_output"]
    torchscript = export_model(load_profile(str(profile)), tmp_path / "ts.onnx", exporter="torchscript")
    assert torchscript.outputs == names and torchscript.max_abs_diff <= 1e-4
    feeds = {"input_ids": np.arange(10, dtype=np.int64).reshape(1, 10), "attention_mask": np.ones((1, 10), np.int64)}
    dynamo, ts = OnnxSession(tmp_path / "m.onnx").run_named(feeds), OnnxSession(tmp_path / "ts.onnx").run_named(feeds)
    assert list(dynamo) == list(ts) == names and all(np.allclose(dynamo[n], ts[n], atol=1e-5) for n in names)


# ---------------------------------------------------------------- the HF route


def test_hf_folder_saved_with_save_pretrained_loads_offline(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=3)
    saved = BertForSequenceClassification(config).eval()
    saved.save_pretrained(tmp_path / "checkpoint")
    profile = load_profile(str(write_profile(tmp_path, text_profile("folder", '[model]\nhf = "checkpoint"\ntask = "sequence-classification"\n', mask_dtype="int32"))))
    result = export_model(profile, tmp_path / "m.onnx", exporter="torchscript")
    assert result.outputs == ["logits"] and result.max_abs_diff <= 1e-4
    ids = np.random.default_rng(0).integers(0, 128, (3, 12))
    (logits,) = run_onnx(tmp_path / "m.onnx", {"input_ids": ids, "attention_mask": np.ones((3, 12), np.int32)})
    with torch.no_grad():
        expected = saved(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert logits.shape == (3, 3) and np.allclose(logits, expected, atol=1e-5), "the saved weights, not new random ones"
    from pipeline.models.hf import load_hf_model

    saved.bert.save_pretrained(tmp_path / "encoder-only")  # a checkpoint without the classifier head
    headless = load_profile(str(write_profile(tmp_path, text_profile("h", '[model]\nhf = "encoder-only"\ntask = "sequence-classification"\n'))))
    with pytest.raises(ProfileError, match=r"model.task: 2 weights of the sequence-classification model are not in 'encoder-only' \(e.g. classifier.bias\) and would be random"):
        load_hf_model(headless)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ('[model]\nhf = "./no-such-folder"\n', "model.hf: no folder "),
        ('[model]\nhf = "empty"\n', "model.hf: cannot load 'empty' as AutoModel"),
        ('[model.hf_config]\nmodel_type = "no-such-type"\n', "model.hf_config: Unrecognized model identifier: no-such-type"),
        ('[model]\ntask = "image-classification"\n[model.hf_config]\n' + BERT_CONFIG, "model.task: transformers has no image-classification model for model_type 'bert'"),
    ],
)
def test_hf_route_errors_name_the_key(tmp_path, model, expected):
    from pipeline.models.hf import load_hf_model

    (tmp_path / "empty").mkdir()  # a folder without config.json
    profile = load_profile(str(write_profile(tmp_path, text_profile("bad", model))))
    with pytest.raises(ProfileError) as info:
        load_hf_model(profile)
    assert str(info.value).startswith(str(profile.source)) and expected in str(info.value) and "\n" not in str(info.value)


def test_hf_input_names_must_be_forward_arguments(tmp_path):
    from pipeline.models.module import build_module

    text = text_profile("bad", "[model.hf_config]\n" + BERT_CONFIG).replace('name = "attention_mask"', 'name = "mask"')
    with pytest.raises(ProfileError, match="BertModel.forward has no argument 'mask'; name the \\[\\[inputs\\]\\] after its arguments: input_ids, attention_mask"):
        build_module(load_profile(str(write_profile(tmp_path, text))))


# ---------------------------------------------------------------- fp16: AutoCast's placeholder dims


def test_fp16_of_hf_bert_with_static_sequence_runs_at_every_batch(tmp_path, monkeypatch):
    """The crash of issue 9: dynamic batch, sequence 64. The stage's output runs at the profile's min,
    opt and max batch. AutoCast's raw output fails at run time on the graph optimized with its CastLikes
    kept (castlike-to-cast skipped: the stage's graph no longer triggers it); without the repair the run
    check stops that conversion with one line and writes nothing."""
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from pipeline.core.errors import StageFailed
    from quant import fp16 as fp16_module

    text = text_profile("static-seq", "[model.hf_config]\n" + BERT_CONFIG, seq="64", dims_seq=False)
    profile = write_profile(tmp_path, text)
    built = run_cli("build", "--profile", str(profile), "--fp16", "--until", "fp16", "--out", str(tmp_path / "out"))
    assert built.returncode == 0, built.stderr
    stages = {s["name"]: s for s in json.loads((tmp_path / "out" / "manifest.json").read_text())["stages"]}
    fp16 = stages["fp16"]["metrics"]
    assert fp16["placeholder_dims_repaired"] > 0
    assert [s["input_ids"] for s in fp16["runs_at_shapes"]] == [[1, 64], [2, 64], [8, 64]]
    feeds = {"input_ids": np.zeros((3, 64), np.int64), "attention_mask": np.ones((3, 64), np.int64)}
    assert run_onnx(tmp_path / "out" / "model.fp16.onnx", feeds)[0].shape == (3, 64, 32)
    from pipeline.optimize import optimize_file

    with_castlikes = tmp_path / "castlikes.opt.onnx"
    optimize_file(tmp_path / "out" / "model.onnx", with_castlikes, skip=["castlike-to-cast"])
    raw = convert_to_mixed_precision(onnx_path=str(with_castlikes), low_precision_type="fp16", keep_io_types=True, providers=["cpu"])
    onnx.save(raw, tmp_path / "raw.fp16.onnx")
    with pytest.raises(StageFailed, match="Shape mismatch attempting to re-use buffer"):
        run_onnx(tmp_path / "raw.fp16.onnx", feeds)
    monkeypatch.setattr(fp16_module, "repair_placeholder_dims", lambda model, source: 0)
    with pytest.raises(StageFailed) as info:
        fp16_module.convert_fp16(with_castlikes, tmp_path / "unrepaired.onnx", [], [], [feeds])
    assert str(info.value).startswith("fp16: the converted model does not run at input shapes {'input_ids': [3, 64], 'attention_mask': [3, 64]}")
    assert "node 'node_" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "unrepaired.onnx").exists()


def test_range_sizes_take_every_dim_to_both_ends_without_the_all_max_corner():
    from pipeline.core.samples import range_sizes

    assert range_sizes(load_profile("bert-base")) == [
        {"batch": 1, "seq": 8}, {"batch": 1, "seq": 128}, {"batch": 32, "seq": 8}, {"batch": 1, "seq": 512}]
    assert range_sizes(load_profile("bert-tiny")) == [{}]


def test_missing_transformers_is_one_line(tmp_path, monkeypatch):
    from pipeline.models.hf import load_hf_model

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ProfileError, match=re.escape('model.hf/hf_config needs transformers: pip install "transformers') + r'[<>=,.0-9]*" \(the \[hf\] extra\)'):
        load_hf_model(load_profile("hf-bert-tiny"))


# ---------------------------------------------------------------- the corpus' BERT through build --fp16 --int8, and the lint on it


@pytest.fixture(scope="module")
def hf_bert_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-bert")
    result = run_cli("build", "--profile", "hf-bert-tiny", "--fp16", "--int8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "nanobind" not in result.stderr, "lief (imported by ModelOpt) prints its leak report at exit unless quant/ptq.py quiets it"
    return out, {s["name"]: s for s in json.loads((out / "manifest.json").read_text())["stages"]}


def test_hf_bert_builds_with_named_outputs(hf_bert_build):
    out, stages = hf_bert_build
    assert stages["export"]["metrics"]["outputs"] == ["last_hidden_state", "pooler_output"]
    for name in ("model.onnx", "model.opt.onnx", "model.fp16.onnx", "model.int8.onnx"):
        assert [o.name for o in onnx.load(str(out / name), load_external_data=False).graph.output] == ["last_hidden_state", "pooler_output"], name
    assert stages["fp16"]["metrics"]["accuracy"]["cosine_centered"] >= 0.999 and stages["int8"]["metrics"]["accuracy"]["cosine_centered"] >= 0.99
    ops = [n.op_type for n in onnx.load(str(out / "model.opt.onnx"), load_external_data=False).graph.node]
    assert ops.count("LayerNormalization") == 5 and ops.count("Gelu") == 2  # embeddings + 2 per layer; 1 GELU per layer


def test_every_lint_rule_is_silent_on_hf_bert_after_our_int8_stage(hf_bert_build):
    """Negative checks on a real model for each rule, where the old lint gave false positives."""
    out, stages = hf_bert_build
    model = onnx.load(str(out / "model.int8.onnx"))
    assert stages["int8"]["metrics"]["lint"] == {"count": 0, "by_rule": {}}
    assert {rule: [f for f in lint_model(model) if f.rule == rule] for rule in LINT_RULES} == {rule: [] for rule in LINT_RULES}
    # residual-skip-not-quantized: the mask Adds before Softmax add an unquantized mask to a quantized
    # MatMul's scores (what the rule once mistook for a residual)
    producer = {o: n for n in model.graph.node for o in n.output}
    masks = mask_adds(GraphIndex.of(model))
    assert len(masks) == 2
    for add in (n for n in model.graph.node if n.name in masks):
        scores = next(producer[i] for i in add.input if producer[i].op_type == "MatMul")
        assert all(producer[i].op_type == "DequantizeLinear" for i in scores.input), "attention is INT8 here"
    # attention-not-fusable: the sequence is dynamic (None in the graph); the notes say fused attention is possible
    assert {seq for _, _, seq in attention_shapes(model)} == {None}
    assert any("fused INT8 attention is possible" in note for note in stages["int8"]["metrics"]["notes"])
    assert {f.rule for f in lint_model(model, max_sequence=1024)} == {"attention-not-fusable"}, "a known too-long sequence still fires"


def test_lint_qdq_fail_on_findings(hf_bert_build, tmp_path):
    out, _ = hf_bert_build
    clean = run_cli("lint-qdq", str(out / "model.int8.onnx"), "--fail-on-findings")
    assert clean.returncode == 0 and "0 findings" in clean.stdout
    long_sequence = ("lint-qdq", str(out / "model.int8.onnx"), "--max-sequence", "1024")
    assert run_cli(*long_sequence).returncode == 0, "findings alone keep exit 0"
    failing = run_cli(*long_sequence, "--fail-on-findings")
    assert failing.returncode == 1 and "[attention-not-fusable]" in failing.stdout


# ---------------------------------------------------------------- init --hf


def test_init_writes_a_starter_profile_that_builds(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64)).save_pretrained(tmp_path / "ckpt")
    (tmp_path / "profiles").mkdir()
    made = run_cli("init", "--hf", str(tmp_path / "ckpt"), "-o", str(tmp_path / "profiles" / "mine.toml"))
    assert made.returncode == 0, made.stderr
    profile = load_profile(str(tmp_path / "profiles" / "mine.toml"))
    assert profile.model.hf == "../ckpt" and profile.model.task == "base"
    assert [(s.name, s.dtype) for s in profile.inputs] == [("input_ids", "int64"), ("attention_mask", "int64"), ("token_type_ids", "int64")]
    assert profile.inputs[0].range == (0, 128) and profile.dims["seq"].max == 64, "from the config: vocabulary and positions"
    result = export_model(profile, tmp_path / "m.onnx", exporter="torchscript")
    assert result.outputs == ["last_hidden_state", "pooler_output"]
    again = run_cli("init", "--hf", str(tmp_path / "ckpt"), "-o", str(tmp_path / "profiles" / "mine.toml"))
    assert again.returncode == 2 and "exists" in again.stderr


def test_init_keeps_the_head_a_checkpoint_was_saved_with(tmp_path):
    """A GPT2LMHeadModel checkpoint is a causal LM (its config's architectures), not the GPT2Model under it."""
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

    from pipeline.models.starter import starter_profile

    GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(tmp_path / "lm")
    BertForSequenceClassification(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=64)).save_pretrained(tmp_path / "cls")
    tasks = {}
    for name in ("lm", "cls"):
        (tmp_path / f"{name}.toml").write_text(starter_profile(str(tmp_path / name), None, name, tmp_path))
        tasks[name] = load_profile(str(tmp_path / f"{name}.toml")).model.task
    assert tasks == {"lm": "causal-lm", "cls": "sequence-classification"}


def test_init_from_a_model_type_and_its_errors(tmp_path):
    from pipeline.models.starter import starter_profile

    (tmp_path / "vit.toml").write_text(starter_profile("vit", "image-classification", "vit", tmp_path))
    profile = load_profile(str(tmp_path / "vit.toml"))
    assert profile.model.hf_config["model_type"] == "vit" and profile.model.hf_config["hidden_size"] == 64, "init's small config"
    assert [(s.name, s.shape) for s in profile.inputs] == [("pixel_values", ["batch", 3, 224, 224])]
    with pytest.raises(InputError) as unknown:
        starter_profile("no-such-type", "base", "x", tmp_path)
    assert str(unknown.value) == ("init --hf no-such-type: neither a folder written by save_pretrained nor a model_type transformers knows "
                                  "(Unrecognized model identifier: no-such-type)")
    with pytest.raises(InputError, match="transformers has no image-classification model for model_type 'bert'; choose another --task"):
        starter_profile("bert", "image-classification", "x", tmp_path)



def test_a_random_weight_cnn_gets_the_batch_norm_statistics_of_its_own_activations(tmp_path):
    """MobileNetV2 from a config keeps BatchNorm at mean 0 / variance 1 and its init shrinks the signal
    layer after layer: outputs near 1e-21, under FP16's smallest value (its FP16 check read cosine 0).
    The model built from hf_config has its BatchNorm statistics settled on its own activations."""
    import transformers

    from pipeline.models.hf import load_hf_model

    profile = load_profile(str(write_profile(tmp_path, 'name = "mnv2"\n[model]\nseed = 0\n[model.hf_config]\nmodel_type = "mobilenet_v2"\n'
                                             'image_size = 64\n[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n[[inputs]]\nname = "pixel_values"\n'
                                             'dtype = "float32"\nshape = ["batch", 3, 64, 64]\n')))
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    fresh = transformers.AutoModel.from_config(transformers.AutoConfig.for_model("mobilenet_v2", image_size=64)).eval()
    torch.manual_seed(0)
    settled = load_hf_model(profile)
    with torch.no_grad():
        assert float(fresh(pixel_values=images).last_hidden_state.abs().max()) < 1e-10
        assert float(settled(pixel_values=images).last_hidden_state.abs().max()) > 0.1
    norms = [m for m in settled.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms) and not torch.allclose(norms[-1].running_var, torch.ones_like(norms[-1].running_var))


def test_a_random_weight_cnn_settled_on_its_second_moment_keeps_a_small_input_difference_small(tmp_path):
    """Settled on mean and variance, a random MobileNetV1 is chaotic: rounding only its input to INT8 moved its output to
    cosine_centered 0.71 (the sweep's INT8 gate could not pass). Settled on each channel's second moment (running_mean 0),
    the rounding leaves its output at cosine_centered above 0.98."""
    from pipeline.models.hf import load_hf_model

    profile = _image_profile(tmp_path, "mnv1", 'model_type = "mobilenet_v1"\nimage_size = 64', 64)
    torch.manual_seed(0)
    model = load_hf_model(profile)
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    scale = images.abs().max() / 127
    with torch.no_grad():
        exact, rounded = (model(pixel_values=x).last_hidden_state.flatten() for x in (images, torch.round(images / scale) * scale))
    exact, rounded = exact - exact.mean(), rounded - exact.mean()
    assert float(exact @ rounded / exact.norm() / rounded.norm()) > 0.98
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.running_mean.any() for m in norms)


def _image_profile(tmp_path, name: str, config: str, side: int) -> object:
    return load_profile(str(write_profile(tmp_path, f'name = "{name}"\n[model]\nseed = 0\n[model.hf_config]\n{config}\n[dims.batch]\nmin = 1\n'
                                                    f'opt = 2\nmax = 4\n[[inputs]]\nname = "pixel_values"\ndtype = "float32"\n'
                                                    f'shape = ["batch", 3, {side}, {side}]\n', f"{name}.toml")))


def test_a_random_weight_cnn_whose_init_draws_the_batch_norm_scale_gets_scale_one(tmp_path):
    """EfficientNet's init draws each BatchNorm's scale as N(0, 0.02), which shrinks the signal 50x per layer however
    the statistics are settled (the sweep's EfficientNet read outputs near 1e-10 and FP16 cosine 0.0014): the model
    built from hf_config has torch's own scale 1 and shift 0, and outputs of order 1."""
    from pipeline.models.hf import load_hf_model

    profile = _image_profile(tmp_path, "effnet", 'model_type = "efficientnet"\nimage_size = 32\nkernel_sizes = [3, 3]\n'
                             'in_channels = [32, 16]\nout_channels = [16, 24]\nstrides = [1, 2]\nnum_block_repeats = [1, 1]\n'
                             'expand_ratios = [1, 6]', 32)
    model = load_hf_model(profile)
    with torch.no_grad():
        outputs = model(pixel_values=torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))).last_hidden_state
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any() for m in norms)
    assert float(outputs.std()) > 0.1


def test_a_random_weight_model_gets_the_learned_tokens_its_init_leaves_at_zero(tmp_path):
    """YOLOS's init leaves its class token, detection tokens and position embeddings at zero: identical tokens, which
    LayerNorm scales up from the attention's last bits (the sweep's YOLOS read INT8 cosine 0.81). The model built from
    hf_config has them drawn as ViT draws its own; a Linear's zero bias and LayerNorm's shift stay zero."""
    from pipeline.models.hf import load_hf_model

    profile = _image_profile(tmp_path, "yolos", 'model_type = "yolos"\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 1\n'
                             'num_attention_heads = 2\nimage_size = [32, 32]\nnum_detection_tokens = 4', 32)
    model = load_hf_model(profile)
    embeddings = model.embeddings
    assert embeddings.cls_token.any() and embeddings.position_embeddings.any()
    assert not torch.allclose(embeddings.detection_tokens[0, 0], embeddings.detection_tokens[0, 1])
    assert not model.encoder.layer[0].attention.attention.query.bias.any() and not model.layernorm.bias.any()
    with torch.no_grad():
        hidden = model(pixel_values=torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))).last_hidden_state
    detections = hidden[0, -4:]
    assert float((detections - detections.mean(0)).abs().max()) > 0.1  # the detection tokens differ from one another


def test_a_mixture_of_experts_decoder_exports_with_its_experts_batched(tmp_path):
    """transformers runs MoE experts through grouped_mm, a custom op torch's exporters cannot translate: the model is
    exported with batched_mm, the same outputs, and its generation check passes."""
    from pipeline.models.hf import load_hf_model
    from pipeline.models.starter import starter_profile

    (tmp_path / "moe.toml").write_text(starter_profile("mixtral", "causal-lm", "moe", tmp_path))
    profile = load_profile(str(tmp_path / "moe.toml"))
    assert set(load_hf_model(profile).get_experts_implementation().values()) == {"batched_mm"}
    result = run_cli("build", "--profile", str(tmp_path / "moe.toml"), "--until", "export", "--out", str(tmp_path / "out"))
    assert result.returncode == 0 and "next tokens 100% as torch's" in result.stdout, result.stderr
