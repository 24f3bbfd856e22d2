"""Bad files, numbers, settings, URLs and secrets: one line, exit 2, no traceback, no run left behind.

The sibling of tests/test_bad_inputs_fail_fast.py for the inputs a second probe found ending in a traceback,
a late failure or a leaked secret: a binary / empty / self-referencing / broken recipe, non-finite numbers,
unusable numeric settings, a non-UTF-8 source, unwritable or unreachable search storage, a ``file:``
tracking URI, a tracking server under a wrong path, and credentials in URLs and overrides.
"""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import pytest
from conftest import REPO_ROOT, MlflowServer, isolated_store
from mlflow.tracking import MlflowClient

from verlflow import cli
from verlflow.data import gsm8k

TRAIN = ["train", "--recipe", "tiny", "--device", "cpu"]
SEARCH = ["search", "--device", "cpu", "--recipe", "tiny", "--n_trials", "1"]
HF_LIKE = "hf_" + "Zq3xK9pL2mN8vB4cR7tY1wE6uI0oPaSd"  # the shape of a Hugging Face token, not a real one


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A store, a good data folder, and one of every bad file: paths keyed by name."""
    root = tmp_path_factory.mktemp("bad_parsing")
    with isolated_store(root) as uri:
        good = gsm8k.preprocess("synthetic", root / "data", 8, log_to_mlflow=False)
        files = {
            "binary": b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01",
            "empty": b"",
            "recursive": b"actor_rollout_ref: &loop\n  actor: [*loop]\n",
            "broken": b"data:\n  train_batch_size: 4\n  max_prompt_length: [128\n  seed: 1\n",
            "infinite": b"actor_rollout_ref:\n  actor:\n    optim:\n      lr: .inf\n",
        }
        paths = {}
        for name, content in files.items():
            paths[name] = root / f"{name}.yaml"
            paths[name].write_bytes(content)
        latin1 = root / "latin1_source"
        latin1.mkdir()
        for split in ("train", "test"):
            (latin1 / f"{split}.jsonl").write_bytes('{"question": "Café?", "answer": "#### 2"}\n'.encode("latin-1"))
        yield {"root": root, "uri": uri, "data": good.output_dir, "latin1": latin1, **paths}


CASES = {
    "binary recipe": (["train", "--recipe", "{binary}", "--device", "cpu", "--data_dir", "{data}"],
                      "is not UTF-8 text"),
    "empty recipe": (["train", "--recipe", "{empty}", "--device", "cpu", "--data_dir", "{data}"], "is empty"),
    "main on an empty recipe": (["main", "--recipe", "{empty}", "--device", "cpu"], "is empty"),
    "recursive YAML alias": (["train", "--recipe", "{recursive}", "--device", "cpu", "--data_dir", "{data}"],
                             "contains it"),
    "YAML syntax error names line and column": (["train", "--recipe", "{broken}", "--device", "cpu",
                                                 "--data_dir", "{data}"], "broken.yaml:4:7"),
    "profile YAML syntax error": ([*TRAIN, "--profile", "{broken}", "--data_dir", "{data}"], "broken.yaml:4:7"),
    "search config YAML syntax error": ([*SEARCH, "--search_config", "{broken}", "--data_dir", "{data}"],
                                        "broken.yaml:4:7"),
    "infinite number in a recipe": (["train", "--recipe", "{infinite}", "--device", "cpu", "--data_dir", "{data}"],
                                    "actor_rollout_ref.actor.optim.lr=inf is not a finite number"),
    "lr=nan override": ([*TRAIN, "--data_dir", "{data}", "--overrides", "actor_rollout_ref.actor.optim.lr=nan"],
                        "optim.lr must be a finite number"),
    "kl_coef=-inf override": ([*TRAIN, "--data_dir", "{data}", "--overrides",
                               "actor_rollout_ref.actor.kl_loss_coef=-inf"], "must be a finite number"),
    "compare threshold=nan": (["compare", "--baseline", "x", "--candidate", "y", "--threshold", "nan"],
                              "--threshold must be a finite number"),
    "non-UTF-8 preprocess source": (["preprocess", "--source", "{latin1}", "--output_dir", "{root}/out"],
                                    "is not UTF-8 text"),
    "search storage on an unwritable file system": ([*SEARCH, "--data_dir", "{data}", "--storage",
                                                     "/sys/verlflow/study.journal"], "cannot be written"),
    "search SQLite storage in a missing folder": ([*SEARCH, "--data_dir", "{data}", "--storage",
                                                   "sqlite:///{root}/no/such/folder/optuna.db"],
                                                  "cannot open storage"),
    "search password in a storage query": ([*SEARCH, "--storage", "postgresql://bob@127.0.0.1/optuna?password=s3cret"],
                                           "query parameter 'password'"),
    "search sslpassword in a storage query": ([*SEARCH, "--storage",
                                               "postgresql://bob@127.0.0.1/optuna?sslmode=require&sslpassword=s3"],
                                              "VERLFLOW_STORAGE_PASSWORD"),
}
# Cases whose bad value is the tracking URI itself (the store stays the module's for the run check).
URI_CASES = {
    "file: tracking URI": ("file:///tmp/mlruns", "use sqlite:///mlflow.db"),
    "password in the tracking URI": ("http://bob:s3cret@127.0.0.1:9", "MLFLOW_TRACKING_PASSWORD"),
    "token in the tracking URI's query": ("http://127.0.0.1:9/?token=abc123", "query parameter 'token'"),
}


def _runs(uri: str) -> list[tuple[str, str]]:
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted((r.info.run_id, r.info.status) for r in runs)


def _one_line_exit_2(argv: list[str], expected: str, store: str, capsys) -> str:
    before = _runs(store)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith(f"verlflow {argv[0]}:")]
    assert exit_info.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    assert len(errors) == 1 and expected in errors[0], err[-2000:]
    assert _runs(store) == before  # nothing opened, so nothing left RUNNING
    return errors[0]


@pytest.mark.parametrize("case", CASES)
def test_bad_file_number_or_secret_is_one_line_exit_2_and_no_run(case, bad, capsys):
    argv, expected = CASES[case]
    line = _one_line_exit_2([arg.format(**bad) for arg in argv], expected, bad["uri"], capsys)
    assert "s3cret" not in line and HF_LIKE not in line and "a8F3kQ9zL1xW7mR2pT5vB0" not in line


@pytest.mark.parametrize("case", URI_CASES)
def test_unusable_tracking_uri_is_one_line_exit_2(case, bad, capsys, monkeypatch):
    uri, expected = URI_CASES[case]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    try:
        line = _one_line_exit_2(["preprocess", "--source", "synthetic", "--output_dir", f"{bad['root']}/u"],
                                expected, bad["uri"], capsys)
    finally:
        mlflow.set_tracking_uri(bad["uri"])
    assert "s3cret" not in line and "abc123" not in line


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["VERLFLOW_METRICS_WRITE_S", "VERLFLOW_METRICS_NICE", "VERLFLOW_HEARTBEAT_S"])
def test_unusable_numeric_setting_is_one_line_at_start(setting, bad):
    """Read when a module is imported, so a fresh process is needed: it must not die in the import."""
    env = {**os.environ, setting: "abc", "MLFLOW_TRACKING_URI": bad["uri"],
           "PYTHONPATH": str(REPO_ROOT / "src")}
    env.pop("MLFLOW_RUN_ID", None)
    before = _runs(bad["uri"])
    proc = subprocess.run([sys.executable, "-m", "verlflow.cli", *TRAIN, "--data_dir", str(bad["data"])],
                          env=env, cwd=bad["root"], capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("verlflow train:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len(errors) == 1 and f"{setting}='abc'" in errors[0], proc.stderr[-2000:]
    assert _runs(bad["uri"]) == before


@pytest.mark.slow
def test_live_server_under_a_wrong_path_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """`/health` answers from the server's root whatever the path; the probe must ask the API under the path."""
    server = MlflowServer(tmp_path)
    server.start()
    root = server.url
    try:
        wrong = f"{root}/nope"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", wrong)
        monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
        mlflow.set_tracking_uri(wrong)
        line = _one_line_exit_2(["preprocess", "--source", "synthetic", "--output_dir", str(tmp_path / "d")],
                                "is not an MLflow server", root, capsys)
        assert "/nope" in line
        # The server's root still passes the probe (the check tells the two apart, it does not refuse both).
        from verlflow.outage.probe import check_tracking_server

        check_tracking_server(root)
    finally:
        server.stop()


def test_what_only_names_a_secret_is_not_refused():
    """No false alarm on the values verl and libpq use: key files by path, column names under *_key keys."""
    from verlflow.search.storage_url import check_storage_url
    from verlflow.secrets import is_secret

    check_storage_url("postgresql://bob@db.example/optuna?sslmode=verify-full&sslkey=/etc/pg/bob.key"
                      "&sslcert=/etc/pg/bob.crt")
    check_storage_url("postgresql://bob@db.example/optuna")
    assert not any(is_secret(key, value) for key, value in {
        "data.prompt_key": "prompt", "data.reward_fn_key": "data_source",
        "actor_rollout_ref.model.path": "Qwen/Qwen3-4B-Instruct-2507", "trainer.experiment_name": "grpo_a3_vs_h20",
        "+trainer.api_key_file": "/home/bob/.config/key.txt", "actor_rollout_ref.actor.optim.lr": 1e-6,
        "data.max_prompt_length": "1024", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "16384",
    }.items())
