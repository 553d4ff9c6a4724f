"""The README is short and leads to docs/ (issue 27): its size and order, every relative link in it and in
docs/*.md resolves (file and #anchor), each topic page is one click away, and the outputs it shows are
what the commands print."""

import re

import pytest
from conftest import REPO, TRT_DATA, run_cli

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
TOPICS = ["models", "decoders", "stages", "optimize", "precisions", "compare", "report-diff", "tensorrt", "jobs", "performance", "errors", "design"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def broken_links(page) -> list[str]:
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{page.name}: {target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_sees_a_broken_file_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title here\n[ok](#title-here) [gone](b.md) [bad](a.md#nowhere)\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: b.md (no such file)", "a.md: a.md#nowhere (no such heading)"]


def test_the_readme_is_short_opens_with_a_picture_and_the_quick_start_and_links_every_topic_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    quick_start = lines.index("## Quick start")
    assert quick_start < 60
    assert any(re.match(r"!\[.+\]\(docs/[\w-]+\.png\)", line) for line in lines[:quick_start])
    linked = set(LINK.findall(README.read_text()))
    assert [topic for topic in TOPICS if f"docs/{topic}.md" not in linked] == []


def text_blocks(page) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```text\n(.*?)```", page.read_text(), flags=re.DOTALL)]


def examples_on_real_files() -> list[tuple[str, list[str]]]:
    """(page, block) for each shown `report` / `diff` run on the real TensorRT files, with its output."""
    found = []
    for page in PAGES:
        for block in text_blocks(page):
            if re.match(r"python -m pipeline (report|diff) tests/data/trt/", block[0]) and len(block) > 1:
                found.append((page.name, block))
    return found


@pytest.mark.parametrize(("page", "block"), examples_on_real_files(), ids=lambda x: x if isinstance(x, str) else x[0][19:60])
def test_shown_output_is_what_the_command_prints(page, block):
    result = run_cli(*block[0].split()[3:], cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[: len(block) - 1] == block[1:]


def test_the_first_run_shown_prints_each_stage_once_the_docker_command_once_and_ends_with_the_real_logs_verdict():
    from trt.report import report_from_files

    (block,) = [b for b in text_blocks(README) if b[0].startswith("profile bert-tiny from")]
    for stage in ("export", "optimize", "fp16", "int8", "build", "report", "diff", "bench"):
        assert sum(line.split()[:1] == [stage] for line in block) == 1, stage
    assert sum("docker run" in line for line in block) == 1
    verdict = report_from_files(TRT_DATA / "bert-fp16-trt10.10.detailed.log").verdict
    assert [line.strip() for line in block[-2:]] == ["python -m pipeline report tests/data/trt/bert-fp16-trt10.10.detailed.log", verdict]
