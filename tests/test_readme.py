"""The README's quick start is what CI runs, and it advertises only commands that exist."""

import re

from conftest import REPO, run_cli


def quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", section, flags=re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_quick_start_has_two_commands_and_ci_runs_the_test_one():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    setup_and_build, setup_and_test = commands
    assert "torch==2.13.0" in setup_and_build and "python -m pipeline build" in setup_and_build
    assert "python -m pytest" in setup_and_test
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert setup_and_test in [line.strip() for line in ci]


def test_every_subcommand_in_the_readme_exists():
    text = (REPO / "README.md").read_text()
    advertised = set(re.findall(r"python -m pipeline ([a-z][a-z-]+)", text))
    listed = run_cli("--help").stdout
    missing = [cmd for cmd in advertised if not re.search(rf"^\s+{cmd}\s", listed, flags=re.MULTILINE)]
    assert not missing, f"README advertises commands the CLI does not have: {missing}"
