"""`mlflow run . -e train -P device=npu|gpu` on a machine without the device: dry run logs, real run refuses.

A dry run composes the guide's recipe on the A3 / H20 profile, has verl itself compose the exact command
line (``main_ppo --cfg job``, logged as config/verl_job.yaml), logs the run and prints the command.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import fresh_store
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]

EXPECTED = {
    "npu": {
        "command": ["trainer.n_gpus_per_node=16", "trainer.device=npu", "export TASK_QUEUE_ENABLE=2",
                    "export CPU_AFFINITY_CONF=1", "source /usr/local/Ascend/ascend-toolkit/set_env.sh",
                    "source /usr/local/Ascend/nnal/atb/set_env.sh",
                    'export LD_PRELOAD=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2"${LD_PRELOAD:+:$LD_PRELOAD}"',
                    "\"trainer.logger=['console','tensorboard','mlflow']\"", "export TENSORBOARD_DIR="],
        "job": {"n_gpus_per_node": 16, "device": "npu", "logger": ["console", "tensorboard", "mlflow"]},
        "profile": "a3",
    },
    "gpu": {
        "command": ["trainer.n_gpus_per_node=8", "export VLLM_USE_V1=1",
                    "\"trainer.logger=['console','mlflow']\""],
        # As in the guide's H20 script, trainer.device is left at verl's default (cuda).
        "absent": ["TASK_QUEUE_ENABLE", "set_env.sh", "LD_PRELOAD", "trainer.device="],
        "job": {"n_gpus_per_node": 8, "device": "cuda", "logger": ["console", "mlflow"]},
        "profile": "h20",
    },
}


def _mlflow_run(tmp_path: Path, *params: str) -> subprocess.CompletedProcess:
    from verlflow.data import gsm8k

    # The preflight reads the data files: a few synthetic rows in verl's format.
    gsm8k.preprocess("synthetic", str(tmp_path / "data" / "gsm8k"), 8)
    argv = ["mlflow", "run", str(REPO), "--env-manager", "local", "-e", "train"]
    for p in (*params, f"data_dir={tmp_path / 'data' / 'gsm8k'}"):
        argv += ["-P", p]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MLFLOW_TRACKING_URI": fresh_store(tmp_path)})


def _only_run(tmp_path: Path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs(["0"])
    assert len(runs) == 1
    return client, runs[0]


@pytest.mark.slow
@pytest.mark.parametrize("dev", ["npu", "gpu"])
def test_dry_run_logs_the_guides_launch_and_verl_composes_it(tmp_path, dev):
    done = _mlflow_run(tmp_path, f"device={dev}", "dry_run=true")
    assert done.returncode == 0, done.stderr[-3000:]
    client, run = _only_run(tmp_path)
    want = EXPECTED[dev]
    assert run.info.status == "FINISHED"
    assert run.data.tags["verlflow.dry_run"] == "true" and run.data.tags["verlflow.profile"] == want["profile"]
    assert run.data.tags["device.type"] == dev
    command = Path(client.download_artifacts(run.info.run_id, "config/command.txt", str(tmp_path))).read_text()
    for text in want["command"]:
        assert text in command
    for text in want.get("absent", []):
        assert text not in command
    assert "-m verl.trainer.main_ppo" in command and "actor_rollout_ref.rollout.n=5" in command
    assert command in done.stdout  # the exact command is printed
    # This machine has neither: the dry run says so, as expected, first (issue 58).
    assert f"verlflow: dry run: no {'NPU' if dev == 'npu' else 'CUDA GPU'} is visible" in done.stdout
    # verl's own composition of that command line (main_ppo --cfg job), unchanged by the shell.
    job = yaml.safe_load(Path(client.download_artifacts(run.info.run_id, "config/verl_job.yaml",
                                                        str(tmp_path))).read_text())
    assert {k: job["trainer"][k] for k in want["job"]} == want["job"]
    assert job["actor_rollout_ref"]["actor"]["optim"]["lr"] == 5e-7
    assert job["trainer"]["save_freq"] > job["trainer"]["total_epochs"] * 14  # the final step saves
    resolved = yaml.safe_load(Path(client.download_artifacts(run.info.run_id, "config/resolved.yaml",
                                                             str(tmp_path))).read_text())
    assert resolved["trainer"]["n_gpus_per_node"] == want["job"]["n_gpus_per_node"]
    # mlflow run's own and the digest that vouches for the run's arguments on a resume; none of verl's
    assert run.data.params.keys() == {"recipe", "device", "profile", "data_dir", "model", "overrides", "backend",
                                      "dry_run", "ray_address", "resume", "verlflow.train_args_sha256"}
    if dev == "npu":
        assert run.data.tags["verlflow.jemalloc"] == "missing"
        assert "Running without jemalloc" in done.stdout
    assert not (REPO / "outputs").exists() or not any((REPO / "outputs").rglob(run.info.run_id))


@pytest.mark.slow
def test_without_dry_run_a_missing_npu_fails_fast_in_one_line(tmp_path):
    done = _mlflow_run(tmp_path, "device=npu")
    assert done.returncode != 0
    assert ("verlflow train: error: device=npu: no NPU is visible on this machine (torch_npu not installed); "
            "run on an A3 node or pass -P dry_run=true\n") in done.stderr
    assert "Traceback" not in done.stderr
    _, run = _only_run(tmp_path)
    assert run.info.status == "FAILED"
    assert "no NPU is visible" in run.data.tags["verlflow.error"]
    assert "verlflow.dry_run" not in run.data.tags  # refused before the step's run took it over: no launch logged
