"""A battery of bad inputs, faults and hostile files, run through the CLI as a user would.

Every case must end with exactly one line on stderr (`error: ...`) and its exit code (2 for
bad input or usage), no traceback, no file left half written, and every file that was there
before unchanged (sha256). Cases are grouped by the cause they exercise.
"""

from __future__ import annotations

import hashlib
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
from conftest import TINY_MLP_PROFILE, TRT_DATA, run_cli
from onnx import TensorProto, helper, numpy_helper

MNIST = "trt10.16_detailed_mnist_myelin.layers.json"


# ------------------------------------------------------------------ the files the cases use


def _matmul_model(input_name: str = "x", prefix: str = "") -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), f"{prefix}w")
    node = helper.make_node("MatMul", [input_name, f"{prefix}w"], [f"{prefix}y"], name=f"{prefix}matmul")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info(f"{prefix}y", TensorProto.FLOAT, ["batch", 4])], [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


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
    "llama-full-size.toml": _hf_profile('model_type = "llama"'),
    "batch-min-0.toml": _hf_profile(LLAMA).replace("[dims.batch]\nmin = 1", "[dims.batch]\nmin = 0"),
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
    (root / "empty.onnx").write_bytes(b"")
    (root / "garbage.onnx").write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8)))
    (root / "random.onnx").write_bytes(bytes(np.random.default_rng(2).integers(0, 256, 300, dtype=np.uint8)))
    (root / "folder.onnx").mkdir()
    (root / "afile").write_text("a file, not a folder\n")
    (root / "ext").mkdir()
    _external(root / "ext" / "missing.onnx", truncate=False)
    _external(root / "ext" / "short.onnx", truncate=True)
    np.savez(root / "good.npz", x=np.ones((4, 8), np.float32))
    _npz_with_header(root / "huge.npz", _npy_header((2**22, 2**22, 2**20)))  # claims 146 TiB... and more
    _npz_with_header(root / "corrupt.npz", b"\x93NUMPY\x01\x00\xff\xffnot a header at all")
    np.savez(root / "ids.npz", x=np.ones((4, 8), np.int64))
    shutil.copy(TRT_DATA / MNIST, root / "layers.json")
    (root / "tiny.toml").write_text(TINY_MLP_PROFILE)
    (root / "badfactories.py").write_text(FACTORIES)
    (root / "syntaxmod.py").write_text("def make(:\n    pass\n")
    (root / "importfail.py").write_text("raise ImportError('libfoo.so: cannot open shared object file')\n")
    (root / "raising.toml").write_text(_profile("badfactories:raises"))
    (root / "typeerror.toml").write_text(_profile("badfactories:inner_type_error"))
    (root / "kwargs.toml").write_text(_profile("badfactories:inner_type_error", "kwargs = { width = 3 }"))
    (root / "syntax.toml").write_text(_profile("syntaxmod:make"))
    (root / "importfail.toml").write_text(_profile("importfail:make"))
    (root / "seed.toml").write_text(_profile("factories:tiny_mlp", f"seed = {2**70}"))
    (root / "\x1b]0;evil\x07.onnx").write_bytes(b"")
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


BUILD_LEFTOVERS = ("o/manifest.json", "o/.lock")

CASES = {
    # 1. OSError on output: one line naming the path and what to do
    "report -o a directory": Case(("report", "layers.json", "-o", "folder.onnx"), "folder.onnx: is a directory"),
    "diff -o a directory": Case(("diff", "layers.json", "layers.json", "-o", "folder.onnx"), "is a directory"),
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
    "compare unrelated models": Case(("compare", "good.onnx", "other.onnx", "--inputs", "good.npz"), "they are not two precisions of one graph"),
    "compare models with other inputs": Case(("compare", "good.onnx", "foreign_inputs.onnx", "--inputs", "good.npz"), "model input 'tokens' has no data"),
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
    "build from a model the profile does not feed": Case(("build", "--profile", "tiny.toml", "--onnx", "foreign_inputs.onnx", "--out", "o"), "model input 'tokens' is not in profile tiny-mlp's [[inputs]]", new_files=BUILD_LEFTOVERS),
    "build --calib without --int8": Case(("build", "--calib", "good.npz"), "--calib is calibration data for the INT8 stage"),
    "build --preset without --int8": Case(("build", "--preset", "modelopt"), "--preset chooses the INT8 Q/DQ placement"),
    "build --min-cosine without a precision": Case(("build", "--min-cosine", "0.9"), "--min-cosine is the accuracy gate"),
    "quantize --calib with --fp16 only": Case(("quantize", "good.onnx", "--fp16", "--calib", "good.npz", "-o", "out.onnx"), "--calib is calibration data for --int8"),
    # 5. inputs are never outputs
    "optimize -o its input": Case(("optimize", "good.onnx", "-o", "good.onnx"), "is also an input of this command"),
    "quantize -o its input": Case(("quantize", "good.onnx", "--fp16", "-o", "./good.onnx"), "is also an input of this command"),
    "lint-qdq -o its input": Case(("lint-qdq", "good.onnx", "-o", "good.onnx"), "is also an input of this command"),
    # 10. decoders (issue 22): cache layouts, encoder-decoders, sizes, dims the generation check cannot use
    "with-past on an encoder": Case(("export", "--profile", "bert-with-past.toml", "-o", "m.onnx"), 'BertModel takes no KV cache'),
    "with-past on an encoder-decoder": Case(("export", "--profile", "t5-with-past.toml", "-o", "m.onnx"), "T5Model is an encoder-decoder; one graph with past"),
    "init an encoder-decoder": Case(("init", "--hf", "t5", "-o", "t5.toml"), "T5 is an encoder-decoder model"),
    "cache inputs of a layer the model lacks": Case(("export", "--profile", "llama-layer7.toml", "-o", "m.onnx"),
                                                    "the cache inputs must be past_key_values.{i}.key and .value for i in 0..1"),
    "more new tokens than the cache holds": Case(("export", "--profile", "llama-many-tokens.toml", "-o", "m.onnx"),
                                                 "export.new_tokens = 100 does not fit dims.past_seq.max = 56"),
    "a 7B default config": Case(("export", "--profile", "llama-full-size.toml", "-o", "m.onnx"), "M parameters, "),
    "build --min-token-agreement without a precision": Case(("build", "--min-token-agreement", "0.5"), "--min-token-agreement is the generation gate"),
    "a dim other than past_seq at 0": Case(("export", "--profile", "batch-min-0.toml", "-o", "m.onnx"), "dims.batch.min: 0 is allowed only for past_seq"),
    # 9. names from files reach the terminal escaped
    "control characters in a path": Case(("optimize", "\x1b]0;evil\x07.onnx", "-o", "out.onnx"), "\\x1b]0;evil\\x07.onnx: is empty"),
}


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


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
