"""A failed run's error text is filtered like every other value that leaves the process.

The console line of a failure was masked, but the ``verlflow.error`` tag stored the exception's text as it was:
an ``hf_…`` token in a model path, a ``pass=…`` in a data path stayed readable by anyone who can read the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli_in_process
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import ERROR_TAG
from verlflow.tracking import tracking

HF = "hf_" + "Zq3xK9pL2mN8vB4cR7tY1wE6uI0oPaSd"
PASS = "Hunter7value"


def _store_bytes(uri: str) -> bytes:
    return Path(uri.removeprefix("sqlite:///")).read_bytes()


def test_the_error_tag_of_a_failed_run_holds_no_secret(tracking_uri):
    with pytest.raises(VerlflowError), tracking.tracked_run(run_name="leaky", tags={"verlflow.step": "train"}) as run:
        raise VerlflowError(f"/models/{HF}/qwen has no config.json; /data/pass={PASS}/train.parquet is empty")
    ended = MlflowClient().get_run(run.info.run_id)
    assert ended.info.status == "FAILED"
    assert ended.data.tags[ERROR_TAG] == "VerlflowError: /models/***/qwen has no config.json; /data/pass=*** is empty"
    assert HF.encode() not in _store_bytes(tracking_uri) and PASS.encode() not in _store_bytes(tracking_uri)


def test_a_refused_path_is_masked_on_the_console(tracking_uri, tmp_path):
    data = tmp_path / f"pass={PASS}"
    done = cli_in_process(["train", "--recipe", "tiny", "--data_dir", str(data / HF)], cwd=tmp_path)
    assert done.returncode == 2
    assert PASS not in done.stdout + done.stderr and HF not in done.stdout + done.stderr
    assert "pass=***" in done.stderr, done.stderr
