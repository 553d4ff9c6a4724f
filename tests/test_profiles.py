"""Profile loading and validation: good profiles load; each bad one is one line naming file and key."""

import pytest
from conftest import REPO, run_cli, write_profile

from pipeline.core.errors import ProfileError
from pipeline.core.profiles import available_profiles, load_profile

VALID_INPUT = '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [1, 8]\n'
FACTORY = '[model]\nfactory = "factories:tiny_mlp"\n'


def test_shipped_profiles_load():
    tiny = load_profile("bert-tiny")
    assert [i.name for i in tiny.inputs] == ["concat_ids", "sent_ids", "pos_ids", "concat_mask"]
    assert all(tiny.shape(i) == (1, 40) for i in tiny.inputs) and not tiny.dynamic
    base = load_profile("bert-base")
    assert base.dynamic and base.shape(base.inputs[0], "max") == (32, 512)
    assert base.model.kwargs["hidden"] == 768 and base.model.kwargs["heads"] == 12
    assert {"bert-tiny", "bert-base"} <= set(available_profiles())


def test_profile_by_path(tmp_path):
    path = write_profile(tmp_path, 'name = "mine"\n' + FACTORY + VALID_INPUT)
    profile = load_profile(str(path))
    assert profile.name == "mine" and profile.source == path
    assert profile.export.exporter == "dynamo" and profile.export.tolerance == 1e-4


def test_onnx_path_is_relative_to_profile(tmp_path):
    path = write_profile(tmp_path, 'name = "o"\n[model]\nonnx = "sub/m.onnx"\n' + VALID_INPUT)
    assert load_profile(str(path)).onnx_path() == (tmp_path / "sub" / "m.onnx").resolve()


BAD_PROFILES = {
    "toml syntax": ('name = "x"\n[model\n', "invalid TOML"),
    "unknown top-level key": ('name = "x"\nnmae = "y"\n' + FACTORY + VALID_INPUT, "nmae: unknown key"),
    "missing model": ('name = "x"\n' + VALID_INPUT, "model: required key is missing"),
    "both factory and onnx": ('name = "x"\n[model]\nfactory = "a.b:c"\nonnx = "m.onnx"\n' + VALID_INPUT, "exactly one of factory"),
    "factory form": ('name = "x"\n[model]\nfactory = "a.b.c"\n' + VALID_INPUT, "model.factory: must look like 'package.module:function'"),
    "bad dtype": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "x"\ndtype = "int8"\nshape = [1]\n', "inputs[0].dtype"),
    "zero size": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [0, 8]\n', "inputs[0].shape"),
    "undeclared dim": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 8]\n', "add [dims.batch]"),
    "unused dim": ('name = "x"\n' + FACTORY + VALID_INPUT + "[dims.seq]\nmin = 1\nopt = 2\nmax = 3\n", "declared but no input shape uses them"),
    "min > max": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["b"]\n[dims.b]\nmin = 8\nopt = 4\nmax = 2\n', "dims.b: needs min <= opt <= max"),
    "ids without range": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "ids"\ndtype = "int32"\nshape = [1, 4]\n', "need range = [low, high)"),
    "mask of floats": ('name = "x"\n' + FACTORY + '[[inputs]]\nname = "m"\ndtype = "float32"\nshape = [1, 4]\nfill = "mask"\n', "fill 'mask' needs dtype bool, int32 or int64"),
    "hf and factory": ('name = "x"\n[model]\nfactory = "a.b:c"\nhf = "bert-base-uncased"\n' + VALID_INPUT, "exactly one of factory"),
    "hf_config without model_type": ('name = "x"\n[model]\nhf_config = { hidden_size = 64 }\n' + VALID_INPUT, "hf_config needs model_type"),
    "task without hf": ('name = "x"\n' + FACTORY + 'task = "causal-lm"\n' + VALID_INPUT, "task chooses the head of a Hugging Face model"),
    "unknown task": ('name = "x"\n[model]\nhf = "m"\ntask = "translation"\n' + VALID_INPUT, "model.task: 'translation' is not known: input should be 'base'"),
    "kwargs with hf": ('name = "x"\n[model]\nhf = "m"\nkwargs = { a = 1 }\n' + VALID_INPUT, "kwargs go to a factory"),
    "duplicate inputs": ('name = "x"\n' + FACTORY + VALID_INPUT + VALID_INPUT, "input names must be unique, repeated: x"),
    "no inputs": ('name = "x"\ninputs = []\n' + FACTORY, "inputs: List should have at least 1 item"),
    "bad exporter": ('name = "x"\n' + FACTORY + VALID_INPUT + '[export]\nexporter = "jit"\n', "export.exporter"),
    "opset too old": ('name = "x"\n' + FACTORY + VALID_INPUT + "[export]\nopset = 11\n", "export.opset"),
    "typo in a stage section": ('name = "x"\n' + FACTORY + VALID_INPUT + "[quant]\nsampels = 4\n", "quant.sampels: unknown key"),
    "not utf-8": (b'name = "\xff"\n', "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_bad_profile_names_file_and_key(tmp_path, case):
    text, expected = BAD_PROFILES[case]
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize("dtype", ["bool", "int32", "int64"])
def test_mask_fill_in_every_mask_dtype(tmp_path, dtype):
    """HF attention masks are int64 (some int32): 1 for real tokens, then 0 for padding, as bool masks are."""
    from pipeline.core.samples import make_inputs

    text = 'name = "m"\n' + FACTORY + f'[[inputs]]\nname = "mask"\ndtype = "{dtype}"\nshape = [6, 16]\nfill = "mask"\n'
    mask = make_inputs(load_profile(str(write_profile(tmp_path, text))), seed=0)["mask"]
    assert mask.dtype == dtype and set(mask.reshape(-1).tolist()) == {0, 1}
    lengths = mask.astype(int).sum(axis=1)
    assert lengths[0] == 16 and (lengths >= 8).all()
    assert all(mask[row, :n].all() and not mask[row, n:].any() for row, n in enumerate(lengths)), "padding only at the end"


def test_profiles_command_lists_the_packaged_profiles():
    result = run_cli("profiles")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")}
    assert listed == set(available_profiles())
    assert "hf_config bert (base)" in result.stdout and "factory pipeline.models.bert:sentence_pair_matcher" in result.stdout


def test_missing_profile_lists_the_available_ones():
    with pytest.raises(ProfileError, match="available: .*bert-tiny"):
        load_profile("no-such-profile")


def test_cli_bad_profile_is_one_line_exit_2(tmp_path):
    path = write_profile(tmp_path, 'name = "x"\n' + FACTORY + '[[inputs]]\nname = "x"\ndtype = "int8"\nshape = [1]\n')
    result = run_cli("build", "--profile", str(path), "--out", str(tmp_path / "out"), cwd=REPO)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: inputs[0].dtype"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written for a bad profile"


def test_model_feeds_without_a_profile():
    from pipeline.core.samples import model_feeds

    sets = model_feeds({"ids": ("int64", [None, 16]), "mask": ("bool", [None, 16])})
    assert [{k: (v.shape, v.dtype.name) for k, v in f.items()} for f in sets] == [
        {"ids": ((1, 16), "int64"), "mask": ((1, 16), "bool")}, {"ids": ((3, 16), "int64"), "mask": ((3, 16), "bool")}]
    assert all(not v.any() for f in sets for v in f.values())
    assert len(model_feeds({"x": ("float32", [2, 8])})) == 1, "static inputs: one set"
