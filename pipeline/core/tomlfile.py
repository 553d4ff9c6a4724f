"""Reading a TOML file a user wrote (a profile, a jobs matrix) and saying in one line what is wrong with it."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ValidationError

from pipeline.core.errors import PipelineError
from pipeline.core.fileio import describe_os_error


def read_toml(path: Path, error: type[PipelineError], what: str) -> dict[str, Any]:
    """The table in `path`; a file that cannot be read or is not TOML is one `error` line naming it."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise error(describe_os_error(err, path, writing=False)) from err
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save the {what} as UTF-8 TOML") from err
    except tomllib.TOMLDecodeError as err:
        raise error(f"{path}: invalid TOML: {err}") from err


def describe_validation_error(err: ValidationError, schema: type[BaseModel], what: str) -> str:
    """One line: the first two problems' keys and what to do, and how many more. A misspelt key comes first (it usually
    causes a "missing" one), with the closest key or the keys its table takes."""
    errors = sorted(err.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    text = "; also ".join(_problem(error, schema, what) for error in errors[:2])
    more = len(errors) - 2
    return text + (f" (+{more} more problem{'s' if more > 1 else ''})" if more > 0 else "")


def _problem(error: dict, schema: type[BaseModel], what: str) -> str:
    """`key: what is wrong with it` for one of pydantic's errors."""
    key = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in error["loc"]).replace(".[", "[")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        fields = _fields_at(schema, error["loc"][:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1)
        message = f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key; this table takes: {', '.join(fields)}"
    elif error["type"] == "missing":
        message = "required key is missing"
    elif error["type"] == "literal_error":
        message = f"{error['input']!r} is not known: {message[0].lower()}{message[1:]}"
    return f"{key}: {message}" if key else f"{what}: {message}"


def _fields_at(schema: type[BaseModel], loc: tuple) -> list[str]:
    """The keys of the table at `loc` inside `schema` (list indexes and dict keys stepped over)."""
    model: type[BaseModel] | None = schema
    for part in loc:
        if model is not None and not isinstance(part, int) and part in model.model_fields:
            model = _model_in(model.model_fields[part].annotation)
    return [name for name, field in model.model_fields.items() if not field.exclude] if model is not None else []


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (`X`, `list[X]`, `dict[str, X]`, `X | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, tuple, dict, typing.Union, types.UnionType):
        for argument in reversed(typing.get_args(annotation)):
            found = _model_in(argument)
            if found is not None:
                return found
    return None
