"""verl's own process out of memory is one verlflow line naming the settings that would fit, and the run ends FAILED
with its metrics (issue 45: the verl backend's out of memory had no line, only "verl exited with status 1").

Real processes through the real CLI: the verl stand-in (tests/standins/verl_main_standin.py, mode ``out_of_memory``)
composes verl's real config, logs two steps through verl's real ``Tracking``, then asks torch for 4 EiB: torch's own
allocator error kills it with its traceback, as it kills verl.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

STANDIN = Path(__file__).parent / "standins" / "verl_main_standin.py"


@pytest.mark.slow
def test_verl_out_of_memory_is_one_line_with_its_micro_batches_and_the_run_fails(tracking_uri, tmp_path, tiny_workdir):
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    model = resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache")
    overrides = (f"verlflow.launch_module={STANDIN} verlflow.skip_preflight=true trainer.n_gpus_per_node=1 "
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                 f"verlflow.output_dir={tmp_path / 'outputs'}")
    argv = [sys.executable, "-m", "verlflow.cli", "train", "--recipe", "tiny", "--device", "gpu", "--backend", "verl",
            "--model", str(model), "--data_dir", str(tiny_workdir / "data"), "--overrides", overrides]
    done = subprocess.run(argv, env={**os.environ, "VERLFLOW_STANDIN_MODE": "out_of_memory"}, cwd=tmp_path,
                          text=True, capture_output=True, timeout=900)
    assert done.returncode == 2, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    print(line)
    assert line.startswith("verlflow train: error: out of memory in verl in host memory (it exited with status 1) "
                           "with actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="), line
    assert "data.train_batch_size=" in line and "the machine has " in line
    assert "gpu_memory_utilization" not in line and "offload" not in line  # host memory: the accelerator's levers
    assert 'lower a micro batch first, e.g. -P overrides="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=' in line
    assert "Traceback" not in done.stderr  # verl's own traceback is in its output (stdout, logs/verl.log) only
    client = MlflowClient()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert run.data.tags["verlflow.error"].startswith("OutOfMemory: out of memory in verl in host memory ")
    assert run.data.metrics["critic/score/mean"] == pytest.approx(0.2)  # the steps before it are kept


def test_an_accelerator_out_of_memory_names_the_rollout_share_and_the_offload_as_levers():
    """torch's CUDA message as verl's worker prints it (recorded from torch 2.x's allocator): the accelerator's
    levers are named, micro batch first, and the host's memory is not blamed."""
    from verlflow.backends.verl.memory import MemoryWatch, verl_out_of_memory

    seen = []
    watch = MemoryWatch(seen.append)
    for line in ("(WorkerDict pid=812) step 3 ...",
                 "(WorkerDict pid=812) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                 "has a total capacity of 79.15 GiB of which 1.02 GiB is free.", "later line"):
        watch(line)
    assert len(seen) == 3 and "CUDA out of memory" in watch.seen
    overrides = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8, "data.train_batch_size": 256,
                 "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
                 "actor_rollout_ref.actor.fsdp_config.param_offload": False}
    line = str(verl_out_of_memory(watch.seen, 1, overrides))
    assert line.startswith("out of memory in verl on the accelerator (it exited with status 1) with "
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8, "), line
    assert "; the accelerator's memory is full: lower a micro batch first, e.g. -P overrides=\"actor_rollout_ref." \
           "actor.ppo_micro_batch_size_per_gpu=4\", or actor_rollout_ref.rollout.gpu_memory_utilization=0.5 " \
           "(vLLM's share of the accelerator), or actor_rollout_ref.actor.fsdp_config.param_offload=true" in line
