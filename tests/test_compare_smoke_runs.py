"""Acceptance (issue 7): `compare` on two real smoke train runs that differ only in the cpu profile's threads.

Both ran on the one cpu profile, so it is a run-vs-run comparison without a parity verdict (issue 36).

Uses the shared ``smoke_store`` fixture of tests/conftest.py: two FINISHED local train runs of the smoke
recipe on the cpu profile, with profile.env.OMP_NUM_THREADS 1 and 2. The comparison runs once, in a copy of it.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import sqlite3
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow.compare.comparison import compare_runs

GUIDE_KEYS = ["timing_s/e2e", "timing_s_mean/gen", "timing_s_mean/update_actor", "timing_s_mean/step"]


def _store_copy(workdir: Path, target: Path) -> str:
    """A copy of the store in ``workdir`` (SQLite file and artifacts) in ``target``, its artifact paths moved there;
    returns its tracking URI. The shared store stays as it is for the tests that read it."""
    shutil.copytree(workdir / "mlruns", target / "mlruns")
    shutil.copyfile(workdir / "mlflow.db", target / "mlflow.db")
    with contextlib.closing(sqlite3.connect(target / "mlflow.db")) as db, db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                              ("logged_models", "artifact_location")):
            db.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)", (str(workdir), str(target)))
    return f"sqlite:///{target / 'mlflow.db'}"


@pytest.fixture(scope="module")
def compared(smoke_store, tmp_path_factory):
    """The comparison of the two smoke runs (in a copy of the shared store), what it printed and its folder."""
    root = tmp_path_factory.mktemp("compare-smoke")
    uri = _store_copy(smoke_store.workdir, root / "store")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mlflow.set_tracking_uri(uri)
        baseline, candidate = smoke_store.run_ids
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = compare_runs(baseline, candidate, str(root / "out"))
        yield result, printed.getvalue(), root / "out"
        mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_smoke_runs_compare_with_every_part_and_the_runs_own_ratios(smoke_store, compared):
    result, printed, out = compared
    for part in ("## Versions", "## Performance", "## Curves", "## Config diff"):
        assert part in result.report and part in printed
    for name in ("report.md", "comparison.json", "curves.png", "curves/critic_score_mean.png"):
        assert (out / name).is_file()

    client = MlflowClient()
    base = client.get_run(smoke_store.run_ids[0]).data.metrics
    cand = client.get_run(smoke_store.run_ids[1]).data.metrics
    rows = {r.key: r for r in result.timings}
    assert list(rows)[:4] == GUIDE_KEYS
    means = sorted(k for k in base if k.startswith("timing_s_mean/"))
    assert means and set(means) <= set(rows)  # every timing_s_mean/* of the run is in the table
    for key in [*GUIDE_KEYS, *means]:
        assert rows[key].ratio == pytest.approx(cand[key] / base[key]), key
    logged = client.get_run(result.run_id).data.metrics
    gen = "timing_s_mean/gen"
    assert logged[f"compare/ratio/{gen}"] == pytest.approx(cand[gen] / base[gen])


@pytest.mark.slow
def test_smoke_runs_differ_only_in_the_profile(compared):
    result, printed, _ = compared
    assert not result.recipes_differ and "RECIPES DIFFER" not in printed
    profile = {r.key: (r.baseline, r.candidate) for r in result.diff.profile}
    assert profile.get("tag env.OMP_NUM_THREADS") == ("1", "2")


@pytest.mark.slow
def test_smoke_runs_on_one_profile_get_differences_per_curve_but_no_verdict(smoke_store, compared):
    result, printed, _ = compared
    assert printed.startswith("SAME DEVICE PROFILE: both sides ran on cpu") and not result.judged
    rows = {r.key: r for r in result.parity}
    history = MlflowClient().get_metric_history(smoke_store.run_ids[0], "critic/score/mean")
    assert rows["critic/score/mean"].steps == sorted({m.step for m in history})
    for key in ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean"):
        assert rows[key].mean_relative_difference is not None and rows[key].passed is None, key
