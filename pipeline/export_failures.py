"""An exporter's failure as one line: the operator with no ONNX translation and the module calling it, or the dynamic
dims the dynamo exporter could not decompose the model at, or the exporter's own root cause."""

from __future__ import annotations

import re
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.profiles import Profile

_OP_PATTERNS = (
    re.compile(r"No ONNX function found for <OpOverload\(op='(?P<op>[\w.]+)'"),
    re.compile(r"operator '(?P<op>[\w:.]+)' to ONNX opset"),
    re.compile(r"target=torch\.ops\.(?P<op>[\w.]+?)(?:\.default)?\]"),
)


def exporter_failure(err: Exception, module: Any, example: tuple, exporter: str, profile: Profile) -> Exception:
    """Turn an exporter failure into one line naming the operator and the module that calls it."""
    text = "\n".join(str(e) for e in _chain(err))
    if "Failed to decompose the FX graph" in text:  # torch.export ran; an operator failed on its symbolic shapes
        return InputError(
            f"export: the {exporter} exporter could not decompose the model at its dynamic dims: {_summary(text)}; "
            "that exporter cannot export this model with these [dims]: set `[export] exporter = \"torchscript\"` in the profile "
            "(`export --exporter torchscript` for one export), or make the dims static"
        )
    for pattern in _OP_PATTERNS:
        if match := pattern.search(text):
            op = match["op"].replace("::", ".")
            where = locate_operator(module, example, op)
            place = f"called in module '{where[0]}' ({where[1]})" if where else "its calling module could not be found"
            return InputError(
                f"export: operator {op} has no ONNX translation in the {exporter} exporter at opset {profile.export.opset}; "
                f"{place}; replace it in the model or try the other exporter (--exporter), no fallback is attempted"
            )
    return InputError(f"export: the {exporter} exporter failed: {_summary(text) or type(err).__name__}; rerun with --debug for the trace")


def locate_operator(module: Any, example: tuple, op: str) -> tuple[str, str] | None:
    """Run the model once and return (qualified name, class) of the innermost module calling `op`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    wanted = op.split(".")[-1] if op.count(".") == 1 else op.split(".")[1]
    stack: list[tuple[str, str]] = [("<root>", type(module).__qualname__)]
    found: list[tuple[str, str]] = []

    class _Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not found and func.overloadpacket.__name__ == wanted:
                found.append(stack[-1])
            return func(*args, **(kwargs or {}))

    def enter(name: str):
        def hook(sub, args) -> None:
            stack.append((name, type(sub).__qualname__))

        return hook

    def leave(sub, args, output) -> None:
        stack.pop()

    handles = []
    for name, sub in module.named_modules():
        if name:
            handles += [sub.register_forward_pre_hook(enter(name)), sub.register_forward_hook(leave)]
    try:
        with torch.no_grad(), _Spy():
            module(*example)
    except Exception:
        return found[0] if found else None
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def _chain(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _summary(text: str) -> str:
    """The root cause line of an exporter error ("<class 'X'>: message" in its summary), else its first line."""
    causes = re.findall(r"^<class '[\w.]+'>: (.+)$", text, flags=re.MULTILINE)
    lines = [line for line in text.splitlines() if line.strip()]
    return re.sub(r"\x1b\[[0-9;]*m", "", causes[0] if causes else lines[0] if lines else "")
