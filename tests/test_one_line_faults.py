"""A full disk, a missing file and input that cannot train are one line naming what and where, with the fix
(issue 56, items 6 and 7), where they were a traceback, a FAILED run with MLflow's made-up name, or a training at
reward 0.

A disk cannot be filled on cue here: a write past a file-size limit (``RLIMIT_FSIZE``, ``ulimit -f``) fails the way
a full disk does (EFBIG; Python ignores SIGXFSZ, so the write returns the error instead of the process dying), in
this process where no other file the step writes grows past the limit. A cgroup's memory limit is read from recorded
cgroup files (tests/fixtures/cgroup: the hardware boundary).
"""

from __future__ import annotations

import contextlib
import resource
import signal
from pathlib import Path

import pytest
from conftest import cli_in_process, every_experiment
from mlflow.tracking import MlflowClient

from verlflow.data import gsm8k

TRAIN = ["train", "--recipe", "tiny", "--device", "cpu"]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return gsm8k.preprocess("synthetic", tmp_path_factory.mktemp("data"), 8, log_to_mlflow=False).output_dir


def _error_line(done, step: str) -> str:
    """The step's one error line; no traceback anywhere."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(f"verlflow {step}: error: ")]
    return line.removeprefix(f"verlflow {step}: error: ")


def _runs() -> list:
    client = MlflowClient()
    return client.search_runs(every_experiment(client))


@contextlib.contextmanager
def _file_size_limit(size: int):
    """Writes past ``size`` bytes fail with EFBIG in this process, as on a full disk, until the block ends."""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN  # Python's default: the write fails, no death
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


# --- 7: input that cannot train is refused before a run opens ---------------------------------------------------


def test_grpo_with_one_response_per_prompt_is_refused_with_verls_reason(tracking_uri, data_dir):
    # Before: accepted; a group of one has no mean or std, so GRPO trained on no group advantage at all.
    done = cli_in_process([*TRAIN, "--data_dir", str(data_dir), "--overrides", "actor_rollout_ref.rollout.n=1"])
    assert _error_line(done, "train") == (
        "actor_rollout_ref.rollout.n=1: algorithm.adv_estimator=grpo normalises each response's reward by its "
        "prompt's group of n responses, so the group size must be >= 2 (verl: \"> 1 for grpo\"); with one there is "
        "no group advantage: use n >= 2 (the guide uses 5)")
    assert _runs() == []
