"""A battery of bad inputs, faults and hostile files, run through the CLI as a user would.

Every case must end with exactly one line on stderr (`error: ...`) and its exit code (2 for
bad input or usage), no traceback, no file left half written, and every file that was there
before unchanged (sha256). Cases are grouped by the cause they exercise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import resource
import shutil
import signal
import stat
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import REPO, TINY_MLP_PROFILE, TRT_DATA, run_cli
from onnx import TensorProto, helper, numpy_helper

MNIST = "trt10.16_detailed_mnist_myelin.layers.json"


# ------------------------------------------------------------------ the files the cases use


def _matmul_model(input_name: str = "x", prefix: str = "", dtype: int = TensorProto.FLOAT, width: int = 4) -> onnx.ModelProto:
    weight = np.random.default_rng(0).standard_normal((8, width)).astype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    node = helper.make_node("MatMul", [input_name, f"{prefix}w"], [f"{prefix}y"], name=f"{prefix}matmul")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(input_name, dtype, ["batch", 8])],
        [helper.make_tensor_value_info(f"{prefix}y", dtype, ["batch", width])], [numpy_helper.from_array(weight, f"{prefix}w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _two_input_model() -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", "z"], ["s"], name="add")
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 8]) for name in ("x", "z")]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _unknown_op_model() -> onnx.ModelProto:
    node = helper.make_node("NoSuchOp", ["x"], ["c"], name="custom", domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.example", 1)])


def _no_input_model() -> onnx.ModelProto:
    value = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])
    node = helper.make_node("Constant", [], ["y"], value=value, name="constant")
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _external(path: Path, truncate: bool) -> None:
    model = _matmul_model()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data", size_threshold=0)
    data = path.parent / (path.name + ".data")
    if truncate:
        data.write_bytes(data.read_bytes()[:-4])
    else:
        data.unlink()


def _npz_with_header(path: Path, header: bytes, body: bytes = b"") -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header + body)


def _npy_header(shape: tuple[int, ...]) -> bytes:
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode()
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


FACTORIES = '''
import torch

def raises():
    raise RuntimeError("weights file not found: /nowhere/model.bin")

def inner_type_error(hidden=4):
    return torch.nn.Linear(hidden, "four")  # a TypeError inside the factory, not in its kwargs


class Lookup(torch.nn.Module):
    def forward(self, x):
        return {"a": x}["b"]  # a KeyError of the user's own forward


class FixedBatch(torch.nn.Module):
    def forward(self, x):
        return x.reshape(2, 8)  # runs at the example's batch 2, not at the check's batch 1


def lookup():
    return Lookup()


def fixed_batch():
    return FixedBatch()
'''


def _hf_profile(config: str, extra: str = "", past: bool = False, ids: str = "input_ids") -> str:
    """A text-model profile on a Hugging Face config; `past`: with the cache inputs of a 2-layer, 2-KV-head Llama."""
    text = (f'name = "d"\n[model.hf_config]\n{config}\n[dims.batch]\nmin = 1\nopt = 1\nmax = 2\n[dims.seq]\nmin = 1\nopt = 4\nmax = 8\n'
            f'[[inputs]]\nname = "{ids}"\ndtype = "int64"\nshape = ["batch", "seq"]\nrange = [0, 100]\n{extra}\n')
    if past:
        text += "[dims.past_seq]\nmin = 0\nopt = 4\nmax = 4\n" + "".join(
            f'[[inputs]]\nname = "past_key_values.{i}.{kind}"\ndtype = "float32"\nshape = ["batch", 2, "past_seq", 16]\n'
            for i in (0, 7) for kind in ("key", "value"))
    return text


LLAMA = ('model_type = "llama"\nvocab_size = 100\nhidden_size = 64\nintermediate_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 4\n'
         "num_key_value_heads = 2\nmax_position_embeddings = 64")
DECODER_PROFILES = {
    "bert-with-past.toml": _hf_profile('model_type = "bert"\nvocab_size = 100\nhidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\n'
                                       'intermediate_size = 32', '[export]\ncache = "with-past"'),
    "t5-with-past.toml": _hf_profile('model_type = "t5"\nvocab_size = 100\nd_model = 32\nd_ff = 32\nd_kv = 8\nnum_layers = 1\nnum_heads = 2',
                                     '[export]\ncache = "with-past"'),
    "llama-layer7.toml": _hf_profile(LLAMA, past=True),
    "llama-many-tokens.toml": _hf_profile(LLAMA, '[export]\nnew_tokens = 100'),
    "llama-past-too-long.toml": _hf_profile(LLAMA, '[dims.past_seq]\nmin = 0\nopt = 8\nmax = 57'),
    "llama-full-size.toml": _hf_profile('model_type = "llama"'),
    "batch-min-0.toml": _hf_profile(LLAMA).replace("[dims.batch]\nmin = 1", "[dims.batch]\nmin = 0"),
    "llama-part.toml": _hf_profile(LLAMA, '[export]\npart = "encoder"'),
    "t5-parts.toml": _hf_profile('model_type = "t5"\nvocab_size = 100\nd_model = 32\nd_ff = 32\nd_kv = 8\nnum_layers = 1\nnum_heads = 2',
                                 '[model]\ntask = "seq2seq-lm"'),
}


def _profile(factory: str, extra: str = "") -> str:
    return f'name = "p"\n[model]\nfactory = "{factory}"\n{extra}\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [2, 8]\n'


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """One folder of good and bad files; each case works on its own copy."""
    root = tmp_path_factory.mktemp("library")
    onnx.save(_matmul_model(), str(root / "good.onnx"))
    onnx.save(_matmul_model(prefix="other_"), str(root / "other.onnx"))
    onnx.save(_matmul_model("tokens"), str(root / "foreign_inputs.onnx"))
    onnx.save(_no_input_model(), str(root / "noinput.onnx"))
    onnx.save(_two_input_model(), str(root / "two_inputs.onnx"))
    onnx.save(_matmul_model("tokens", prefix="int_", dtype=TensorProto.INT64), str(root / "int_inputs.onnx"))
    onnx.save(_unknown_op_model(), str(root / "unknown_op.onnx"))
    onnx.save(_matmul_model(prefix="wide_", width=65536), str(root / "wide.onnx"))
    (root / "empty.onnx").write_bytes(b"")
    (root / "garbage.onnx").write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)))
    (root / "random.onnx").write_bytes(bytes(np.random.default_rng(2).integers(0, 256, 300, dtype=np.uint8)))
    (root / "folder.onnx").mkdir()
    (root / "afile").write_text("a file, not a folder\n")
    (root / "ext").mkdir()
    _external(root / "ext" / "missing.onnx", truncate=False)
    _external(root / "ext" / "short.onnx", truncate=True)
    np.savez(root / "good.npz", x=np.ones((4, 8), np.float32))
    np.savez(root / "tokens.npz", tokens=np.ones((4, 8), np.int64))  # another model's calibration data
    _npz_with_header(root / "huge.npz", _npy_header((2**22, 2**22, 2**20)))  # claims 146 TiB... and more
    _npz_with_header(root / "corrupt.npz", b"\x93NUMPY\x01\x00\xff\xffnot a header at all")
    np.savez(root / "ids.npz", x=np.ones((4, 8), np.int64))
    shutil.copy(TRT_DATA / MNIST, root / "layers.json")
    (root / "tiny.toml").write_text(TINY_MLP_PROFILE)
    (root / "badregex.toml").write_text(TINY_MLP_PROFILE + '\n[quant]\nfp8_exclude_nodes = ["node_(add"]\n')
    (root / "badfactories.py").write_text(FACTORIES)
    (root / "syntaxmod.py").write_text("def make(:\n    pass\n")
    (root / "importfail.py").write_text("raise ImportError('libfoo.so: cannot open shared object file')\n")
    (root / "raising.toml").write_text(_profile("badfactories:raises"))
    (root / "typeerror.toml").write_text(_profile("badfactories:inner_type_error"))
    (root / "kwargs.toml").write_text(_profile("badfactories:inner_type_error", "kwargs = { width = 3 }"))
    (root / "syntax.toml").write_text(_profile("syntaxmod:make"))
    (root / "lookup.toml").write_text(_profile("badfactories:lookup"))
    (root / "fixedbatch.toml").write_text(_profile("badfactories:fixed_batch").replace("shape = [2, 8]", 'shape = ["batch", 8]')
                                          + "[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n")
    (root / "importfail.toml").write_text(_profile("importfail:make"))
    (root / "seed.toml").write_text(_profile("factories:tiny_mlp", f"seed = {2**70}"))
    (root / "\x1b]0;evil\x07.onnx").write_bytes(b"")
    _jobs_files(root)
    _conv_only(root / "conv.onnx")
    (root / "conv.toml").write_text(CONV_PROFILE)
    (root / "convnext.toml").write_text(CONVNEXT_PROFILE)
    # a random-weight CNN runs once on the profile's inputs (its BatchNorm statistics): 4 channels for a 3-channel ResNet
    (root / "cnn1ch.toml").write_text('name = "cnn1ch"\n[model]\nfactory = "factories:tiny_cnn"\n[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n'
                                      '[[inputs]]\nname = "x"\ndtype = "float32"\nshape = ["batch", 1, 16, 16]\n')  # one channel for a 3-channel CNN
    (root / "resnet4ch.toml").write_text((REPO / "profiles" / "hf-resnet-tiny.toml").read_text().replace('shape = ["batch", 3, 32, 32]', 'shape = ["batch", 4, 32, 32]'))
    # decoders (issue 22)
    for name, text in DECODER_PROFILES.items():
        (root / name).write_text(text)
    return root


# ------------------------------------------------------------------ the cases


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    expect: str
    code: int = 2
    mount: str | None = None  # "full" or "readonly": a small tmpfs at ./mnt
    file_size_limit: int | None = None
    new_files: tuple[str, ...] = ()  # files the command may create (a failed build's manifest, its lock)
    setup: tuple[str, ...] = field(default=())


BUILD_LEFTOVERS = ()  # a build stopped by bad input leaves its --out as it found it: no manifest, no .lock, no new folder

ORT_LOGREG_IRIS = Path(importlib.util.find_spec("onnxruntime").origin).parent / "datasets" / "logreg_iris.onnx"

CASES = {
    # 1. OSError on output: one line naming the path and what to do
    "report -o a directory": Case(("report", "layers.json", "-o", "folder.onnx"), "folder.onnx: is a directory"),
    "diff -o a directory": Case(("diff", "layers.json", "layers.json", "-o", "folder.onnx"), "is a directory"),
    "diff of a missing file": Case(("diff", "nothere.json", "layers.json"), "Path 'nothere.json' does not exist"),
    "diff --a of no precision": Case(("diff", "folder.onnx", "--a", "fp61"), "'fp61' is not one of 'fp32', 'fp16', 'int8', 'fp8', 'int4', 'bf16'"),
    "export -o a directory": Case(("export", "--profile", "tiny.toml", "-o", "folder.onnx"), "is a directory"),
    "optimize -o a directory": Case(("optimize", "good.onnx", "-o", "folder.onnx"), "is a directory"),
    "quantize -o a directory": Case(("quantize", "good.onnx", "--fp16", "-o", "folder.onnx"), "is a directory"),
    "lint-qdq -o a directory": Case(("lint-qdq", "good.onnx", "-o", "folder.onnx"), "is a directory"),
    "compare -o a directory": Case(("compare", "good.onnx", "good.onnx", "--inputs", "good.npz", "-o", "folder.onnx"), "is a directory"),
    "bench -o a directory": Case(("bench", "good.onnx", "--profile", "tiny.toml", "-o", "folder.onnx"), "is a directory"),
    "report -o /dev/null": Case(("report", "layers.json", "-o", "/dev/null"), "/dev/null: is not a regular file"),
    "report -o /dev/full": Case(("report", "layers.json", "-o", "/dev/full"), "/dev/full: is not a regular file"),
    "optimize -o under a file": Case(("optimize", "good.onnx", "-o", "afile/out.onnx"), "afile: is a file, not a folder"),
    "build --out under a file": Case(("build", "--profile", "tiny.toml", "--out", "afile/o"), "afile: is a file, not a folder"),
    "report -o on a full disk": Case(("report", "layers.json", "--format", "html", "-o", "mnt/report.html"), "No space left on device", mount="full"),
    "optimize -o on a read-only disk": Case(("optimize", "good.onnx", "-o", "mnt/out.onnx"), "Read-only file system", mount="readonly"),
    "build --out on a read-only disk": Case(("build", "--profile", "tiny.toml", "--out", "mnt/o"), "Read-only file system", mount="readonly"),
    "optimize over the file size limit": Case(("optimize", "good.onnx", "-o", "out.onnx"), "File too large", file_size_limit=64),
    # 2. third-party errors wrapped
    "bench random bytes": Case(("bench", "random.onnx", "--profile", "tiny.toml"), "random.onnx: not an ONNX model"),
    "optimize missing external data": Case(("optimize", "ext/missing.onnx", "-o", "out.onnx"), "which is missing; copy it beside the .onnx"),
    "optimize truncated external data": Case(("optimize", "ext/short.onnx", "-o", "out.onnx"), "the data file is truncated"),
    "build missing external data": Case(("build", "--profile", "tiny.toml", "--onnx", "ext/missing.onnx", "--out", "o"), "which is missing", new_files=BUILD_LEFTOVERS),
    "lint missing external data": Case(("lint-qdq", "ext/missing.onnx"), "which is missing"),
    "quantize npz claiming 146 TiB": Case(("quantize", "good.onnx", "--int8", "--calib", "huge.npz", "-o", "out.onnx"), "the file is corrupt or truncated"),
    "compare npz claiming 146 TiB": Case(("compare", "good.onnx", "good.onnx", "--inputs", "huge.npz"), "the file is corrupt or truncated"),
    "factory raises": Case(("export", "--profile", "raising.toml", "-o", "m.onnx"), "raised RuntimeError: weights file not found"),
    "factory module has a syntax error": Case(("export", "--profile", "syntax.toml", "-o", "m.onnx"), "syntax error"),
    "factory module fails to import": Case(("export", "--profile", "importfail.toml", "-o", "m.onnx"), "raised ImportError: libfoo.so"),
    "seed 2**70": Case(("export", "--profile", "seed.toml", "-o", "m.onnx"), "model.seed: Input should be less than"),
    # 3. the right message
    "optimize a directory": Case(("optimize", "folder.onnx", "-o", "out.onnx"), "folder.onnx: is a directory; pass an ONNX file"),
    "report a directory": Case(("report", "folder.onnx"), "folder.onnx: is a directory"),
    "lint a directory": Case(("lint-qdq", "folder.onnx"), "is a directory"),
    "calib is a directory": Case(("quantize", "good.onnx", "--int8", "--calib", "folder.onnx", "-o", "out.onnx"), "folder.onnx: is a directory; pass an .npz"),
    "profile is a directory": Case(("build", "--profile", "folder.onnx/"), "is a directory"),
    "optimize an empty file": Case(("optimize", "empty.onnx", "-o", "out.onnx"), "empty.onnx: is empty (0 bytes)"),
    "lint an empty file": Case(("lint-qdq", "empty.onnx"), "is empty (0 bytes)"),
    "build from an empty file": Case(("build", "--profile", "tiny.toml", "--onnx", "empty.onnx", "--out", "o"), "is empty (0 bytes)", new_files=BUILD_LEFTOVERS),
    "compare an empty file": Case(("compare", "empty.onnx", "good.onnx", "--inputs", "good.npz"), "is empty (0 bytes)"),
    # a new user gave compare two profiles: told to give --inputs or --profile, not that these are no ONNX models
    "compare two profiles": Case(("compare", "tiny.toml", "tiny.toml"), "tiny.toml: not an ONNX model"),
    "bench an empty file": Case(("bench", "empty.onnx", "--profile", "tiny.toml"), "is empty (0 bytes)"),
    "optimize garbage": Case(("optimize", "garbage.onnx", "-o", "out.onnx"), "not an ONNX model"),
    "corrupt npy in npz": Case(("compare", "good.onnx", "good.onnx", "--inputs", "corrupt.npz"), "member 'x' is not a .npy array"),
    "npz of the wrong dtype": Case(("compare", "good.onnx", "good.onnx", "--inputs", "ids.npz"), "has dtype int64, the model expects float32"),
    "factory TypeError inside": Case(("export", "--profile", "typeerror.toml", "-o", "m.onnx"), "raised TypeError"),
    "factory kwargs do not fit": Case(("export", "--profile", "kwargs.toml", "-o", "m.onnx"), "model.kwargs ['width'] do not fit inner_type_error(hidden=4)"),
    "usage: unknown option": Case(("build", "--no-such-flag"), "No such option: --no-such-flag (see `"),
    "usage: missing argument": Case(("report",), "Missing argument 'layer_info' (see `"),
    "optimize without a model": Case(("optimize",), "optimize: give the ONNX file and -o OUT.onnx"),
    "usage: missing option": Case(("export",), "Missing option '--output'"),
    "usage: bad choice": Case(("build", "--until", "nonsense"), "Invalid value for '--until'"),
    "usage: bad number": Case(("bench", "good.onnx", "--iterations", "many"), "Invalid value for '--iterations'"),
    "usage: unknown command": Case(("biuld",), "No such command 'biuld'"),
    # 4. bad input not accepted
    "build from a model with no inputs": Case(("build", "--profile", "tiny.toml", "--onnx", "noinput.onnx", "--out", "o"), "the model has no inputs", new_files=BUILD_LEFTOVERS),
    "build --calib naming no file": Case(("build", "--int8", "--calib", "nowhere.npz", "--out", "o"), "nowhere.npz: no such calibration file"),
    "build --profile NAME beside NAME.toml": Case(("build", "--profile", "tiny", "--out", "o"), "./tiny.toml is here: pass --profile tiny.toml"),
    "report -o a file whose suffix names no format": Case(("report", str(TRT_DATA / "trex_resnet18_A100_fp16.graph.json"), "-o", "r.pdf"),
                                                       "-o r.pdf: '.pdf' names none of this command's formats (text, json, md, html)"),
    "build --onnx without --profile": Case(("build", "--onnx", "good.onnx", "--out", "o"), "build --onnx good.onnx needs --profile: a profile names the model's inputs"),
    "build from a model the profile does not feed": Case(("build", "--profile", "tiny.toml", "--onnx", "foreign_inputs.onnx", "--out", "o"), "model input 'tokens' is not in profile tiny-mlp's [[inputs]]", new_files=BUILD_LEFTOVERS),
    "build --calib for another model": Case(("build", "--profile", "tiny.toml", "--int8", "--calib", "tokens.npz", "--out", "o"),
                                            "tokens.npz: no array for input 'x' of profile tiny-mlp (has ['tokens'])"),
    "build --calib without --int8": Case(("build", "--calib", "good.npz"), "--calib is the calibration data of the INT8/FP8/INT4 stages, which this build does not run"),
    "build --preset without --int8": Case(("build", "--preset", "modelopt"), "--preset is the Q/DQ placement of the INT8/FP8 stages"),
    "build --min-cosine without a precision": Case(("build", "--min-cosine", "0.9"), "--min-cosine is the accuracy gate"),
    "quantize --calib with --fp16 only": Case(("quantize", "good.onnx", "--fp16", "--calib", "good.npz", "-o", "out.onnx"), "--calib is calibration data for --int8"),
    # 5. inputs are never outputs
    "optimize -o its input": Case(("optimize", "good.onnx", "-o", "good.onnx"), "is also an input of this command"),
    "quantize -o its input": Case(("quantize", "good.onnx", "--fp16", "-o", "./good.onnx"), "is also an input of this command"),
    "lint-qdq -o its input": Case(("lint-qdq", "good.onnx", "-o", "good.onnx"), "is also an input of this command"),
    # issue 23: compare aligned by execution (models sharing no names are aligned, not refused)
    "compare models with other input counts": Case(("compare", "good.onnx", "two_inputs.onnx", "--inputs", "good.npz"),
                                                   "two_inputs.onnx: takes 2 inputs (x, z), good.onnx takes 1 and the names differ"),
    "compare models with no common inputs": Case(("compare", "good.onnx", "int_inputs.onnx", "--inputs", "good.npz"), "the models have no common inputs"),
    "compare a graph onnxruntime cannot run": Case(("compare", "good.onnx", "unknown_op.onnx", "--inputs", "good.npz"), "unknown_op.onnx: onnxruntime cannot load it"),
    "compare a trace over the memory limit": Case(("compare", "good.onnx", "wide.onnx", "--inputs", "good.npz", "--max-trace-mb", "1"),
                                                  "keeping every node result needs about 2 MiB (1 results, 0 more of unknown size), over the 1 MiB limit; keep a subset with --nodes"),
    "compare --nodes not a regex": Case(("compare", "good.onnx", "other.onnx", "--inputs", "good.npz", "--nodes", "(layer"), "--nodes '(layer': not a regular expression"),
    "compare --format md": Case(("compare", "--torch", "good.onnx", "--profile", "tiny.toml", "-f", "md"), "--format 'md': use text, json or html"),
    "compare --exporters without a profile": Case(("compare", "--exporters"), "compare --exporters needs --profile NAME"),
    "compare --exporters with a file": Case(("compare", "good.onnx", "--exporters", "--profile", "tiny.toml"), "give no ONNX file and no --torch"),
    "compare without a model": Case(("compare", "--profile", "tiny.toml"), "compare: give two ONNX files (A, the reference, then B), one with --torch"),
    # 10. decoders (issue 22): cache layouts, encoder-decoders, sizes, dims the generation check cannot use
    "with-past on an encoder": Case(("export", "--profile", "bert-with-past.toml", "-o", "m.onnx"), 'BertModel takes no KV cache'),
    "with-past on an encoder-decoder": Case(("export", "--profile", "t5-with-past.toml", "-o", "m.onnx"), "T5Model is an encoder-decoder; one graph with past"),
    "init another head of an encoder-decoder": Case(("init", "--hf", "bart", "--task", "sequence-classification", "-o", "b.toml"),
                                                    "Bart is an encoder-decoder; init writes its generation model (--task seq2seq-lm"),
    "export.part of one model": Case(("build", "--profile", "llama-part.toml"), "export.part = 'encoder' picks a sub-model of an encoder-decoder"),
    "build --onnx of an encoder-decoder": Case(("build", "--profile", "t5-parts.toml", "--onnx", "good.onnx"),
                                               "profile d is an encoder-decoder (task seq2seq-lm), built as two models (encoder, decoder)"),
    "cache inputs of a layer the model lacks": Case(("export", "--profile", "llama-layer7.toml", "-o", "m.onnx"),
                                                    "the cache inputs must be past_key_values.{i}.key and .value for i in 0..1"),
    "more new tokens than the cache holds": Case(("export", "--profile", "llama-many-tokens.toml", "-o", "m.onnx"),
                                                 "export.new_tokens = 100 does not fit dims.past_seq.max = 8"),  # the cache up to seq max (8): no [dims.past_seq]
    "a cache longer than the model's positions": Case(("export", "--profile", "llama-past-too-long.toml", "-o", "m.onnx"),
                                                      "dims.past_seq.max = 57: the model takes 64 positions, 56 of them beside dims.seq.max = 8; set it to 56 or less"),
    "a 7B default config": Case(("export", "--profile", "llama-full-size.toml", "-o", "m.onnx"), "M parameters, "),
    "build --min-token-agreement without a precision": Case(("build", "--min-token-agreement", "0.5"), "--min-token-agreement is the generation gate"),
    "a dim other than past_seq at 0": Case(("export", "--profile", "batch-min-0.toml", "-o", "m.onnx"), "dims.batch.min: 0 is allowed only for past_seq"),
    # 9. names from files reach the terminal escaped
    "control characters in a path": Case(("optimize", "\x1b]0;evil\x07.onnx", "-o", "out.onnx"), "\\x1b]0;evil\\x07.onnx: is empty"),
    # issue 28: a model onnx_ir cannot represent (onnxruntime's own sample, ZipMap's map-typed output)
    "optimize a map-typed model": Case(("optimize", str(ORT_LOGREG_IRIS), "-o", "out.onnx"),
                                       "optimize cannot read this model (Map types are not supported yet); use it unoptimized"),
    # issue 25: the fp8 / int4 stages and the family presets through the CLI
    "quantize --int4 on a model with no eligible weights": Case(("quantize", "conv.onnx", "--int4", "--profile", "conv.toml", "-o", "out.onnx"),
                                                                "has no MatMul/Gemm with a constant 2-D weight, and INT4 is weight-only for those: use --int8 or --fp8"),
    "build --int4 on a model with no eligible weights": Case(("build", "--profile", "conv.toml", "--onnx", "conv.onnx", "--int4", "--out", "o"),
                                                             "has no MatMul/Gemm with a constant 2-D weight", new_files=("o", "o/manifest.json", "o/model.opt.onnx")),
    "a factory's model on inputs it does not take": Case(("build", "--profile", "cnn1ch.toml", "--until", "export", "--out", "o"),
                                                          "cnn1ch.toml: inputs: factories._TinyCnn does not run on the profile's inputs x [2, 1, 16, 16] (RuntimeError: "),
    "a forward raising an error of its own": Case(("build", "--profile", "lookup.toml", "--until", "export", "--out", "o"),
                                                  "lookup.toml: inputs: badfactories.Lookup does not run on the profile's inputs x [2, 8] (KeyError: 'b')"),
    "a forward that fails at a check size only": Case(("build", "--profile", "fixedbatch.toml", "--until", "export", "--out", "o"),
                                                      "export: FixedBatch's code fixed dim 'batch' at 2 although [dims.batch] is 1..4"),
    "random-weight CNN on inputs it does not take": Case(("build", "--profile", "resnet4ch.toml", "--until", "export", "--out", "o"),
                                                          "the random-weight ResNetModel does not run on the profile's inputs pixel_values [2, 4, 32, 32]"),
    "quantize --fp8 with a decoder preset on a CNN": Case(("quantize", "conv.onnx", "--fp8", "--preset", "decoder", "--profile", "conv.toml", "-o", "out.onnx"),
                                                          "--preset decoder is written for decoder models, but this model is a cnn (convolutions, no attention): use --preset cnn"),
    "build --fp8 with the cnn preset on an MLP": Case(("build", "--profile", "tiny.toml", "--fp8", "--preset", "cnn", "--until", "fp8", "--out", "o"),
                                                      "--preset cnn is written for cnn models, but this model is an encoder", new_files=("o", "o/manifest.json", "o/model.onnx", "o/model.opt.onnx")),
    "quantize --fp8 without a profile": Case(("quantize", "good.onnx", "--fp8", "-o", "out.onnx"), "quantize --fp8 needs --profile NAME"),
    "quantize --fp8 with --int4": Case(("quantize", "good.onnx", "--fp8", "--int4", "-o", "out.onnx"), "--fp8 and --int4 make different models"),
    "hf_config the model cannot use": Case(("export", "--profile", "convnext.toml", "-o", "m.onnx"), "hf_config: transformers cannot build a convnext model"),
}


# ------------------------------------------------------------------ jobs (benchmark matrices, issue 24)

JOBS_MATRIX = 'name = "m"\nprecisions = ["fp32"]\nbackends = ["ort-cpu"]\n[[models]]\nprofile = "tiny.toml"\n'
JOBS_CLUSTER = '[cluster]\ngpus = ["NVIDIA-L4"]\nimage = "i"\nresults_pvc = "r"\n'


def _jobs_cell(cell_id: str, p50: float = 1.0, schema: int = 1, matrix: str = "m") -> str:
    import json

    definition = {"model": "tiny-mlp", "profile": "tiny.toml", "onnx": None, "shape": {"batch": 4}, "precision": "fp32",
                  "backend": "ort-cpu", "builder": {}, "gpu": "cpu", "method": {}, "repeats": 1}
    return json.dumps({"schema": schema, "matrix": matrix, "id": cell_id, "index": 0, "label": "tiny-mlp fp32", "definition": definition,
                       "status": "done", "reason": None, "latency": {"p50_ms": p50, "p90_ms": p50, "p99_ms": p50, "throughput_per_s": 1.0, "cv": 0.0},
                       "repeats": [], "valid": True})


def _jobs_files(root: Path) -> None:
    """Matrices and results folders for the jobs cases."""
    files = {
        "matrix.toml": JOBS_MATRIX,
        "unknown-profile.toml": JOBS_MATRIX.replace("tiny.toml", "no-such-profile"),
        "unknown-precision.toml": JOBS_MATRIX.replace('["fp32"]', '["fp32", "fp9"]'),
        "unknown-backend.toml": JOBS_MATRIX.replace('["ort-cpu"]', '["ort-rocm"]'),
        "unknown-gpu.toml": JOBS_MATRIX + JOBS_CLUSTER.replace("NVIDIA-L4", "GeForce-256"),
        "bad-shape.toml": JOBS_MATRIX + "shapes = [{ batch = 99 }]\n",
        "bad-dim.toml": JOBS_MATRIX + "shapes = [{ seq = 4 }]\n",
        "other/matrix.json": '{"matrix": "someone-else", "schema": 1}',
        "other/cells/aaaaaaaaaaaa.json": _jobs_cell("aaaaaaaaaaaa", matrix="someone-else"),
        "newer/cells/bbbbbbbbbbbb.json": _jobs_cell("bbbbbbbbbbbb", schema=99),
        "corrupt/cells/cccccccccccc.json": _jobs_cell("cccccccccccc")[:40],
        "res-a/cells/dddddddddddd.json": _jobs_cell("dddddddddddd"),
        "res-b/cells/eeeeeeeeeeee.json": _jobs_cell("eeeeeeeeeeee"),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


CASES.update({
    "build: an exclude list that is not a regular expression": Case(("build", "--profile", "badregex.toml", "--fp8", "--out", "o"),
                                                                    "quant.fp8_exclude_nodes: 'node_(add' is not a regular expression"),
    "jobs: a matrix naming an unknown profile": Case(("jobs", "plan", "unknown-profile.toml"), "models[0]: profile 'no-such-profile' not found"),
    "jobs: a matrix naming an unknown precision": Case(("jobs", "plan", "unknown-precision.toml"), "precisions[1]: 'fp9' is not known"),
    "jobs: a matrix naming an unknown backend": Case(("jobs", "run", "unknown-backend.toml", "--out", "o"), "backends[0]: 'ort-rocm' is not known"),
    "jobs: a matrix naming an unknown GPU type": Case(("jobs", "k8s", "unknown-gpu.toml", "-o", "o.yaml"), "unknown GPU type 'GeForce-256'"),
    "jobs: a shape outside the profile's range": Case(("jobs", "plan", "bad-shape.toml"), "batch = 99 is outside profile tiny-mlp's range 1..16"),
    "jobs: a shape naming a dim the profile lacks": Case(("jobs", "plan", "bad-dim.toml"), "has no dim 'seq'"),
    "jobs: a missing matrix": Case(("jobs", "plan", "nope.toml"), "matrix nope.toml does not exist"),
    "jobs: k8s without [cluster]": Case(("jobs", "k8s", "matrix.toml", "-o", "o.yaml"), "has no [cluster] section"),
    "jobs: an index out of range": Case(("jobs", "cell", "matrix.toml", "--index", "5", "--out", "o"), "--index 5 is out of range: the matrix's 1 cells are numbered 0..0"),
    "jobs: a pod index with a GPU type not in the matrix": Case(("jobs", "cell", "matrix.toml", "--index", "0", "--gpu", "NVIDIA-L4", "--out", "o"), "the matrix has no cells for it"),
    "jobs: a results folder holding another matrix's cells": Case(("jobs", "run", "matrix.toml", "--out", "other"), "holds the cells of matrix 'someone-else', not 'm'"),
    "jobs: a results folder with a newer cell schema": Case(("jobs", "gather", "newer"), "cell schema 99 is newer than this trt-pipeline reads (1)"),
    "jobs: a corrupt cell file": Case(("jobs", "gather", "corrupt", "-o", "report.html"), "corrupt cell file"),
    "jobs: a folder that holds no results": Case(("jobs", "gather", "ext"), "holds no cells/ folder"),
    "jobs: a baseline with no common cells": Case(("jobs", "gather", "res-a", "--baseline", "res-b", "-o", "r.md"), "no cell done there is done in res-a"),
    "jobs: a bad --max-slowdown": Case(("jobs", "gather", "res-a", "--baseline", "res-a", "--max-slowdown", "five"), "--max-slowdown 'five': give a percentage"),
    "jobs: a results store under a file": Case(("jobs", "cell", "matrix.toml", "--index", "0", "--out", "afile/results"), "afile"),
    "jobs: a read-only results store": Case(("jobs", "run", "matrix.toml", "--out", "mnt/results"), "mnt/results", mount="readonly"),
})


def _digests(folder: Path) -> dict[str, str]:
    """Every file's sha256 and every folder (as "dir"), dot-files such as `.lock` included."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if not p.is_symlink() and (p.is_file() or p.is_dir())}


@pytest.fixture
def workdir(tmp_path, library) -> Path:
    work = tmp_path / "w"
    shutil.copytree(library, work)
    return work


def _mount(work: Path, kind: str) -> Path:
    target = work / "mnt"
    target.mkdir()
    options = "ro,size=64k" if kind == "readonly" else "size=64k"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let tests mount a small tmpfs (needs root / CAP_SYS_ADMIN)")
    if kind == "full":
        filler = os.open(target / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:
            pass  # the disk is full now
        finally:
            os.close(filler)
    return target


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_one_line_and_touches_nothing(name, workdir):
    case = CASES[name]
    mounted = _mount(workdir, case.mount) if case.mount else None
    try:
        before = _digests(workdir)
        preexec = None
        if case.file_size_limit:
            def preexec():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (case.file_size_limit, case.file_size_limit))
        result = run_cli(*case.args, cwd=workdir, path=(workdir,), timeout=300, preexec_fn=preexec)
        after = _digests(workdir)
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=True)
    assert result.returncode == case.code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert case.expect in lines[0], lines[0]
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert {k: v for k, v in after.items() if k in before} == before, "an input file was changed"
    assert set(after) - set(before) <= set(case.new_files), f"left behind: {sorted(set(after) - set(before))}"
    for device in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.stat(device).st_mode), f"{device} was replaced"


def test_the_battery_is_large_enough():
    assert len(CASES) >= 60


# ------------------------------------------------------------------ fp8 / int4 / presets (issue 25), through the library
# entries (the CLI cases are in CASES): one InputError line, nothing written, the input untouched. The CLI never asks
# for an opset below 21 (the stage writes FP8 at max(21, the model's)), so that case is the library's alone.

CONV_PROFILE = 'name = "conv"\n[model]\nonnx = "conv.onnx"\n[[inputs]]\nname = "x"\ndtype = "float32"\nshape = [1, 3, 8, 8]\n'
# ConvNeXt with two depths but num_stages left at its default 4: transformers raised IndexError building it
CONVNEXT_PROFILE = """name = "convnext"
[model]
[model.hf_config]
model_type = "convnext"
hidden_sizes = [16, 32]
depths = [1, 1]
[[inputs]]
name = "pixel_values"
dtype = "float32"
shape = [1, 3, 32, 32]
"""

def _conv_only(path: Path, opset: int = 20) -> Path:
    """A one-Conv model: no MatMul/Gemm weight for INT4, a CNN for the presets."""
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), str(path))
    return path


def _mlp(path: Path) -> Path:
    weight = numpy_helper.from_array(np.ones((8, 16), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10), str(path))
    return path


IMAGES = {"x": np.zeros((2, 3, 8, 8), np.float32)}
ROWS = {"x": np.zeros((2, 8), np.float32)}


@pytest.mark.parametrize("case, build, call, message", [
    ("int4 on a graph with no eligible weight", _conv_only,
     lambda src, dst: __import__("quant.int4", fromlist=["x"]).quantize_int4(src, dst, IMAGES, 1, [IMAGES], min_cosine=0.98),
     r"int4: .* has no MatMul/Gemm with a constant 2-D weight, and INT4 is weight-only for those: use --int8 or --fp8"),
    ("fp8 with an opset below 21", _mlp,
     lambda src, dst: __import__("quant.fp8", fromlist=["x"]).quantize_fp8(src, dst, ROWS, 1, [ROWS], opset=19, min_cosine=0.99),
     r"fp8: opset 19 is below 21, .*pass opset >= 21 or leave it unset"),
    ("a preset for another model family", _conv_only,
     lambda src, dst: __import__("quant.fp8", fromlist=["x"]).quantize_fp8(src, dst, IMAGES, 1, [IMAGES], preset_name="decoder", min_cosine=0.99),
     r"--preset decoder is written for decoder models, but this model is a cnn .*: use --preset cnn"),
    ("calibration smaller than one batch", _mlp,
     lambda src, dst: __import__("quant.fp8", fromlist=["x"]).quantize_fp8(src, dst, ROWS, 4, [ROWS], min_cosine=0.99),
     r"fp8: 2 calibration sample\(s\), max calibration needs at least 4 .*pass more samples"),
])
def test_quant_entry_bad_input(tmp_path, case, build, call, message):
    from pipeline.core.errors import InputError

    source = build(tmp_path / "model.onnx")
    before = hashlib.sha256(source.read_bytes()).hexdigest()
    with pytest.raises(InputError, match=message) as raised:
        call(source, tmp_path / "out.onnx")
    assert "\n" not in str(raised.value), case
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert hashlib.sha256(source.read_bytes()).hexdigest() == before
