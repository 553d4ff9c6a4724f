"""Render a report or a diff as text, Markdown, JSON or one self-contained HTML page. Names come from untrusted
models: text and Markdown neutralize control characters, Markdown escapes table syntax, HTML autoescapes (jinja2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trt.views import Diff, Report

FORMATS = ("text", "json", "md", "html")


def render(view: Report | Diff, fmt: str, width: int = 160, all_rows: bool = False, pretty: bool = False) -> str:
    """A report or a diff in `fmt`. Text shows the first rows of long tables unless `all_rows`;
    JSON is compact unless `pretty`."""
    if fmt == "json":
        import orjson  # 4x the standard encoder on a 40,000-layer report

        return orjson.dumps(view.to_json(), option=orjson.OPT_INDENT_2 if pretty else 0).decode() + "\n"
    if fmt == "html":
        from trt.render.html import html

        return html(view)
    if fmt == "md":
        from trt.render.markdown import diff_md, report_md
        from trt.views import Report

        return report_md(view) if isinstance(view, Report) else diff_md(view)
    from trt.render.text import text

    return text(view, width, all_rows)
