"""The guide's verl (0.5.0) and the newest (the installed one) both compose our recipe and log into our run.

verl 0.5.0 comes from the package registry into a cached ``--target`` folder without its dependencies
(``.pytest_cache/d/verl-0.5.0``, installed once by conftest's ``guide_verl``) and is put first on ``sys.path``
of a subprocess. There,
for each verl: the guide's recipe composes and validates with each profile (a3, h20) against *that* verl's
config and passes the preflight's name and size checks; then, for a run verlflow created in experiments
``Qwen3 GRPO/A3 对比`` and ``team-a/h20 baseline``, the launch's own command-line overrides are composed by
that verl's Hydra and that verl's real ``Tracking`` (``set_experiment(project_name)`` then ``start_run`` in
0.5.0; ``start_run(run_id=…)`` in 0.9) writes its params and metrics into our run. And verlflow.compat.verl's
accessors hold on each verl: its param flattening, key sanitizer, task runner and resume branch are there, and
so are the functions its raise-site table names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from verlflow.tracking import tracking

REPO = Path(__file__).resolve().parents[1]
GUIDE_VERL = "0.5.0"
EXPERIMENTS = ("Qwen3 GRPO/A3 对比", "team-a/h20 baseline")

VERL_SIDE = textwrap.dedent(
    """
    import ast, json, os, sys
    import verl
    from omegaconf import OmegaConf
    from verlflow import config
    from verlflow.backends.verl import command as verl_command
    from verlflow.backends.verl.dryrun import preflight as verl_preflight
    from verl.utils.tracking import Tracking

    def compat_accessors(verl):  # what verlflow.compat.verl gives with this verl; the raise sites it lacks
        from verlflow.compat import verl as compat_verl

        def defines(path, name):
            file = os.path.join(os.path.dirname(verl.__file__), path)
            return os.path.isfile(file) and any(getattr(node, "name", None) == name
                                                for node in ast.walk(ast.parse(open(file).read())))

        runner, modules = compat_verl.task_runner()
        return {"params": compat_verl.mlflow_params({"a": {"b": [1, 2]}}),
                "sanitized": compat_verl.metric_key_sanitizer()("val/mean@1"), "task_runner": runner.__name__,
                "resume": compat_verl.load_checkpoint(modules[-1].RayPPOTrainer) is not None,
                "missing_sites": [f"{p}:{f}" for p, f in compat_verl.RAISE_SITES if not defines(p, f)]}

    jobs = json.loads(sys.argv[1])
    out = {"version": verl.__version__, "verl_file": verl.__file__, "profiles": {}}
    for profile in ("a3", "h20"):
        cfg = config.compose("qwen3-4b-gsm8k-grpo", profile, f"verlflow.output_dir={jobs['tmp']}")
        plan = verl_command.build_plan(cfg, run_id="0" * 32, experiment_name="e", run_name="r",
                                       tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        resolved = config.validate_against_verl(plan.overrides)
        lines = [p.line() for p in verl_preflight.name_problems(resolved) + verl_preflight.size_problems(resolved)]
        out["profiles"][profile] = {"problems": lines, "use_v1": "trainer.use_v1" in plan.overrides,
                                    "n_gpus": resolved.trainer.n_gpus_per_node}
    for job in jobs["runs"]:
        cfg = config.compose("qwen3-4b-gsm8k-grpo", "h20", f"verlflow.output_dir={jobs['tmp']}")
        plan = verl_command.build_plan(cfg, run_id=job["run_id"], experiment_name=job["experiment"],
                                       run_name=job["run_name"], tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        # What main_ppo receives: the launch's command line, composed by this verl's Hydra.
        composed = config.validate_against_verl(config.parse_overrides(config.hydra_overrides(plan.overrides)))
        os.environ.update(plan.attach_env)
        t = Tracking(project_name=composed.trainer.project_name, experiment_name=composed.trainer.experiment_name,
                     default_backend=["console", "mlflow"], config=OmegaConf.to_container(composed, resolve=True))
        t.log({"val-core/openai/gsm8k/reward/mean@1": 0.5, "timing_s/step": 3.0}, step=1)
        del t
        import mlflow
        mlflow.end_run()
    out["compat"] = compat_accessors(verl)
    print("RESULT " + json.dumps(out))
    """
)


def _run_verl_side(paths: list[str], tmp_path: Path, uri: str, runs: list[dict]) -> dict:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
           "PYTHONPATH": os.pathsep.join([*paths, str(REPO / "src")])}
    env.pop("MLFLOW_RUN_ID", None)
    jobs = json.dumps({"tmp": str(tmp_path / "outputs"), "runs": runs})
    done = subprocess.run([sys.executable, "-c", VERL_SIDE, jobs], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Cannot start run" not in done.stderr and "All MLflow initialization attempts failed" not in done.stderr
    return json.loads(done.stdout.rpartition("RESULT ")[2])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["guide", "newest"])
def test_each_verl_composes_the_guide_and_logs_into_our_run(which, guide_verl, tracking_uri, tmp_path):
    runs = []
    for experiment in EXPERIMENTS:
        with tracking.tracked_run(run_name=f"{experiment} run", experiment=experiment,
                                  tags={"verlflow.backend": "verl"}) as run:
            runs.append({"run_id": run.info.run_id, "experiment": experiment, "run_name": f"{experiment} run"})
    paths = [str(guide_verl)] if which == "guide" else []
    result = _run_verl_side(paths, tmp_path, tracking_uri, runs)

    if which == "guide":
        assert result["version"] == GUIDE_VERL and result["verl_file"].startswith(str(guide_verl))
        assert not any(p["use_v1"] for p in result["profiles"].values())  # 0.5.0 has no trainer.use_v1
    else:
        assert result["version"] != GUIDE_VERL
    assert {k: (v["problems"], v["n_gpus"]) for k, v in result["profiles"].items()} == {
        "a3": ([], 16), "h20": ([], 8)}
    client = MlflowClient()
    for job in runs:
        got = client.get_run(job["run_id"])
        assert got.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] == 0.5
        assert got.data.metrics["timing_s/step"] == 3.0
        assert got.data.params["trainer/project_name"] == job["experiment"]
        assert got.data.params["actor_rollout_ref/actor/optim/lr"] == "5e-07"
        assert got.info.run_name == job["run_name"]
    assert result["compat"] == {  # verlflow.compat.verl holds on this verl
        "params": {"a/b/list_len": 2, "a/b/0": 1, "a/b/1": 2}, "sanitized": "val/mean_at_1",
        "task_runner": "TaskRunner", "resume": True, "missing_sites": ["trainer/ppo/reward.py:wrapped_fn"]}
    names = {e.name for e in client.search_experiments()}
    assert names == {"Default", *EXPERIMENTS}  # verl created no experiment of its own
