"""Strict test doubles of real classes (TensorRT's pybind11 classes, CuPy's, Polygraphy's CUDA wrapper).

`Doubles.make(cls)` starts from `create_autospec(cls, instance=True, spec_set=True)`: a misspelt
method or a new attribute fails. It adds what the real binding enforces and autospec cannot see,
read from the class itself (pybind11 writes every overload's signature, with types, into the
docstring; CuPy and Polygraphy have Python signatures):
- every call is bound to one of the method's overloads (count, names, and types: a TensorRT class
  or enum, int, float, bool, str, buffer, sequence) or fails with TypeError, as pybind11 does;
- a read-only property cannot be set (AttributeError), a property takes only its declared type;
- results follow the declared return type (a double of the returned class, True for bool, 0 for
  int, the enum's first member, ...) unless the simulated GPU (world.py) answers that member, and
  an answer of the wrong type is an error of the harness, not of the code under test.
- a method object used as a value (truth test, comparison, str() or formatting: a call forgotten, as
  in `if error.node_name:`) raises TypeError. Python itself allows it: on a GPU the test is always
  true and the text reads "<bound method ...>", so the mistake would pass silently; the doubles make
  it loud, for every method the real class has (pybind11's `instancemethod`s, CuPy's functions).
Calls (with what they returned) and property sets are written to `journal`, with enum members as
`Enum.NAME`, doubles as `Class#n` and values as JSON, so tests can assert what the code asked TensorRT.
"""

from __future__ import annotations

import inspect
import itertools
import re
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

SIGNATURE = re.compile(r"^(?:\d+\. )?(?P<name>[\w.]*)\((?P<params>.*)\)(?: -> (?P<returns>.+))?$")
SEQUENCE = re.compile(r"^(?:list|List|tuple|Tuple|collections\.abc\.Sequence|typing\.Sequence)(?:\[(?P<item>.*)\])?$")
ANY = {"object", "typing_extensions.CapsuleType", "capsule", "method", "memoryview", "numpy.ndarray", "typing.Any", "Any"}
ATTRIBUTES = (property, types.GetSetDescriptorType, types.MemberDescriptorType)
MAGIC = ("__len__", "__getitem__", "__bool__", "__str__")
VALUE_USES = {"__bool__": "truth test", "__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=",
              "__str__": "str()", "__format__": "formatting"}


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    optional: bool


@dataclass(frozen=True)
class Overload:
    params: tuple[Param, ...]
    returns: str

    def __str__(self) -> str:
        return f"({', '.join(f'{p.name}: {p.type}' for p in self.params)}) -> {self.returns}"


def signatures(function) -> list[Overload]:
    """A callable's overloads, from pybind11's docstring lines (a property's accessors have no name there)
    or else Python's signature; `self` (pybind11's `arg0` of an accessor) left out."""
    name = getattr(function, "__name__", "")
    found = []
    for line in (getattr(function, "__doc__", None) or "").splitlines():
        match = SIGNATURE.match(line.strip())
        if match and match["name"].rsplit(".", 1)[-1] in ("", name) and "*args" not in match["params"]:
            params = [_param(text) for text in _split(match["params"])]
            if not match["name"]:
                params = params[1:]
            found.append(Overload(tuple(p for p in params if p.name != "self"), (match["returns"] or "object").strip()))
    if found:
        return found
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    params = tuple(Param(p.name, "object", p.default is not inspect.Parameter.empty) for p in signature.parameters.values()
                   if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return [Overload(params, "object")]


def _split(text: str) -> list[str]:
    """Split a parameter list on its top-level commas (types contain [..], defaults contain <..>)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char in "[(<") - (char in "])>")
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [part for part in [*parts, current.strip()] if part]


def _param(text: str) -> Param:
    if ":" not in text.split("=", 1)[0]:
        name, _, default = text.partition("=")
        return Param(name.strip(), "object", bool(default))
    name, rest = text.split(":", 1)
    kind, _, default = rest.partition(" = ")
    return Param(name.strip(), kind.strip(), bool(default))


def _is_enum(value) -> bool:
    return hasattr(type(value), "__members__") and hasattr(value, "name")


def _is_int(value) -> bool:
    return not isinstance(value, (float, str, bytes)) and (isinstance(value, int) or hasattr(type(value), "__index__"))


class Doubles:
    """Makes strict doubles for the classes of `module` (the real TensorRT bindings) and journals their use."""

    def __init__(self, module: types.ModuleType, journal: list[dict[str, Any]]):
        self.module, self.journal = module, journal
        self.labels: dict[int, str] = {}
        self.alive: list[Any] = []  # keeps ids (labels) unique
        self.counters: dict[str, itertools.count] = defaultdict(lambda: itertools.count(1))
        self.host_memory = _host_memory_class(module)

    # --- types, as pybind11 checks them -------------------------------------------------------
    def resolve(self, text: str) -> type | None:
        """The class a type name means: `tensorrt_bindings.tensorrt.X`, or a C++ name like `nvonnxparser::IParserError`."""
        name = re.split(r"\.|::", text)[-1]
        for candidate in (name, name[1:] if name.startswith("I") else ""):
            found = getattr(self.module, candidate, None) if candidate else None
            if isinstance(found, type):
                return found
        return None

    def accepts(self, text: str, value, optional: bool = False) -> bool:
        text = text.strip()
        if text in ANY:
            return True
        if text == "None":
            return value is None
        if text in ("int", "typing.SupportsInt"):
            return _is_int(value)
        if text in ("float", "typing.SupportsFloat"):
            return _is_int(value) or isinstance(value, float) or (hasattr(type(value), "__float__") and not isinstance(value, (str, bytes)))
        if text == "bool":  # pybind11 converts None and numbers to bool, not enums or strings
            return value is None or type(value).__name__ == "bool_" or (isinstance(value, (int, float)) and not _is_enum(value))
        if text == "str":
            return isinstance(value, str)
        if text == "bytes":
            return isinstance(value, bytes)
        if text in ("typing_extensions.Buffer", "buffer"):
            try:
                memoryview(value)
            except TypeError:
                return False
            return True
        sequence = SEQUENCE.match(text)
        if sequence:
            item = sequence["item"]
            if not isinstance(value, (list, tuple)):
                return False
            return not item or "," in item or all(self.accepts(item, v) for v in value)
        cls = self.resolve(text)
        if cls is None:
            return True  # a C++ type the bindings do not name: nothing to check against
        if issubclass(cls, self.module.Dims) or cls.__name__ == "Permutation":
            return isinstance(value, cls) or (isinstance(value, (list, tuple)) and all(_is_int(v) for v in value))
        if hasattr(cls, "__members__"):
            return isinstance(value, cls)
        return isinstance(value, cls) or (optional and value is None)

    def default(self, text: str):
        """What a call returns when the simulated GPU does not answer it: the declared type's plain value."""
        text = text.strip()
        plain = {"None": None, "bool": True, "int": 0, "float": 0.0, "str": "", "bytes": b""}
        if text in plain:
            return plain[text]
        if SEQUENCE.match(text):
            return []
        cls = self.resolve(text)
        if cls is None:
            return None
        if cls is self.module.IHostMemory:
            return self.host_memory(b"")
        if issubclass(cls, self.module.Dims):
            return self.module.Dims()
        if hasattr(cls, "__members__"):
            return next(iter(cls.__members__.values()))
        return self.make(cls)

    # --- journal ------------------------------------------------------------------------------
    def render(self, value):
        """A JSON value for the journal."""
        if id(value) in self.labels:
            return self.labels[id(value)]
        if _is_enum(value):
            return f"{type(value).__name__}.{value.name}"
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            return f"bytes:{data.decode('latin-1')}" if len(data) <= 64 else f"<{len(data)} bytes>"
        if isinstance(value, self.module.Dims):
            return list(value)
        if isinstance(value, (list, tuple)):
            return [self.render(v) for v in value]
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return f"<array {list(value.shape)} {value.dtype}>"
        if hasattr(value, "item"):
            return value.item()
        bases = [c.__name__ for c in type(value).__mro__ if c.__module__.startswith(self.module.__name__)]
        return f"<{bases[0] if bases else type(value).__name__}>"

    def record(self, entry: dict[str, Any]) -> None:
        self.journal.append(entry)

    # --- doubles ------------------------------------------------------------------------------
    def label(self, cls: type, double) -> str:
        name = f"{cls.__name__}#{next(self.counters[cls.__name__])}"
        self.labels[id(double)] = name
        self.alive.append(double)
        return name

    def bind(self, owner: str, overloads: list[Overload], args: tuple, kwargs: dict) -> tuple[Overload, dict[str, Any]]:
        """The overload a call matches and its arguments by name, or pybind11's TypeError."""
        for overload in overloads:
            names = [p.name for p in overload.params]
            if len(args) > len(names) or any(k not in names or k in names[: len(args)] or re.fullmatch(r"arg\d+", k) for k in kwargs):
                continue
            bound = dict(zip(names, args)) | kwargs
            if all((p.name in bound and self.accepts(p.type, bound[p.name], p.optional)) or (p.name not in bound and p.optional)
                   for p in overload.params):
                return overload, bound
        supported = "; ".join(f"{i}. {o}" for i, o in enumerate(overloads, 1))
        shown = ", ".join([*(repr(self.render(a)) for a in args), *(f"{k}={self.render(v)!r}" for k, v in kwargs.items())])
        raise TypeError(f"{owner}(): incompatible function arguments. The following argument types are supported: {supported}. Invoked with: {shown}")

    def make(self, cls: type, answers: dict[str, Any] | None = None, instance_attributes: tuple[str, ...] = ()):
        """A strict double of an instance of `cls`; `answers[member]` gives a method's result (a callable
        taking the call's arguments) or a property's value (a value, or a callable taking none).
        `instance_attributes` are read-only attributes the real __init__ sets, which the class does not list."""
        double = mock.create_autospec(cls, instance=True, spec_set=True)
        label, answers, values = self.label(cls, double), dict(answers or {}), {}
        for name in instance_attributes:
            setattr(type(double), name, property(lambda _double, name=name: _value(answers[name])))
        for name in dir(cls):
            if name.startswith("__") and name not in MAGIC:
                continue
            member = inspect.getattr_static(cls, name, None)
            if member is None:
                member = getattr(cls, name, None)
            if isinstance(member, ATTRIBUTES):
                setattr(type(double), name, self._attribute(cls, name, member, answers, values, label))
            elif callable(getattr(cls, name, None)) and (not name.startswith("__") or any(name in vars(c) for c in cls.__mro__[:-1])):
                overloads = signatures(getattr(cls, name))
                if overloads:
                    getattr(double, name).side_effect = self._method(cls, name, overloads, answers, label)
                if not name.startswith("__") and inspect.isroutine(getattr(cls, name)):
                    _refuse_use_as_value(getattr(double, name), f"{cls.__name__}.{name}")
        return double

    def _method(self, cls: type, name: str, overloads: list[Overload], answers: dict, label: str) -> Callable:
        def call(*args, **kwargs):
            overload, bound = self.bind(f"{cls.__name__}.{name}", overloads, args, kwargs)
            if name == "__getitem__" and hasattr(cls, "__len__") and _is_int(args[0]) and args[0] >= _value(answers.get("__len__", 0)):
                raise IndexError(args[0])  # ends iteration, as the real sequence does
            if name not in answers:
                value = self.default(overload.returns)
            else:
                value = answers[name](*args, **kwargs)
                if not self.accepts(overload.returns, value, optional=True):
                    raise AssertionError(f"harness bug: the world answered {cls.__name__}.{name} with {value!r}, not a {overload.returns}")
            if not name.startswith("__"):
                self.record({"call": f"{cls.__name__}.{name}", "on": label, "args": {k: self.render(v) for k, v in bound.items()},
                             "returns": self.render(value)})
            return value

        return call

    def _attribute(self, cls: type, name: str, member, answers: dict, values: dict, label: str) -> property:
        kinds = signatures(member.fget) if isinstance(member, property) and member.fget else []
        returns = kinds[0].returns if kinds else "object"
        setter_kinds = signatures(member.fset) if isinstance(member, property) and member.fset else []
        settable = isinstance(member, property) and member.fset is not None

        def get(_double):
            if name in values:
                return values[name]
            if name in answers:
                value = _value(answers[name])
                if not self.accepts(returns, value, optional=True):
                    raise AssertionError(f"harness bug: the world answered {cls.__name__}.{name} with {value!r}, not a {returns}")
                return value
            attached = self.resolve(returns)
            if attached is not None and not issubclass(attached, self.module.Dims) and not hasattr(attached, "__members__"):
                return None  # an object nobody attached (profiler, allocator, ...)
            return self.default(returns)

        def set_(_double, value):
            kind = setter_kinds[0].params[-1] if setter_kinds and setter_kinds[0].params else Param("value", "object", False)
            if not self.accepts(kind.type, value, optional=self.resolve(kind.type) is not None):
                raise TypeError(f"{cls.__name__}.{name}: incompatible property value {self.render(value)!r}; takes {kind.type}")
            values[name] = value
            self.record({"set": f"{cls.__name__}.{name}", "on": label, "value": self.render(value)})

        return property(get, set_ if settable else None)


def _value(answer):
    return answer() if callable(answer) else answer


def _refuse_use_as_value(method: mock.Mock, qualified_name: str) -> None:
    """Make a double's method object raise TypeError where it is used as a value instead of called.
    Each mock has a class of its own, so this changes this method object only."""
    name = qualified_name.rsplit(".", 1)[-1]

    def refusal(use: str):
        def refuse(_method, *args):
            raise TypeError(f"{qualified_name} is a method, used here as a value ({use}): call it, {name}(...)")

        return refuse

    for dunder, use in VALUE_USES.items():
        setattr(type(method), dunder, refusal(use))


def _host_memory_class(module: types.ModuleType) -> type:
    """IHostMemory as the simulated GPU returns it: a real buffer of bytes with IHostMemory's members only."""
    real = module.IHostMemory
    members = {name for name in dir(real) if not name.startswith("_")}

    class HostMemory(bytes):
        def __getattribute__(self, name):
            if not name.startswith("_") and name not in members:
                raise AttributeError(f"'IHostMemory' object has no attribute '{name}'")
            return super().__getattribute__(name)

        @property
        def __class__(self):
            return real

        @property
        def dtype(self):
            return module.DataType.UINT8

        @property
        def nbytes(self):
            return len(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    return HostMemory
