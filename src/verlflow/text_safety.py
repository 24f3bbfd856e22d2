"""Run text (names, tags, params, metric keys, descriptions) made safe for a terminal and for HTML.

    python -c "from verlflow.text_safety import terminal_text; print(terminal_text('a\\x1b]0;pwned\\x07b'))"

Run names and tags come from people (and from anyone who can write to the tracking server): printed raw, an
escape sequence retitles or clears the reader's terminal (``\\e]0;…\\a``, ``\\e[2J``); rendered raw, markup runs
script in whoever opens the report. :func:`terminal_text` is called where verlflow prints run text,
:func:`markdown_to_html` where it renders Markdown that holds run text (raw HTML off, only ``data:`` images),
:func:`html_text` where it writes run text into HTML itself, :func:`markdown_verbatim` where text a model wrote goes
where MLflow renders Markdown (a trace's response).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

# ANSI/VT escape sequences (CSI ``\e[…m``, OSC ``\e]…\a`` or ``\e]…\e\\``, two-byte ``\eX``), then any other C0/C1
# control character except newline and tab.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_text(text: str) -> str:
    """``text`` with terminal escape sequences and control characters removed (newlines and tabs kept)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def markdown_verbatim(text: str) -> str:
    """``text`` as a fenced code block, so a Markdown renderer (MLflow's trace viewer renders a span's string fields as
    Markdown) shows it as written: a model's ``#### 40`` stays ``#### 40``, not a bold heading "40". The fence is
    longer than any run of backticks in ``text`` (CommonMark's rule), so no line of it closes the block early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def html_text(text: object) -> str:
    """Run text escaped for HTML content or a quoted attribute."""
    return html.escape(str(text), quote=True)


def markdown_to_html(markdown: str, allow_image: Callable[[str], bool]) -> str:
    """CommonMark (+ tables) as HTML with raw HTML off: markup in the text shows as text. An image is kept only
    where ``allow_image(src)`` says so (the files verlflow embedded); any other becomes its alt text, so a run
    named ``![x](/any/path.png)`` never makes a page load or embed a file. Links keep markdown-it's own check
    (no ``javascript:``). Without markdown-it-py the text is shown preformatted."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return f"<pre>{html_text(markdown)}</pre>"
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    default_image = md.renderer.rules.get("image")

    def image(_renderer, tokens, idx, options, env):
        token = tokens[idx]
        if allow_image(str(token.attrGet("src") or "")) and default_image is not None:
            return default_image(tokens, idx, options, env)
        return html_text(token.content)

    md.add_render_rule("image", image)
    return md.render(markdown)


__all__ = ["terminal_text", "html_text", "markdown_to_html"]
