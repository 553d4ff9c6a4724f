"""Render a report or a diff: text (the verdict, then tables), Markdown, JSON, or one self-contained HTML page.

Layer and node names come from untrusted models: text and Markdown neutralize control characters
(terminal escape sequences never reach the terminal raw), Markdown escapes table syntax, HTML
autoescapes everything (jinja2).
"""

from __future__ import annotations

from typing import Any

FORMATS = ("text", "json", "md", "html")


def render(data: dict[str, Any], fmt: str, kind: str, width: int = 160, all_rows: bool = False, pretty: bool = False) -> str:
    """`kind` is "report" or "diff". Text shows the first rows of long tables unless `all_rows`;
    JSON is compact unless `pretty`."""
    if fmt == "json":
        import orjson  # 4x the standard encoder on a 40,000-layer report

        return orjson.dumps(data, option=orjson.OPT_INDENT_2 if pretty else 0).decode() + "\n"
    if fmt == "html":
        from trt.render.html import html

        return html(data, kind)
    if fmt == "md":
        from trt.render.markdown import diff_md, report_md

        return report_md(data) if kind == "report" else diff_md(data)
    from trt.render.text import text

    return text(data, kind, width, all_rows)
