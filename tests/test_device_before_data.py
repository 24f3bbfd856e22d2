"""A train for an NPU or a GPU on a machine without one says so first: refused in one line naming the missing
device (not the missing data and its download), or, for a dry run, told that this is expected off the node and
what it still checks, before anything about the data (issue 58, item 1).

The machine is this CPU host: no torch_npu installed, and tests/fakes/nvidia-smi first on PATH with no recording,
so it fails as a machine without the NVIDIA driver does (its output is the real tool's, tests/fixtures/device).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from conftest import cli_in_process, fresh_store
from mlflow.tracking import MlflowClient

FAKES = Path(__file__).parent / "fakes"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                                reason="this machine has torch_npu: it is not a machine without an NPU")


def _laptop(root: Path) -> dict[str, str]:
    """The environment of a laptop with no NPU (no npu-smi at all) and nvidia-smi but no NVIDIA driver (it fails as
    nvidia-utils without a GPU does), a fresh store of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "MLFLOW_RUN_ID"))}
    tools = root / "bin"
    tools.mkdir(exist_ok=True)
    (tools / "nvidia-smi").symlink_to(FAKES / "nvidia-smi")
    return {**env, "PATH": f"{tools}:{os.environ['PATH']}", "MLFLOW_TRACKING_URI": fresh_store(root)}


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_a_gpu_train_on_a_machine_without_one_names_the_gpu_not_the_data(tmp_path):
    env = _laptop(tmp_path)
    done = cli_in_process(["train", "--device", "gpu"], env=env, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("verlflow train: error: device=gpu: no CUDA GPU is visible here (nvidia-smi"), lines
    assert "couldn't communicate with the NVIDIA driver" in lines[0]  # the tool's own words
    assert lines[0].endswith("run on an H20 node or pass -P dry_run=true"), lines
    assert "parquet" not in done.stderr and "hub" not in done.stderr and "preprocess" not in done.stdout
    assert not (tmp_path / "data").exists() and _runs(env["MLFLOW_TRACKING_URI"]) == []


def test_main_on_an_npu_it_does_not_have_names_the_npu_before_downloading_anything(tmp_path):
    env = _laptop(tmp_path)
    done = cli_in_process(["main", "--device", "npu"], env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == ("verlflow main: error: device=npu: no NPU is visible on this machine (torch_npu not "
                           "installed); run on an A3 node\n")
    assert not (tmp_path / "data").exists() and _runs(env["MLFLOW_TRACKING_URI"]) == []


def test_an_npu_dry_run_on_a_laptop_is_told_it_is_expected_and_then_what_data_it_lacks(tmp_path):
    env = _laptop(tmp_path)
    done = cli_in_process(["train", "--device", "npu", "--dry_run", "true"], env=env, cwd=tmp_path)
    assert done.stdout.startswith("verlflow: dry run: no NPU is visible on this machine (torch_npu not installed), "
                                  "as expected off the node (a laptop, a CPU runner): it still checks the launch "
                                  "against the installed verl"), done.stdout[-2000:]
    assert "`verlflow doctor --device npu` on the node" in done.stdout.splitlines()[0]
    # The device settled, the one thing left is the data: the README's preprocess line, not a device.
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("verlflow train: error: no train.parquet in data/openai-gsm8k (the recipe's "
                               "data_source 'openai/gsm8k' is not prepared here)"), lines
    assert "NPU" not in lines[0] and _runs(env["MLFLOW_TRACKING_URI"]) == []


@pytest.mark.slow
def test_the_readmes_npu_dry_run_passes_on_a_laptop_after_the_readmes_preprocess(tmp_path):
    from verlflow.data import gsm8k

    # The README's `-e preprocess -P source=openai/gsm8k` (→ data/openai-gsm8k), with synthetic rows: no hub here.
    gsm8k.preprocess("synthetic", str(tmp_path / "data" / "openai-gsm8k"), 8, log_to_mlflow=False)
    env = _laptop(tmp_path)
    done = cli_in_process(["train", "--device", "npu", "--dry_run", "true"], env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("verlflow: dry run: no NPU is visible on this machine (torch_npu not installed), "
                                  "as expected off the node"), done.stdout[:2000]
    assert "verlflow: dry run: verl's config composes this command line; not launched" in done.stdout
    [run] = _runs(env["MLFLOW_TRACKING_URI"])
    assert run.info.status == "FINISHED" and run.data.tags["verlflow.dry_run"] == "true"
    assert run.data.tags["verlflow.profile"] == "a3"
