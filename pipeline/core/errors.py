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
    """The first line of a library's exception message (its type when it has none): what an error line quotes."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
