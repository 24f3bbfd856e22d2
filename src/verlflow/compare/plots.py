"""The §6.2 curves of two runs, overlaid per metric, as PNG files (one grid plus one file per metric).

    verlflow compare --baseline <h20 run> --candidate <a3 run> --output_dir compare_out   # writes curves*.png

Uses matplotlib's object API (``Figure`` + Agg canvas), never pyplot, so no GUI backend or global
figure state is involved and it runs on a headless cluster node. Kept cheap (a report of 220-step runs
is drawn in well under a second on a quiet CPU): one reused figure for the per-metric files, fixed
margins instead of the constrained-layout solver, screen resolution (DPI), simplified long lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from verlflow.compare.snapshot import RunSnapshot

DPI = 80
# Fixed margins (fractions of the figure) that fit a two-line title and the axis labels.
SINGLE_MARGINS = {"left": 0.11, "right": 0.97, "bottom": 0.12, "top": 0.85}
# Baseline blue, candidate orange, as two easily told-apart colours (also for colour-blind readers).
STYLES = ({"color": "#1f77b4", "linestyle": "-"}, {"color": "#ff7f0e", "linestyle": "--"})


def curve_filename(key: str) -> str:
    """File name of one metric's plot: ``critic/score/mean`` → ``critic_score_mean.png``."""
    return key.replace("/", "_").replace(" ", "_") + ".png"


def _draw(ax, key: str, title: str, runs: Sequence[RunSnapshot], note: str = "") -> None:
    drawn = False
    for run, style in zip(runs, STYLES, strict=False):
        points = run.histories.get(key) or []
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        marker = "o" if len(points) <= 40 else None
        ax.plot(steps, values, label=run.label, marker=marker, markersize=4, linewidth=1.6, **style)
        drawn = True
    ax.set_title(f"{title}\n{key}" + (f"  [{note}]" if note else ""), fontsize=10)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(title)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc="upper left", framealpha=0.6)  # "best" searches every point: slow
    else:
        ax.text(0.5, 0.5, "not logged by either run", ha="center", va="center", transform=ax.transAxes)


def _save(fig: Figure, path: Path) -> Path:
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
    return path


def plot_curves(
    curves: Sequence[tuple[str, str]],
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    out_dir: Path,
    notes: Mapping[str, str] | None = None,
) -> tuple[Path, dict[str, Path]]:
    """Write ``curves.png`` (all curves, two per row) and ``curves/<metric>.png``; return their paths.

    ``notes`` (metric → short text, e.g. the parity verdict) is shown in each plot's title.
    """
    notes = notes or {}
    out_dir = Path(out_dir)
    (out_dir / "curves").mkdir(parents=True, exist_ok=True)
    runs = (baseline, candidate)

    singles: dict[str, Path] = {}
    single = Figure(figsize=(7, 4.2))
    single.subplots_adjust(**SINGLE_MARGINS)
    ax = single.add_subplot()
    for key, title in curves:
        ax.clear()
        _draw(ax, key, title, runs, notes.get(key, ""))
        singles[key] = _save(single, out_dir / "curves" / curve_filename(key))

    cols = 2
    rows = (len(curves) + cols - 1) // cols
    fig = Figure(figsize=(6.5 * cols, 3.8 * rows))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.05 / rows * 4, top=1 - 0.12 / rows * 2, hspace=0.55,
                        wspace=0.18)
    fig.suptitle(f"{candidate.name} vs {baseline.name}: training curves per step", fontsize=13)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (key, title) in zip(axes, curves, strict=False):
        _draw(ax, key, title, runs, notes.get(key, ""))
    for ax in axes[len(curves) :]:
        ax.set_visible(False)
    grid = _save(fig, out_dir / "curves.png")
    return grid, singles
