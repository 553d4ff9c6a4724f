"""The `python -m pipeline` application: the typer app, the consoles, the options and output the
command groups share, and `main`, which turns every failure into one line and an exit code.

Only light modules are imported here; each command imports its stage's heavy dependencies
(torch, onnxruntime, modelopt, tensorrt) when it runs.
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from pipeline import __version__, interrupts, precisions
from pipeline.core.errors import PipelineError, first_line
from pipeline.core.text import printable, printable_json

app = typer.Typer(
    name="pipeline",
    help=(
        "PyTorch/ONNX -> TensorRT deployment pipeline with fusion reports.\n\n"
        "Examples:\n\n"
        "  python -m pipeline build                      # default profile bert-tiny\n\n"
        "  python -m pipeline build --profile bert-base --until export\n\n"
        "  python -m pipeline export --exporter torchscript -o bert.onnx"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console(stderr=True, soft_wrap=True)  # a line is never broken in two: a path stays whole


class _StdoutConsole(Console):
    keep_going = False  # a command doing work (build, jobs run) finishes it when the reader of its output goes away

    def on_broken_pipe(self) -> None:
        """Rich would exit 1. A command that only shows something stops quietly (`report ... | head`: `main` ends a
        closed pipe as other CLIs do); one that does work goes on with its output silenced (`build ... | head -2`
        stopped a build halfway with exit 0)."""
        self.quiet = True
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush has somewhere to go
        if not self.keep_going:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def stdout_console(keep_going: bool = False) -> Console:
    """Rich output on stdout; 140 columns when piped so tables are not cut. A printed line is never broken
    into two (soft wrap: the terminal folds it), so a path or a reason stays whole for grep and for copying.
    `keep_going`: the command's work goes on when the reader of its output goes away."""
    probe = _StdoutConsole(file=sys.stdout, soft_wrap=True)
    # bound to the real stdout now: stages capture sys.stdout while third-party code runs
    chosen = probe if probe.is_terminal else _StdoutConsole(file=sys.stdout, width=140, soft_wrap=True)
    chosen.keep_going = keep_going
    return chosen


_debug = False


def choices(name: str, values) -> type[Enum]:
    """A typer choice of `values`: an Enum of str, each member named as its value with `-` as `_`."""
    return Enum(name, {value.replace("-", "_"): value for value in values}, type=str)


ProfileOption = Annotated[
    str, typer.Option("--profile", "-p", help="Profile name (profiles/NAME.toml) or path to a .toml file.")
]


def precision_flags(command: Callable) -> Callable:
    """A `--<name>` flag for each precision of the registry, placed where `command` takes `precisions`;
    the command receives the names of those given, as a frozenset."""
    signature = inspect.signature(command, eval_str=True)
    flags = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=False,
                               annotation=Annotated[bool, typer.Option(f"--{p.name}", help=p.help)]) for p in precisions.optional()]
    parameters = []
    for parameter in signature.parameters.values():
        parameters += flags if parameter.name == "precisions" else [parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY)]

    @functools.wraps(command)
    def with_flags(**given):
        chosen = frozenset(p.name for p in precisions.optional() if given.pop(p.name))
        return command(precisions=chosen, **given)

    del with_flags.__wrapped__  # typer reads the signature below, not the command's
    with_flags.__signature__ = signature.replace(parameters=parameters)
    with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
    return with_flags


def _version(value: bool) -> None:
    if value:
        print(f"trt-pipeline {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    global _debug
    _debug = debug

SUFFIX_FORMATS = {".txt": "text", ".json": "json", ".md": "md", ".html": "html", ".htm": "html"}


def output_format(given: Optional[str], output: Optional[Path], formats: tuple[str, ...], default: str = "text", inputs=()) -> str:
    """--format, else the one `-o FILE`'s suffix names (`-o page.html` writes HTML, not text into an .html file),
    else `default`; a suffix that names none of the command's formats is refused, not written in another. The
    output is checked first (a directory, one of the command's `inputs`)."""
    from pipeline.core.fileio import check_outputs

    check_outputs([output], list(inputs))
    if given is not None:
        if given not in formats:
            raise PipelineError(f"--format {given!r}: use {', '.join(formats[:-1])} or {formats[-1]}")
        return given
    if output is None or not output.suffix:
        return default
    named = SUFFIX_FORMATS.get(output.suffix.lower())
    if named not in formats:
        raise PipelineError(f"-o {output}: {output.suffix!r} names none of this command's formats ({', '.join(formats)}); "
                            f"pass --format, or -o a file ending in {', '.join(s for s, f in SUFFIX_FORMATS.items() if f in formats)}")
    return named


def emit(text: str, output: Optional[Path], is_json: bool = False) -> None:
    """Write a command's result to stdout or `output`; control characters from model or engine
    names are escaped (in JSON as \\u escapes, so it stays valid)."""
    text = printable_json(text) if is_json else printable(text)
    if output is None:
        sys.stdout.write(text)
        return
    from pipeline.core.fileio import write_text

    write_text(output, text)
    console.print(f"wrote {output}", highlight=False, markup=False)

def main() -> None:
    """Entry point: every failure is one line on stderr and an exit code, unless --debug.

    0 ok; 1 a check failed or a bug (the line says which); 2 bad input or usage; 3 a capability
    is missing under --strict; 130 interrupted (Ctrl-C).
    """
    interrupts.install()
    if "--debug" in sys.argv[2:]:  # the application's option, taken after the command too: error lines say "rerun with --debug"
        sys.argv[1:] = ["--debug", *(arg for arg in sys.argv[1:] if arg != "--debug")]
    try:
        code = app(standalone_mode=False)
        if interrupts.interrupted():  # typer turns a KeyboardInterrupt into a silent exit 130
            _error_line("interrupted")
            code = interrupts.EXIT_CODE
    except SystemExit as err:
        code = 0 if _click_saw_a_closed_pipe() else _report_failure(err)
    except BaseException as err:  # noqa: BLE001 - each kind is described below, none escapes as a traceback
        if _debug and not isinstance(err, SystemExit):
            import traceback

            traceback.print_exception(err)  # then the same line and exit code as without --debug
        code = _report_failure(err)
    sys.exit(code or 0)


def _click_saw_a_closed_pipe() -> bool:
    """The reader of stdout went away (`| head -1`): not an error, the command stops quietly as other CLIs do.
    typer (click, or the copy of click it vendors) turns the BrokenPipeError into exit 1 after wrapping
    stdout in its PacifyFlushWrapper, so that the interpreter's final flush is quiet."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _report_failure(err: BaseException) -> int:
    """Print one line for `err`; return the exit code."""
    if isinstance(err, SystemExit):
        return err.code if isinstance(err.code, int) else 1
    if interrupts.interrupted() or isinstance(err, (KeyboardInterrupt, typer.Abort)):
        _error_line("interrupted")
        return interrupts.EXIT_CODE
    if isinstance(err, PipelineError):
        _error_line(str(err))
        return err.exit_code
    if isinstance(err, typer.TyperException):  # usage: unknown option, missing argument, bad value
        context = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(err.format_message() + "\n")
            return 0
        command = context.command_path if context is not None else _command_path()
        message = err.format_message().replace("Value error, ", "").rstrip(".")
        _error_line(f"{message} (see `{command} --help`)")
        return err.exit_code
    if isinstance(err, OSError):
        from pipeline.core.fileio import describe_os_error

        _error_line(describe_os_error(err))
        return 2
    if isinstance(err, MemoryError):
        _error_line("out of memory; use a smaller model, batch or sample count, or a machine with more memory")
        return 1
    _error_line(f"internal error (a bug in trt-pipeline): {type(err).__name__}: {first_line(err)}; rerun with --debug and report the traceback")
    return 1


def _command_path() -> str:
    """`python -m pipeline CMD` for the command on the command line (click gives no context for an option missing
    its value), else the application."""
    commands = {command.name or command.callback.__name__.replace("_", "-") for command in app.registered_commands}
    named = next((arg for arg in sys.argv[1:] if arg in commands), None)
    return f"python -m pipeline {named}" if named else "python -m pipeline"


def _error_line(message: str) -> None:
    console.print(f"error: {printable(message)}", markup=False, highlight=False, soft_wrap=True)
