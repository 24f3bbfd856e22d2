"""The compare curves come from a worker process, and from the comparison's own process when the worker fails.

Either way the same files appear: one PNG per curve and the grid, with both runs' curves drawn.
"""

from __future__ import annotations

import logging

import pytest
from matplotlib.image import imread

from verlflow.compare.plot_worker import CurvePlotter
from verlflow.compare.report import CURVES, GRID_IMAGE, curve_filename
from verlflow.compare.snapshot import RunSnapshot


def _snapshot(role: str, offset: float) -> RunSnapshot:
    histories = {key: [(step, offset + 0.1 * step) for step in range(1, 30)] for key, _ in CURVES[:3]}
    return RunSnapshot(role=role, run_id=f"{role}-id", name=role, status="FINISHED", tags={"device.type": "cpu"},
                       params={"huge": "x" * 1000}, metrics={}, histories={**histories, "not/a/curve": [(1, 1.0)]})


def _assert_curve_files(out_dir, paths):
    grid, singles = paths
    assert grid == out_dir / GRID_IMAGE and set(singles) == {key for key, _ in CURVES}
    for key, path in singles.items():
        assert path == out_dir / "curves" / curve_filename(key) and path.is_file()
    height, width, _ = imread(grid).shape
    assert width > 1000 and height > 1000
    drawn = imread(singles[CURVES[0][0]])
    # both runs' colours are in the first curve's image (the baseline's blue, the candidate's orange)
    assert ((abs(drawn[..., 0] - 0x1F / 255) < 0.05) & (abs(drawn[..., 2] - 0xB4 / 255) < 0.05)).any()
    assert ((abs(drawn[..., 0] - 1.0) < 0.05) & (abs(drawn[..., 1] - 0x7F / 255) < 0.05)).any()


def test_the_worker_draws_every_curve_and_the_grid(tmp_path):
    plotter = CurvePlotter()
    assert plotter.process is not None
    plotter.submit(CURVES, _snapshot("baseline", 0.0), _snapshot("candidate", 0.5), tmp_path, {})
    _assert_curve_files(tmp_path, plotter.wait())
    assert plotter.process is None  # finished and collected


def test_a_dead_worker_means_curves_drawn_here_with_a_warning(tmp_path, caplog):
    plotter = CurvePlotter()
    plotter.process.kill()
    plotter.process.wait()
    plotter.submit(CURVES, _snapshot("baseline", 0.0), _snapshot("candidate", 0.5), tmp_path, {})
    with caplog.at_level(logging.WARNING):
        _assert_curve_files(tmp_path, plotter.wait())
    assert "curves drawn in this process" in caplog.text


def test_a_comparison_that_fails_first_leaves_no_worker_behind():
    plotter = CurvePlotter()
    process = plotter.process
    plotter.close()
    assert process.poll() is not None
    with pytest.raises(RuntimeError, match="before submit"):
        plotter.wait()
