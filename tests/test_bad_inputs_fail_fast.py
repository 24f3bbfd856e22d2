"""Every bad input a user can give a step ends in one line and exit 2, within seconds, with no run left behind.

The inputs are the ones a probe of the smoke recipe found ending in a traceback, a silent no-op or a
late failure: a folder under a file, empty / zero-row / wrong-column parquet, corrupt weights, counts of
the wrong type or sign, a model name the registry refuses, an unknown pruner, a password in a storage
URL, a step-0 checkpoint, an unknown run to resume, and a tracking server that is not there.
"""

from __future__ import annotations

import time

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import isolated_store
from mlflow.tracking import MlflowClient

from verlflow import cli
from verlflow.data import gsm8k

DEAD_SERVER = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A store plus one of every bad thing: paths keyed by name."""
    root = tmp_path_factory.mktemp("bad_inputs")
    with isolated_store(root) as uri:
        good = gsm8k.preprocess("synthetic", root / "data", 8, log_to_mlflow=False)
        a_file = root / "a_file"
        a_file.write_text("not a folder")
        loop = root / "loop"
        loop.symlink_to(root / "loop_back")
        (root / "loop_back").symlink_to(loop)
        empty = root / "empty"
        empty.mkdir()
        for split in ("train", "test"):
            (empty / f"{split}.parquet").write_bytes(b"")
        zero_rows = root / "zero_rows"
        zero_rows.mkdir()
        wrong_columns = root / "wrong_columns"
        wrong_columns.mkdir()
        for split, path in (("train", good.train_path), ("test", good.test_path)):
            table = pq.read_table(path)
            pq.write_table(table.slice(0, 0), zero_rows / f"{split}.parquet")
            pq.write_table(pa.table({"question": ["1+1?"], "answer": ["#### 2"]}), wrong_columns / f"{split}.parquet")
        corrupt = root / "corrupt_model"
        corrupt.mkdir()
        (corrupt / "config.json").write_text('{"model_type": "qwen3"}')
        (corrupt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":")
        step0 = root / "outputs" / "global_step_0" / "actor" / "huggingface"
        step0.mkdir(parents=True)
        (step0 / "config.json").write_text("{}")
        client = MlflowClient()
        run = client.create_run("0", tags={"verlflow.step": "train", "verlflow.checkpoint_dir": str(step0),
                                           "verlflow.model_name": "tiny"})
        client.set_terminated(run.info.run_id, "FINISHED")
        yield {"root": root, "uri": uri, "data": good.output_dir, "a_file": a_file, "loop": loop, "empty": empty,
               "zero_rows": zero_rows, "wrong_columns": wrong_columns, "corrupt": corrupt,
               "step0_run": run.info.run_id}


# The train step on the tiny recipe (its untrained model: nothing here needs one that learns).
TRAIN = ["train", "--recipe", "tiny", "--device", "cpu"]
CASES = {
    "preprocess output_dir under a file": (["preprocess", "--source", "synthetic", "--output_dir", "{a_file}/out"],
                                           "is a file"),
    "preprocess limit not a number": (["preprocess", "--source", "synthetic", "--limit", "abc"], "integer"),
    "train on 0-byte parquet": ([*TRAIN, "--data_dir", "{empty}"], "0 bytes"),
    "evaluate on 0-byte parquet": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{empty}"], "0 bytes"),
    "train on zero-row parquet": ([*TRAIN, "--data_dir", "{zero_rows}"], "0 rows"),
    "evaluate on zero-row parquet": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{zero_rows}"], "0 rows"),
    "evaluate on wrong columns": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{wrong_columns}"],
                                  "lacks column"),
    "evaluate data_dir missing": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{root}/no-such"],
                                  "data folder {root}/no-such does not exist: give the folder preprocess wrote"),
    "evaluate negative limit": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{data}", "--limit", "-1"],
                                "limit"),
    "train corrupt safetensors": ([*TRAIN, "--data_dir", "{data}", "--model", "{corrupt}"],
                                  "corrupt"),
    "evaluate corrupt safetensors": (["evaluate", "--model_uri", "{corrupt}", "--data_dir", "{data}"], "corrupt"),
    "train total_training_steps=abc": ([*TRAIN, "--data_dir", "{data}", "--overrides",
                                        "trainer.total_training_steps=abc"], "trainer.total_training_steps='abc'"),
    "train total_training_steps=-1": ([*TRAIN, "--data_dir", "{data}", "--overrides",
                                       "trainer.total_training_steps=-1"], "trainer.total_training_steps=-1"),
    "train rollout.n=0": ([*TRAIN, "--data_dir", "{data}", "--overrides",
                           "actor_rollout_ref.rollout.n=0"], "rollout.n=0"),
    "train resume of no run": ([*TRAIN, "--resume", "0123456789abcdef"], "no run"),
    "train resume of a finished run": ([*TRAIN, "--resume", "{step0_run}"],
                                       "is FINISHED: there is nothing to continue"),
    "train output_dir is a file": ([*TRAIN, "--data_dir", "{data}", "--overrides", "verlflow.output_dir={a_file}"],
                                   "verlflow.output_dir '{a_file}' is a file"),
    "train model cache cannot be written": ([*TRAIN, "--data_dir", "{data}"], "set VERLFLOW_CACHE"),
    "train data_dir a symlink loop": ([*TRAIN, "--data_dir", "{loop}"], "data_dir '{loop}' is a symbolic-link loop"),
    "preprocess output_dir a symlink loop": (["preprocess", "--source", "synthetic", "--output_dir", "{loop}"],
                                             "output_dir '{loop}' is a symbolic-link loop"),
    "compare output_dir under a file": (["compare", "--baseline", "x", "--candidate", "y", "--output_dir",
                                         "{a_file}/report"], "is a file"),
    "main model_name a/b": (["main", "--device", "cpu", "--model_name", "a/b"], "model name 'a/b'"),
    "main model_name with blanks": (["main", "--device", "cpu", "--model_name", "a b c"], "model name 'a b c'"),
    "main model_name of 300 characters": (["main", "--device", "cpu", "--model_name", "m" * 300],
                                          "300 characters long"),
    "search unknown pruner": (["search", "--device", "cpu", "--pruner", "foo"], "unknown pruner 'foo'"),
    "search password in storage": (["search", "--device", "cpu", "--storage",
                                    "postgresql://user:s3cret@127.0.0.1/optuna"], "PGPASSWORD"),
    "register a step-0 checkpoint": (["register", "--run_id", "{step0_run}"], "step 0"),
    "train dead tracking server": ([*TRAIN, "--data_dir", "{data}"], "cannot be reached"),
    "preprocess dead tracking server": (["preprocess", "--source", "synthetic", "--output_dir", "{root}/d"],
                                        "cannot be reached"),
    "promote dead tracking server": (["promote", "--model_name", "tiny"], "cannot be reached"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_no_run(case, bad, capsys, monkeypatch):
    argv, expected = CASES[case]
    argv = [arg.format(**bad) for arg in argv]
    expected = expected.format(**bad)
    if "model cache" in case:  # a read-only HOME, as root sees one: the cache's path runs through a file
        monkeypatch.setenv("VERLFLOW_CACHE", f"{bad['a_file']}/cache")
    if "dead tracking server" in case:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", DEAD_SERVER)
        mlflow.set_tracking_uri(DEAD_SERVER)
    before = _runs(bad["uri"])
    started = time.monotonic()
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
    finally:
        mlflow.set_tracking_uri(bad["uri"])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err
    print(f"{case}: failed in {seconds:.1f} s")  # fault figure (time to fail), not asserted
    errors = [line for line in err.splitlines() if line.startswith(f"verlflow {argv[0]}:")]
    assert exit_info.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    assert len(errors) == 1 and expected in errors[0], err[-2000:]
    assert _runs(bad["uri"]) == before  # nothing opened, so nothing left RUNNING


def _runs(uri: str) -> list[tuple[str, str]]:
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted((r.info.run_id, r.info.status) for r in runs)
