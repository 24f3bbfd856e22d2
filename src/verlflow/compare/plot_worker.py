"""The compare curves drawn in a second process, so matplotlib's start-up and the drawing overlap MLflow's work.

    python -m verlflow.compare.plot_worker      # what CurvePlotter starts; reads one pickled job on stdin

``verlflow compare`` spends most of its time opening the tracking store and reading the runs, in
one Python process. :class:`CurvePlotter` starts a worker process before that, which imports
matplotlib and warms its font cache on the other core; once the histories are read they are handed
over, the worker draws :func:`plots.plot_curves` while the report is written and the comparison run
opened, and :meth:`CurvePlotter.wait` collects the file paths before the files are logged. Should the
worker fail in any way, the curves are drawn in-process instead: the report never depends on it.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from verlflow.compare.snapshot import RunSnapshot
from verlflow.util import first_line

log = logging.getLogger(__name__)

WAIT_S = 120  # a worker that has not answered by then is abandoned (the curves are drawn in-process)


class CurvePlotter:
    """One ``plot_curves`` call, run by a worker process started at construction."""

    def __init__(self) -> None:
        self.job: tuple | None = None
        try:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONPATH": _source_root() + os.pathsep + os.environ.get("PYTHONPATH", "")})
        except OSError as exc:
            log.warning("curves drawn in this process (no worker: %s)", first_line(exc))
            self.process = None

    def submit(
        self, curves: Sequence[tuple[str, str]], baseline: RunSnapshot, candidate: RunSnapshot, out_dir: Path,
        notes: Mapping[str, str],
    ) -> None:
        """Hand the worker what :func:`plots.plot_curves` needs (only the curves' histories travel)."""
        keys = {key for key, _ in curves}
        runs = tuple(_with_histories(run, keys) for run in (baseline, candidate))
        self.job = (list(curves), *runs, Path(out_dir), dict(notes))
        if self.process is None:
            return
        try:
            self.process.stdin.write(pickle.dumps(self.job))
            self.process.stdin.close()
            self.process.stdin = None  # sent in full: communicate() only collects the answer
        except OSError as exc:
            log.warning("curves drawn in this process (worker gone: %s)", first_line(exc))
            self._stop()

    def wait(self) -> tuple[Path, dict[str, Path]]:
        """The grid and per-metric PNG paths, from the worker or, failing it, drawn here."""
        if self.job is None:
            raise RuntimeError("CurvePlotter.wait before submit")
        if self.process is not None:
            try:
                out, err = self.process.communicate(timeout=WAIT_S)
                if self.process.returncode == 0:
                    self.process = None
                    return pickle.loads(out)
                last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
                log.warning("curves drawn in this process (the worker exited %s: %s)", self.process.returncode, last)
            except (subprocess.TimeoutExpired, pickle.UnpicklingError, EOFError) as exc:
                log.warning("curves drawn in this process (worker: %s)", first_line(exc))
            self._stop()
        from verlflow.compare.plots import plot_curves

        return plot_curves(*self.job)

    def close(self) -> None:
        """Stop the worker if it is still there (the comparison failed before collecting the curves)."""
        self._stop()

    def __enter__(self) -> CurvePlotter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def _with_histories(run: RunSnapshot, keys: set[str]) -> RunSnapshot:
    """A copy of ``run`` holding only the histories of ``keys`` (what a curve plot reads)."""
    return RunSnapshot(role=run.role, run_id=run.run_id, name=run.name, status=run.status, tags=dict(run.tags),
                       params={}, metrics={}, histories={k: v for k, v in run.histories.items() if k in keys},
                       experiment_id=run.experiment_id)


def _source_root() -> str:
    """The folder holding the ``verlflow`` package, so the worker imports this very copy of it."""
    return str(Path(__file__).resolve().parents[2])


def _serve() -> None:
    """Worker side: import and warm matplotlib, read one job from stdin, draw it, write the paths to stdout."""
    import io

    from verlflow.util import gc_paused

    with gc_paused():
        from verlflow.compare import plots

        plots.warm_up(io.BytesIO())
    data = sys.stdin.buffer.read()
    if not data:  # the comparison ended before it had curves to draw
        os._exit(0)
    result = plots.plot_curves(*pickle.loads(data))
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()
    # The files are written and closed: skip the interpreter's teardown, which the caller would wait for.
    os._exit(0)


if __name__ == "__main__":
    _serve()
