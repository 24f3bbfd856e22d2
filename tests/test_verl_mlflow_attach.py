"""verl's own MLflow logger writes into our run: its params and sanitized metrics arrive beside our tags.

verl logs every resolved config key as a param and silently stops logging to MLflow if one already exists
with another value; so our run must hold none of them when verl attaches. Here our run is started the way
``train`` starts it (standard tags, the -P params ``mlflow run`` logs, then everything train_verl logs
before launch), and verl's real ``Tracking`` attaches from another process through MLFLOW_RUN_ID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from verlflow import config, tracking
from verlflow.backends import verl_command
from verlflow.backends.verl import record_launch

VERL_SIDE = textwrap.dedent(
    """
    import json, sys
    from verl.utils.tracking import Tracking
    cfg = json.load(open(sys.argv[1]))
    t = Tracking(cfg["trainer"]["project_name"], cfg["trainer"]["experiment_name"],
                 default_backend=["console", "mlflow"], config=cfg)
    t.log({"val-core/openai/gsm8k/reward/mean@1": 0.75, "timing_s/step": 12.5}, step=1)
    t.finish()
    """
)


@pytest.mark.slow
def test_verls_tracking_attaches_to_our_run_and_logs_params_and_metrics(tracking_uri, tmp_path):
    cfg = config.compose("qwen3-4b-gsm8k-grpo", "a3", f"verlflow.output_dir={tmp_path}")
    tags = tracking.standard_tags(backend="verl", recipe=cfg.recipe_name, profile=cfg.profile.name)
    with tracking.tracked_run(run_name="attach", tags={**tags, "verlflow.step": "train"}) as run:
        run_id = run.info.run_id
        # What `mlflow run` logs: the entry point's -P parameters.
        mlflow.log_params({"device": "npu", "dry_run": "false", "overrides": "", "recipe": "auto"})
        plan = verl_command.build_plan(cfg, run_id=run_id, experiment_name="Default", run_name="attach",
                                       tracking_uri=tracking_uri)
        resolved = config.validate_against_verl(plan.overrides)
        record_launch(cfg, plan, resolved, dry_run=False, ray_address="", command=plan.command_text())
        cfg_file = tmp_path / "resolved.json"
        cfg_file.write_text(json.dumps(config.OmegaConf.to_container(resolved, resolve=True)))
        done = subprocess.run([sys.executable, "-c", VERL_SIDE, str(cfg_file)], capture_output=True, text=True,
                              env={**os.environ, **plan.attach_env}, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "All MLflow initialization attempts failed" not in done.stderr

    got = MlflowClient().get_run(run_id)
    assert got.info.status == "FINISHED"
    expected = {k: str(v) for k, v in tracking.flatten_params(json.loads(cfg_file.read_text())).items()}
    assert {k: got.data.params[k] for k in expected} == expected
    assert got.data.params["actor_rollout_ref/actor/optim/lr"] == "5e-07"
    assert got.data.params["trainer/n_gpus_per_node"] == "16"
    assert got.data.params["device"] == "npu"  # mlflow run's params coexist with verl's
    assert got.data.metrics["val-core/openai/gsm8k/reward/mean_at_1"] == 0.75
    assert got.data.metrics["timing_s/step"] == 12.5
    assert got.data.tags["verlflow.backend"] == "verl" and got.data.tags["device.type"] == "npu"
    artifacts = {a.path for a in MlflowClient().list_artifacts(run_id, "config")}
    assert artifacts == {"config/command.txt", "config/resolved.yaml"}
