"""The compare report as one self-contained HTML page (``compare/report.html``), its images embedded.

    python -c "from verlflow.compare.report_html import report_page; import pathlib; \
print(report_page(pathlib.Path('out/report.md').read_text(), pathlib.Path('out'), 'compare', ['curves.png']))"

Nothing on an air-gapped cluster may load from the web, so the page inlines the images as ``data:`` URIs, and
only the images verlflow drew for this report (``images``, paths inside its folder): a run named
``… ![x](/any/path.png)`` embeds nothing. The Markdown, which holds run names, tags and params written by
people, is rendered with raw HTML off (:func:`verlflow.text_safety.markdown_to_html`), so markup in run text
shows as text. :func:`log_report` writes the page beside ``report.md`` (so ``output_dir`` has both) and logs
both beside the images. MLflow's artifact viewer shows ``report.md`` as text and renders ``report.html``, so the
Markdown keeps plain relative image names (``![curves](curves.png)``), readable there and resolved wherever the
folder is downloaded; a link into the UI's ``get-artifact?…`` only showed as noise.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable
from pathlib import Path

from verlflow.text_safety import html_text, markdown_to_html

# ![alt](file.png): an image the report references beside it.
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.(?:png|jpe?g|webp|gif))\)")
_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%}")


def _data_uri(path: Path) -> str:
    kind = {"jpg": "jpeg"}.get(path.suffix[1:].lower(), path.suffix[1:].lower())
    return f"data:image/{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"


def own_images(folder: Path, images: Iterable[str]) -> dict[str, Path]:
    """The report's own image files: each relative path of ``images`` that is a regular file inside ``folder``."""
    root = folder.resolve()
    found = {}
    for rel in images:
        path = folder / rel
        if path.is_file() and not path.is_symlink() and path.resolve().is_relative_to(root):
            found[rel] = path
    return found


def report_page(report_md: str, folder: Path, title: str, images: Iterable[str]) -> str:
    """``report_md`` as a full HTML page; of the images it references, only ``images`` (verlflow's own files in
    ``folder``) are embedded, any other reference is shown as its alt text."""
    uris = {rel: _data_uri(path) for rel, path in own_images(folder, images).items()}

    def embed(match: re.Match) -> str:
        uri = uris.get(match.group(2))
        return f"![{match.group(1)}]({uri})" if uri else match.group(0)

    embedded = _IMAGE.sub(embed, report_md)
    allowed = set(uris.values())
    try:
        import markdown_it  # noqa: F401
    except ImportError:
        body = _preformatted(embedded, allowed)
    else:
        body = markdown_to_html(embedded, allowed.__contains__)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html_text(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")


def _preformatted(markdown: str, allowed: set[str]) -> str:
    """The report as text, each of its own embedded images shown as an image where it stood."""
    out, last = [], 0
    for match in re.finditer(r"!\[([^\]]*)\]\((data:image/[^)]+)\)", markdown):
        if match.group(2) not in allowed:
            continue
        out.append(f"<pre>{html.escape(markdown[last:match.start()])}</pre>")
        out.append(f'<img alt="{html.escape(match.group(1))}" src="{match.group(2)}">')
        last = match.end()
    out.append(f"<pre>{html.escape(markdown[last:])}</pre>")
    return "\n".join(out)


def log_report(report_md: str, out_dir: Path, artifact_dir: str, images: Iterable[str]) -> None:
    """Write ``report.html`` beside ``report.md`` in ``out_dir`` and log both under ``artifact_dir`` of the active
    run: the page self-contained (the UI renders it), the Markdown as written (the UI shows it as text)."""
    from verlflow.tracking import writes

    images = list(images)
    (out_dir / "report.html").write_text(report_page(report_md, out_dir, "compare", images), encoding="utf-8")
    writes.log_file(str(out_dir / "report.html"), artifact_dir)
    writes.log_text(report_md, f"{artifact_dir}/report.md")


__all__ = ["report_page", "own_images", "log_report"]
