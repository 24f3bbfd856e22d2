"""Out of memory is one line naming the limit and the setting to lower, and the run ends FAILED with its metrics
(issue 45: ``ulimit -v`` gave a RuntimeError traceback). A real address-space limit (RLIMIT_AS) on a real train
of the tiny recipe; the limit is set after the heavy imports, so it bounds the training, not the loading of torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

from verlflow.out_of_memory import is_out_of_memory, out_of_memory_error

LIMITED = textwrap.dedent("""
    import resource, sys
    import mlflow, torch, transformers, verl  # noqa: F401  loaded before the limit, as a long-lived process has
    from verlflow import cli
    from verlflow.backends.local import trainer  # noqa: F401
    import datasets, verl.trainer.ppo.utils, verl.utils.reward_score.gsm8k  # noqa: F401, E401  (the set-up's checks)
    size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + 768 * 2**20, resource.RLIM_INFINITY))
    cli.main(sys.argv[1:])
""")


@pytest.mark.slow
def test_a_train_out_of_memory_is_one_line_naming_the_setting_and_the_run_ends_failed(tmp_path, tracking_uri,
                                                                                       tiny_workdir):
    env = {**os.environ, "VERLFLOW_CACHE": str(tiny_workdir / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, "train", "--recipe", "tiny", "--device", "cpu", "--data_dir",
         str(tiny_workdir / "data"), "--overrides", "actor_rollout_ref.rollout.n=2048"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("verlflow train: error: out of memory in the local trainer at step "), line
    assert "actor_rollout_ref.rollout.n=2048" in line and "address space (ulimit -v)" in line
    assert 'e.g. -P overrides="actor_rollout_ref.rollout.n=1024"' in line  # the largest lever, halved
    client = MlflowClient()
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                "tags.`verlflow.step` = 'train'")
    assert run.info.status == "FAILED"
    assert run.data.params["actor_rollout_ref/rollout/n"] == "2048"
    assert run.data.tags["verlflow.error"].endswith(line.removeprefix("verlflow train: error: "))
    if " at step 1 " not in line:  # the steps before the one that ran out are kept
        assert "critic/score/mean" in run.data.metrics


def test_the_voices_of_out_of_memory_are_recognised_through_the_chain():
    import torch

    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**62, dtype=torch.uint8)  # what a failed CPU allocation says, for real
    assert is_out_of_memory(caught.value)
    try:
        try:
            raise MemoryError
        except MemoryError as inner:
            raise ValueError("while handling it") from inner
    except ValueError as outer:
        assert is_out_of_memory(outer)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    line = str(out_of_memory_error("somewhere", {"a.b": 8, "c": 1}))
    assert 'a.b=8, c=1' in line and 'e.g. -P overrides="a.b=4"' in line and "\n" not in line


def test_evaluate_halves_a_batch_that_ran_out_of_memory_down_to_one_problem(capsys):
    import torch

    from verlflow.errors import VerlflowError
    from verlflow.models.generate import _smaller_batch

    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**62, dtype=torch.uint8)
    assert _smaller_batch(caught.value, 32, 1024) == 16
    assert "evaluate: out of memory generating 32 problems at once; going on with 16" in capsys.readouterr().out
    with pytest.raises(VerlflowError, match=r"^out of memory evaluating one problem at a time with "
                                            r"max_new_tokens=1024; .*: the model and one answer"):
        _smaller_batch(caught.value, 1, 1024)
    with pytest.raises(ValueError, match="not memory"):
        _smaller_batch(ValueError("not memory"), 32, 1024)
