"""A real verl launch on this CPU that crashes in its training: the run ends FAILED with verl's own error, and no
Ray process of it is left.

    pytest tests/test_verl_cpu_crash.py

The launch that finishes is tests/test_verl_cpu_launch.py's (through `mlflow run`); this one is a file of its own
so that xdist can run the two launches, minutes each on 2 cores, on two workers at once. verlflow's step runs in
this process (the crash is verl's, in verl's processes, which stay real); the launch takes about two minutes on 2
cores, mostly Ray and worker start-up.
"""

from __future__ import annotations

import pytest
from conftest import cli_in_process
from verl_cpu_run import RECIPE_OVERRIDES, launch_env, ray_processes_of, synthetic_data, train_runs


@pytest.mark.slow
def test_a_crashing_verl_run_fails_with_verls_error_and_leaves_no_ray_behind(tmp_path, tiny_workdir):
    env = launch_env(tmp_path, tiny_workdir / "cache")
    data_dir = synthetic_data(env, tmp_path)
    # A fault only verl's training reaches (the dry run's rehearsal scores an exact answer and its stock wrong one,
    # both of which pass): the reward function refuses the first real completion, after Ray and the workers started.
    from verlflow.backends.verl.dryrun.rehearsal.first_step import WRONG_ANSWER

    reward = tmp_path / "picky_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      f"    if solution_str not in (f'#### {{ground_truth}}', {WRONG_ANSWER!r}):\n"
                      "        raise ValueError('picky reward: a real completion')\n"
                      "    return float(solution_str.startswith('####'))\n")
    overrides = f"{RECIPE_OVERRIDES} reward.custom_reward_function.path={reward} verlflow.output_dir={tmp_path / 'out'}"
    crash = cli_in_process(["train", "--recipe", "tiny", "--device", "cpu", "--backend", "verl",
                            "--data_dir", str(data_dir), "--overrides", overrides], env=env, cwd=tmp_path)
    assert crash.returncode != 0, crash.stdout[-3000:]
    [run] = train_runs(env["MLFLOW_TRACKING_URI"])
    assert run.info.status == "FAILED"
    assert run.data.tags["verlflow.verl_error"] == "ValueError: picky reward: a real completion"
    assert ray_processes_of(run.info.run_id) == []
