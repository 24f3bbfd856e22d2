"""`compare` refuses bad run references and runs without timings with one clear line, and starts no run."""

from __future__ import annotations

import mlflow
import pytest
from conftest import fresh_store
from mlflow.tracking import MlflowClient

from verlflow import cli
from verlflow.compare.comparison import compare_runs
from verlflow.errors import EXIT_BAD_INPUT, VerlflowError
from verlflow.tracking import tracking


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two train-shaped runs with timings (train-a, train-b) and a preprocess-shaped run without (prep)."""
    uri = fresh_store(tmp_path_factory.mktemp("compare-errors"))
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    ids = {}
    for name, step in [("train-a", "train"), ("train-b", "train"), ("prep", "preprocess")]:
        with tracking.tracked_run(run_name=name, tags={"verlflow.step": step, "device.type": "cpu"}) as run:
            if step == "train":
                tracking.log_metrics({"timing_s/gen": 2.0, "critic/score/mean": 0.5}, step=1)
                tracking.log_run_summaries(run.info.run_id, started_at=0.0, ended_at=10.0)
            else:
                tracking.log_metrics({"rows": 10.0}, step=0)
        ids[name] = run.info.run_id
    yield ids
    mp.undo()


def _compare_runs() -> list:
    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, "tags.verlflow.step = 'compare'")


@pytest.mark.parametrize(
    ("baseline", "candidate", "expected"),
    [
        ("0123456789abcdef0123456789abcdef", "train-b", "no run with id or name '0123456789abcdef"),
        ("train-a", "prep", "candidate run 'prep'"),
        ("tags.verlflow.step = 'train'", "train-b", "baseline and candidate share run(s) "),
        ("tags.device.type = 'npu'", "train-b", "matches no run"),
        ("tags.device.type == ", "train-b", "is not a valid MLflow filter"),
        ("train-a", "train-a", "baseline and candidate share run(s) "),
        ("", "train-b", "baseline is empty"),
    ],
)
def test_bad_reference_is_one_clear_line(two_runs, baseline, candidate, expected):
    with pytest.raises(VerlflowError) as info:
        compare_runs(baseline, candidate, "")
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert _compare_runs() == []  # nothing was opened, so nothing is left RUNNING


def test_run_without_timing_metrics_names_what_is_missing(two_runs):
    with pytest.raises(VerlflowError, match=r"has no timing metrics \(timing_s/e2e, timing_s_mean/\*\)"):
        compare_runs("train-a", two_runs["prep"])


def test_cli_prints_one_line_and_exits_2(two_runs, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", "--baseline", "no-such-run", "--candidate", "train-b"])
    assert info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("verlflow compare: error: no run with id or name 'no-such-run'")
    assert mlflow.active_run() is None


def test_a_filter_side_keeps_its_train_runs_and_leaves_out_runs_that_trained_nothing(two_runs):
    result = compare_runs("tags.device.type = 'cpu' and attributes.run_name != 'train-b'", "train-b", "")
    assert [s.run_id for s in result.baseline_runs] == [two_runs["train-a"]]  # prep matched too, trained nothing
    MlflowClient().delete_run(result.run_id)


def test_a_deleted_run_is_refused_and_an_unfinished_one_warned_of(two_runs, capsys):
    from verlflow.compare.reading import read_runs, resolve_run

    client = MlflowClient()
    gone = client.create_run("0", run_name="gone")
    client.delete_run(gone.info.run_id)
    # Before: a deleted baseline was compared without a word.
    with pytest.raises(VerlflowError, match=r"baseline run 'gone' .* is deleted"):
        resolve_run(gone.info.run_id, "baseline")
    live = client.create_run("0", run_name="live")  # still RUNNING, as a run being trained is
    client.log_batch(live.info.run_id, metrics=[mlflow.entities.Metric("timing_s/e2e", 5.0, 0, 0)])
    read_runs([resolve_run(live.info.run_id, "baseline")], [resolve_run("train-b", "candidate")])
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "'live'" in warned[0] and "RUNNING" in warned[0], warned
