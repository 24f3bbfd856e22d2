"""The §6.2 curves of two runs, overlaid per metric, as PNG files (one file per metric plus a grid of all).

    verlflow compare --baseline <h20 run> --candidate <a3 run> --output_dir compare_out   # writes curves*.png

Uses matplotlib's object API (``Figure`` + Agg canvas), never pyplot, so no GUI backend or global
figure state is involved and it runs on a headless cluster node. Kept cheap, because a report is
drawn on every ``compare``: one figure whose two lines, title and labels are updated per metric (no
axes rebuilt), a fixed title position (no layout search), fast PNG compression, and the grid put
together from the per-metric images with Pillow instead of drawing every curve a second time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from verlflow.compare.report import CURVE_DIR, GRID_IMAGE, curve_filename
from verlflow.compare.snapshot import RunSnapshot

DPI = 80
SINGLE_SIZE = (7, 4.2)  # inches: 560 x 336 pixels at DPI
# Fixed margins (fractions of the figure) that fit a two-line title and the axis labels.
SINGLE_MARGINS = {"left": 0.11, "right": 0.97, "bottom": 0.12, "top": 0.85}
# Baseline blue, candidate orange, as two easily told-apart colours (also for colour-blind readers).
STYLES = ({"color": "#1f77b4", "linestyle": "-"}, {"color": "#ff7f0e", "linestyle": "--"})
GRID_COLUMNS = 2
GRID_TITLE_PX = 44
# zlib level 1: a few times faster than the default 6, files ~30% larger (flat-colour plots compress well).
PNG_OPTIONS = {"compress_level": 1}


class _CurveFigure:
    """One figure with a line per run; :meth:`draw` swaps in a metric's data and saves it."""

    def __init__(self, runs: Sequence[RunSnapshot]):
        self.runs = runs
        self.figure = Figure(figsize=SINGLE_SIZE)
        FigureCanvasAgg(self.figure)
        self.figure.subplots_adjust(**SINGLE_MARGINS)
        self.ax = self.figure.add_subplot()
        self.lines = [self.ax.plot([], [], label=run.label, markersize=4, linewidth=1.6, **style)[0]
                      for run, style in zip(runs, STYLES, strict=False)]
        self.ax.set_xlabel("step")
        self.ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        self.ax.grid(True, alpha=0.3)
        self.empty = self.ax.text(0.5, 0.5, "not logged by either run", ha="center", va="center",
                                  transform=self.ax.transAxes)

    def draw(self, key: str, title: str, note: str, path: Any) -> Any:
        """Plot ``key`` of every run (markers when a curve has few points) and save it at ``path`` (or file object)."""
        drawn = []
        for run, line in zip(self.runs, self.lines, strict=False):
            points = run.histories.get(key) or []
            steps, values = zip(*points, strict=True) if points else ((), ())
            line.set_data(steps, values)
            line.set_marker("o" if 0 < len(points) <= 40 else "None")
            line.set_visible(bool(points))
            if points:
                drawn.append(line)
        self.ax.relim(visible_only=True)
        self.ax.autoscale_view()
        # An explicit y keeps matplotlib from searching the title a place above the tick labels (slow).
        self.ax.set_title(f"{title}\n{key}" + (f"  [{note}]" if note else ""), fontsize=10, y=1.0)
        self.ax.set_ylabel(title)
        self.empty.set_visible(not drawn)
        legend = self.ax.get_legend()
        if legend is not None:
            legend.remove()
        if drawn:  # "best" searches every point for a free corner: slow
            self.ax.legend(handles=drawn, fontsize=8, loc="upper left", framealpha=0.6)
        self.figure.savefig(path, dpi=DPI, pil_kwargs=PNG_OPTIONS)
        return path


def warm_up(target: Any) -> None:
    """Draw one throw-away curve into ``target`` (a file object): fonts and renderers load before real work."""
    dummy = RunSnapshot(role="baseline", run_id="", name="", status="", tags={}, params={}, metrics={},
                        histories={"x": [(1, 0.0), (2, 1.0)]})
    _CurveFigure((dummy,)).draw("x", "x", "", target)


def plot_curves(
    curves: Sequence[tuple[str, str]],
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    out_dir: Path,
    notes: Mapping[str, str] | None = None,
) -> tuple[Path, dict[str, Path]]:
    """Write ``curves/<metric>.png`` and ``curves.png`` (all of them, two per row); return their paths.

    ``notes`` (metric → short text, e.g. the parity verdict) is shown in each plot's title.
    """
    notes = notes or {}
    out_dir = Path(out_dir)
    (out_dir / CURVE_DIR).mkdir(parents=True, exist_ok=True)
    figure = _CurveFigure((baseline, candidate))
    singles = {key: figure.draw(key, title, notes.get(key, ""), out_dir / CURVE_DIR / curve_filename(key))
               for key, title in curves}
    title = f"{candidate.name} vs {baseline.name}: training curves per step"
    return compose_grid(list(singles.values()), title, out_dir / GRID_IMAGE), singles


def compose_grid(images: Sequence[Path], title: str, path: Path) -> Path:
    """Lay same-size PNGs out ``GRID_COLUMNS`` per row under a title line, as one PNG at ``path``."""
    from PIL import Image, ImageDraw, ImageFont

    tiles = [Image.open(image).convert("RGB") for image in images]
    width, height = tiles[0].size
    rows = (len(tiles) + GRID_COLUMNS - 1) // GRID_COLUMNS
    grid = Image.new("RGB", (width * GRID_COLUMNS, GRID_TITLE_PX + height * rows), "white")
    font = ImageFont.truetype(font_manager.findfont("DejaVu Sans"), 18)
    ImageDraw.Draw(grid).text((grid.width // 2, GRID_TITLE_PX // 2), title, fill="black", font=font, anchor="mm")
    for index, tile in enumerate(tiles):
        grid.paste(tile, ((index % GRID_COLUMNS) * width, GRID_TITLE_PX + (index // GRID_COLUMNS) * height))
    grid.save(path, **PNG_OPTIONS)
    return path
