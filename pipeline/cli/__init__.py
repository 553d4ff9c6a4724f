"""`python -m pipeline ...`: the command-line interface (typer + rich), one module per command group;
importing the groups registers their commands, in the order `--help` lists them."""

from pipeline.cli import build, check, convert, engines, jobs, predict, setup  # noqa: F401 - registers the commands
from pipeline.cli.app import app, main

__all__ = ["app", "main"]
