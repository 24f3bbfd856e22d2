"""Reports that cannot run script or read the host: `compare` on runs whose name, tag and override value carry
script payloads, a host file reference (``![x](/host/file.png)``) and terminal escapes.

The HTML verlflow writes (``compare/report.html``, logged and in ``output_dir``) must show the payloads as text
only, embed no file but the report's own images, and the console must receive no escape sequence from run text.
``report.md`` as logged points its images at the run's artifacts, where the MLflow UI serves them.
"""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient
from test_compare_report import A3_TAGS, A3_TIMINGS, H20_TAGS, H20_TIMINGS, a3_curves, h20_curves, log_train_run

from verlflow.compare.comparison import compare_runs

SCRIPT = "<script>alert('run')</script>"
IMG = "<img src=x onerror=alert('img')>"
IFRAME = "<iframe src=javascript:alert('frame')>"
TERMINAL = "\x1b]0;pwned-title\x07\x1b[2J"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Two runs with payloads in their names, a device tag and an override value; a host image to steal."""
    root = tmp_path_factory.mktemp("hostile")
    host_png = root / "host" / "file.png"
    host_png.parent.mkdir()
    host_png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"HOST-SECRET-IMAGE-BYTES" * 8)
    steal = f"![x]({host_png}) ![y](../host/file.png)"
    with isolated_store(root):
        recipe = "qwen3-4b-gsm8k-grpo"
        h20 = log_train_run(f"h20 {SCRIPT} {steal}", recipe=recipe, profile="h20",
                            device_tags={**H20_TAGS, "device.name": f"NVIDIA H20 {IMG} {steal}"},
                            timings=H20_TIMINGS, curves=h20_curves(), e2e=100.0)
        a3 = log_train_run(f"a3 {IFRAME}{TERMINAL} {steal}", recipe=recipe, profile="a3",
                           device_tags={**A3_TAGS, "device.name": f"Ascend {SCRIPT}"}, timings=A3_TIMINGS,
                           curves=a3_curves(), e2e=158.0,
                           overrides=f"'+trainer.note={IMG} {IFRAME} {SCRIPT} {steal}'")
        yield {"root": root, "h20": h20, "a3": a3, "host": host_png}


@pytest.fixture(scope="module")
def compared(hostile):
    import contextlib
    import io

    out = hostile["root"] / "out"
    console = io.StringIO()
    with contextlib.redirect_stdout(console):
        result = compare_runs(hostile["h20"], hostile["a3"], str(out))
    return result, out, console.getvalue()


class _Tags(HTMLParser):
    """Every element a browser would build from the page, with its attributes."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))


def _assert_inert(page: str, host: Path, own: Path) -> None:
    parser = _Tags()
    parser.feed(page)
    names = {tag for tag, _ in parser.tags}
    assert not names & {"script", "iframe", "object", "embed", "frame", "svg", "form"}, names
    for tag, attrs in parser.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert not any(v.strip().lower().startswith("javascript:") for v in attrs.values()), (tag, attrs)
    assert "&lt;script&gt;" in page and "&lt;iframe" in page  # the payloads are there, as text
    sources = [attrs.get("src", "") for tag, attrs in parser.tags if tag == "img"]
    assert sources, "the report's own images are embedded"
    own_files = {base64.b64encode(p.read_bytes()).decode() for p in own.rglob("*.png")}
    for src in sources:
        kind, _, data = src.partition(";base64,")
        assert kind == "data:image/png" and data in own_files, src[:80]
    assert base64.b64encode(host.read_bytes()).decode() not in page


def test_html_reports_show_payloads_as_text_and_embed_no_host_file(hostile, compared):
    result, out, _ = compared
    own = out  # every PNG compare drew for this report
    logged = MlflowClient().download_artifacts(result.run_id, "compare/report.html", str(hostile["root"] / "dl"))
    _assert_inert(Path(logged).read_text(encoding="utf-8"), hostile["host"], own)
    _assert_inert((out / "report.html").read_text(encoding="utf-8"), hostile["host"], own)  # output_dir has it too


def test_console_gets_no_escape_sequence_from_run_text(compared):
    _, _, console = compared
    assert "\x1b" not in console and "\x07" not in console
    assert f"a3 {IFRAME}" in console  # the run's name is still printed, its escape sequences (and the title they
    assert "pwned-title" not in console  # would have set) removed


def test_logged_report_md_names_its_images_beside_it_and_reads_as_text(compared):
    # MLflow's artifact viewer shows report.md as text (report.html is the rendered page): its images are named
    # as the files logged beside it, not as UI links that read as noise there and resolve nowhere else.
    result, out, _ = compared
    folder = out.parent / "md"
    dl = Path(MlflowClient().download_artifacts(result.run_id, "compare", str(folder)))
    text = (dl / "report.md").read_text(encoding="utf-8")
    assert "](curves.png)" in text and (dl / "curves.png").is_file()
    assert "get-artifact" not in text
