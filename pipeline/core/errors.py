"""The project's one exception family. Messages say what, where, and what to do."""


class PipelineError(Exception):
    """An error a user can act on. The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 2


class ProfileError(PipelineError):
    """A profile file is missing, malformed or invalid."""


class InputError(PipelineError):
    """A file or argument given by the user cannot be used."""


class StageFailed(PipelineError):
    """A stage ran but its result failed a check (numerics, accuracy gate)."""

    exit_code = 1


class CapabilityMissing(PipelineError):
    """A required capability (TensorRT, a GPU) is not on this machine and `--strict` was given."""

    exit_code = 3


def first_line(err: BaseException) -> str:
    """What an error line quotes of a library's exception: its message's first line that says something (a line
    ending in ":" runs on into the next), and the innermost cause's when that is another exception's; its type
    when it has no message."""
    said = _said(err) or type(err).__name__
    cause = err
    while (inner := cause.__cause__ or cause.__context__) is not None and inner is not cause and len(said) < 400:
        cause = inner
    if cause is not err and (because := _said(cause)) and because not in said:
        said += f" (caused by {type(cause).__name__}: {because})"
    return said


def _said(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = lines[0] if lines else ""
    for line in lines[1:3]:
        if not said.endswith(":"):
            break
        said += " " + line
    return said
