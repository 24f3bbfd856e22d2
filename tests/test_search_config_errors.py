"""A bad search config is one clear line, before any trial starts and before any run or study exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verlflow import cli
from verlflow.errors import EXIT_BAD_INPUT
from verlflow.search.search_config import load_search_config

DEFAULT = yaml.safe_load((Path(cli.__file__).parent / "config" / "search" / "default.yaml").read_text())


def _config(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(yaml.safe_dump(DEFAULT))
    edit(data)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def data_dir(tmp_path) -> Path:
    # The search only checks that the files are there before composing; no trial reads them here.
    folder = tmp_path / "data"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.parquet").write_bytes(b"")
    return folder


def _refused(tmp_path, monkeypatch, config_path: Path, data_dir: Path) -> str:
    """Run the search step on a bad config; return its one-line error after checking nothing started."""
    from mlflow.tracking import MlflowClient

    from verlflow.errors import VerlflowError
    from verlflow.step_requests import SearchRequest
    from verlflow.steps.search import run_search

    monkeypatch.chdir(tmp_path)
    with pytest.raises(VerlflowError) as exc_info:
        run_search(SearchRequest("tiny", "cpu", 1, pruner="median", search_config=str(config_path),
                                 data_dir=str(data_dir)))
    assert not (tmp_path / "optuna").exists(), "no study may be created for a refused search config"
    client = MlflowClient()
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
    message = str(exc_info.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys, monkeypatch, tracking_uri):
    path = _config(tmp_path, lambda d: d["sampler"].update(sed=1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["search", "--recipe", "tiny", "--device", "cpu", "--n_trials", "1",
                  "--search_config", str(path)])
    assert exit_info.value.code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown key 'sampler.sed'" in err, err


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(objectve=d.pop("objective")), "unknown key 'objectve'"),
        (lambda d: d["space"]["actor_rollout_ref.actor.optim.lr"].update(lo=1e-4), "unknown key 'space."),
        (lambda d: d["space"].update({"actor_rollout_ref.actor.kl_loss_coef": {
            "type": "float", "low": 0.01, "high": 0.001}}), "empty range"),
        (lambda d: d["space"]["actor_rollout_ref.actor.optim.lr"].update(relative=[2.0, 2.0]), "empty range"),
        (lambda d: d["space"]["actor_rollout_ref.rollout.n"].update(choices=[]), "choices' is empty"),
        (lambda d: d["objective"].update(direction="up"), "use maximize or minimize"),
    ],
    ids=["unknown-section", "unknown-param-field", "low-above-high", "empty-relative", "no-choices",
         "bad-direction"],
)
def test_bad_search_config_is_one_line(tmp_path, edit, expected):
    with pytest.raises(Exception) as exc_info:
        load_search_config(str(_config(tmp_path, edit)))
    message = str(exc_info.value)
    assert type(exc_info.value).__name__ == "VerlflowError"
    assert expected in message and len(message.splitlines()) == 1, message


def test_unknown_verl_key_in_space_stops_the_search_before_any_trial(tmp_path, monkeypatch, tracking_uri,
                                                                     data_dir):
    path = _config(tmp_path, lambda d: d["space"].update(
        {"actor_rollout_ref.actor.optim.learning_rate": {"type": "float", "low": 1e-4, "high": 1e-3}}))
    message = _refused(tmp_path, monkeypatch, path, data_dir)
    assert "actor_rollout_ref.actor.optim.learning_rate" in message and "nearest valid keys" in message


def test_group_size_that_breaks_batch_arithmetic_is_refused(tmp_path, monkeypatch, tracking_uri, data_dir):
    # Micro-batches of 8 responses: 4 prompts x n=3 = 12 responses do not split into them.
    def edit(d):
        d["trial"]["overrides"] = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8}
        d["space"]["actor_rollout_ref.rollout.n"]["choices"] = [2, 3]

    message = _refused(tmp_path, monkeypatch, _config(tmp_path, edit), data_dir)
    assert "actor_rollout_ref.rollout.n=3 is refused" in message, message


def test_missing_data_is_refused_with_the_preprocess_command(tmp_path, monkeypatch, tracking_uri):
    message = _refused(tmp_path, monkeypatch, _config(tmp_path, lambda d: None), tmp_path / "nowhere")
    assert "has no train.parquet" in message and "-e preprocess" in message
