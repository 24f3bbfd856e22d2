"""The compare report as one self-contained HTML page (``compare/report.html``), its images embedded.

    python -c "from verlflow.compare.report_html import report_page; import pathlib; \
print(report_page(pathlib.Path('out/report.md').read_text(), pathlib.Path('out'), 'compare'))" > report.html

MLflow's artifact view shows ``report.md`` as Markdown but not the images it references by relative path
(``![curves](curves.png)`` reads as text there), and nothing on an air-gapped cluster may load from the web.
The page inlines every image the report references as a ``data:`` URI and is rendered with markdown-it-py
(CommonMark plus tables) where it is installed, else shown as preformatted text with the images below it.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

# ![alt](file.png): an image the report references beside it.
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.(?:png|jpe?g|webp|gif))\)")
_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%}")


def _data_uri(path: Path) -> str:
    kind = {"jpg": "jpeg"}.get(path.suffix[1:].lower(), path.suffix[1:].lower())
    return f"data:image/{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"


def report_page(report_md: str, folder: Path, title: str) -> str:
    """``report_md`` as a full HTML page; images it references in ``folder`` are embedded, missing ones dropped."""

    def embed(match: re.Match) -> str:
        image = folder / match.group(2)
        return f"![{match.group(1)}]({_data_uri(image)})" if image.is_file() else match.group(1)

    embedded = _IMAGE.sub(embed, report_md)
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        body = _preformatted(embedded)
    else:
        body = MarkdownIt("commonmark").enable("table").render(embedded)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")


def _preformatted(markdown: str) -> str:
    """The report as text, each embedded image shown as an image where it stood."""
    out, last = [], 0
    for match in re.finditer(r"!\[([^\]]*)\]\((data:image/[^)]+)\)", markdown):
        out.append(f"<pre>{html.escape(markdown[last:match.start()])}</pre>")
        out.append(f'<img alt="{html.escape(match.group(1))}" src="{match.group(2)}">')
        last = match.end()
    out.append(f"<pre>{html.escape(markdown[last:])}</pre>")
    return "\n".join(out)
