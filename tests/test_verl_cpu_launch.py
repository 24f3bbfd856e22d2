"""verl's own trainer, for real, on this CPU: `mlflow run . -e train -P device=cpu -P backend=verl`.

One real launch of ``python -m verl.trainer.main_ppo`` (2 GRPO steps of the tiny recipe, the cpu-verl
profile, verlflow's CPU plugin loaded into every verl process) is shared by the tests below: the launch
script and environment, Ray started and stopped, verl's MLflow logger writing into the run ``mlflow run``
opened, verl's checkpoint merged by verl's model merger, registered and evaluated, and a ``compare`` with
a local run of the same recipe; both profile step 2 (``verlflow.profile_steps=[2]``). The launch that
crashes on purpose (a value that only verl can judge) is tests/test_verl_cpu_crash.py, a file of its own so that
xdist can run the two launches on two workers at once. The steps after the launch (register, evaluate, the local
train) run in this process. The launch takes about two minutes on 2 cores, mostly Ray and worker start-up.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from conftest import slow_setup
from mlflow.tracking import MlflowClient
from verl_cpu_run import (
    RECIPE_OVERRIDES,
    launch_env,
    mlflow_train,
    ray_processes_of,
    synthetic_data,
    train_runs,
    verlflow,
)

from verlflow import names
from verlflow.compare.comparison import compare_runs

# verl's global_profiler (torch on the CPU) and the local trainer's torch.profiler over step 2.
PROFILED = "verlflow.profile_steps=[2]"
SHARED_CURVES = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "response_length/mean",
                 "timing_s/gen", "timing_s/update_actor", "timing_s/step")


@dataclass
class VerlCpuStore:
    """A tracking store holding one real verl CPU train run (and what it took)."""

    uri: str
    env: dict[str, str]
    workdir: Path
    data_dir: Path
    run_id: str
    launch: subprocess.CompletedProcess
    wall_s: float


@pytest.fixture(scope="module")
@slow_setup
def verl_cpu(tmp_path_factory, tiny_workdir) -> VerlCpuStore:
    """Synthetic data, then ONE real verl launch on the CPU through `mlflow run`, shared by this module."""
    workdir = tmp_path_factory.mktemp("verl_cpu")
    env = launch_env(workdir, tiny_workdir / "cache")
    data_dir = synthetic_data(env, workdir)
    started = time.monotonic()
    launch = mlflow_train(env, workdir, data_dir, f"{RECIPE_OVERRIDES} {PROFILED}")
    wall = time.monotonic() - started
    print(f"\nverl on the CPU: `mlflow run -e train -P backend=verl` took {wall:.0f} s")
    assert launch.returncode == 0, f"verl launch failed:\n{launch.stdout[-4000:]}\n{launch.stderr[-4000:]}"
    runs = train_runs(env["MLFLOW_TRACKING_URI"])
    assert len(runs) == 1
    return VerlCpuStore(uri=env["MLFLOW_TRACKING_URI"], env=env, workdir=workdir, data_dir=data_dir,
                        run_id=runs[0].info.run_id, launch=launch, wall_s=wall)


@pytest.fixture
def client(verl_cpu, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", verl_cpu.uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(verl_cpu.uri)
    return MlflowClient(tracking_uri=verl_cpu.uri)


@pytest.mark.slow
def test_verl_trains_in_the_run_mlflow_run_opened_with_the_local_trainers_metric_names(verl_cpu, client):
    run = client.get_run(verl_cpu.run_id)
    assert run.info.status == "FINISHED"
    # mlflow run's own params (-P) and verl's resolved config in ONE run: verl attached, nothing duplicated.
    assert run.data.params["backend"] == "verl" and run.data.params["device"] == "cpu"
    assert run.data.params["actor_rollout_ref/rollout/name"] == "hf"
    assert run.data.params["actor_rollout_ref/actor/optim/lr"] == "0.001"
    assert run.data.tags["verlflow.backend"] == "verl" and run.data.tags["verlflow.profile"] == "cpu-verl"
    assert run.info.run_name.endswith(" · tiny · cpu-verl")  # its overrides first
    # sampled by verlflow's process while verl ran (MLflow's CPU monitor; verl's own process samples nothing)
    assert "system/cpu_utilization_percentage" in run.data.metrics
    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs if r.data.tags.get("verlflow.step") != "preprocess"] == [verl_cpu.run_id]
    for name in SHARED_CURVES:
        assert [m.step for m in client.get_metric_history(verl_cpu.run_id, name)] == [1, 2], name
    # verl 0.9.1 names its validation accuracy .../acc/mean_at_1 (the local trainer: .../reward/mean_at_1).
    assert "val-core/openai/gsm8k/acc/mean_at_1" in run.data.metrics
    # Our end-of-run summaries, from verl's own per-step history.
    steps = [m.value for m in client.get_metric_history(verl_cpu.run_id, "timing_s/step")]
    assert run.data.metrics["timing_s_mean/step"] == pytest.approx(sum(steps) / len(steps))
    assert run.data.metrics["timing_s/e2e"] > 0
    assert {a.path for a in client.list_artifacts(verl_cpu.run_id, "logs")} == {"logs/verl.log", "logs/merge.log"}


@pytest.mark.slow
def test_verls_rollout_traces_are_in_the_runs_experiment_linked_to_the_run(verl_cpu, client):
    run = client.get_run(verl_cpu.run_id)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=verl_cpu.run_id, max_results=500)
    assert len(traces) == int(run.data.tags["verlflow.rollout_traces"]) > 0
    steps = {trace.info.tags.get("step") for trace in traces}
    assert {"1", "2"} <= steps  # a few samples of every training step, found by verl's own step tag
    assert all(trace.info.tags[names.RUN_ID_TAG] == verl_cpu.run_id for trace in traces)
    assert all(trace.info.tags["experiment_name"] == run.info.run_name for trace in traces)
    assert {trace.info.tags["validate"] for trace in traces} == {"False", "True"}  # training and validation
    # token2text: a step's prompt and response read as text on the trace
    spans = client.get_trace(traces[0].info.trace_id).data.spans
    texts = [span.outputs for span in spans if isinstance(span.outputs, dict) and "response_text" in span.outputs]
    assert texts and texts[0]["prompt_text"].startswith("<|im_start|>user\n")
    # and the root span reads like the local trainer's: prompt in, response and reward out, the step (compat). (A
    # worker stopped at the end may leave its last trace without its root span: MLflow exports a root as it ends.)
    roots = {trace.info.trace_id: [span for span in trace.data.spans if span.parent_id is None] for trace in traces}
    complete = [trace for trace in traces if roots[trace.info.trace_id]]
    assert {trace.info.tags["step"] for trace in complete} >= {"1", "2"}
    for trace in complete:
        (root,) = roots[trace.info.trace_id]
        assert root.name == "agent_loop" and set(root.inputs) == {"prompt"} and root.inputs["prompt"]
        assert set(root.outputs) == {"response", "reward"} and isinstance(root.outputs["reward"], float)
        assert str(root.attributes["step"]) == trace.info.tags["step"]


@pytest.mark.slow
def test_the_launch_prints_none_of_verls_and_rays_known_noise(verl_cpu, client):
    printed = verl_cpu.launch.stdout + verl_cpu.launch.stderr
    # verl's resolved-config dump (most of the console before) is one line; the log keeps it whole.
    assert "verlflow: verl's resolved config (" in printed and "'actor_rollout_ref':" not in printed
    log = Path(client.download_artifacts(verl_cpu.run_id, "logs/verl.log", str(verl_cpu.workdir / "log")))
    assert "{'actor_rollout_ref':" in log.read_text()
    # up to verl's model merger, which runs without the plugin (docs/run-output.md)
    launch = printed.split("config: ModelMergerConfig")[0]
    assert "Started a local Ray instance" in launch and "Training from scratch" in launch  # verl's own output shows
    for noise in ("engine is not available", "Legacy trainer", "RayPPOTrainer' is deprecated", "Disabled critic",
                  "Token authentication is enabled", "torch_dtype", "'set_vital'", "far outside GRPO practice",
                  "is_fx_tracing", "[MLflow] Metric key"):
        assert noise not in launch, noise


@pytest.mark.slow
def test_the_launch_script_loads_the_cpu_plugin_and_ray_is_started_then_stopped(verl_cpu, client):
    command = client.download_artifacts(verl_cpu.run_id, "config/command.txt", str(verl_cpu.workdir / "cmd"))
    text = Path(command).read_text()
    assert "export VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl.cpu_plugin" in text
    assert "export VERL_PLATFORM=cpu" in text and "-m verl.trainer.main_ppo" in text
    assert "actor_rollout_ref.rollout.name=hf" in text and f"export MLFLOW_RUN_ID={verl_cpu.run_id}" in text
    log = Path(client.download_artifacts(verl_cpu.run_id, "logs/verl.log", str(verl_cpu.workdir / "log"))).read_text()
    assert "Started a local Ray instance" in log
    assert ray_processes_of(verl_cpu.run_id) == []


@pytest.mark.slow
def test_verls_checkpoint_is_merged_registered_and_evaluated(verl_cpu, client):
    run = client.get_run(verl_cpu.run_id)
    hf_dir = Path(run.data.tags["verlflow.checkpoint_dir"])
    assert (hf_dir / "config.json").is_file()
    assert run.data.tags["verlflow.checkpoint_source"].endswith("global_step_2/actor")
    # The merged folder's weights digest, recorded as an immutable param: register checks the folder against it.
    from verlflow.models.weights_digest import weights_digest

    assert run.data.params["verlflow.checkpoint_sha256"] == weights_digest(hf_dir)
    # The train step logged the merged checkpoint as the run's model, at verl's last step, with its metrics.
    (model,) = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                           filter_string=f"source_run_id = '{verl_cpu.run_id}'")
    assert [(o.model_id, o.step) for o in run.outputs.model_outputs] == [(model.model_id, 2)]
    assert "critic/score/mean" in {m.key for m in client.get_logged_model(model.model_id).metrics if m.step == 2}
    verlflow(["register", "--run_id", verl_cpu.run_id], verl_cpu.env, verl_cpu.workdir)
    name = run.data.tags["verlflow.model_name"]
    version = client.get_model_version_by_alias(name, "challenger")
    assert version.tags["source_run_id"] == verl_cpu.run_id and version.tags["device.type"] == "cpu"
    assert version.source == model.model_uri  # registered from that model, not a second copy
    verlflow(["evaluate", "--model_uri", f"models:/{name}/{version.version}", "--data_dir", str(verl_cpu.data_dir),
              "--limit", "4"], verl_cpu.env, verl_cpu.workdir)
    evaluated = client.get_model_version(name, version.version)
    assert "eval.gsm8k.accuracy" in evaluated.tags
    assert "eval/gsm8k/accuracy" in {m.key for m in client.get_logged_model(model.model_id).metrics}


@pytest.mark.slow
def test_compare_with_a_local_run_of_the_same_recipe_differs_only_in_backend_keys(verl_cpu, client, capsys):
    verlflow(["train", "--recipe", "tiny", "--device", "cpu", "--data_dir", str(verl_cpu.data_dir),
              "--overrides", f"{RECIPE_OVERRIDES} {PROFILED}"], verl_cpu.env, verl_cpu.workdir)
    local = next(r for r in train_runs(verl_cpu.uri) if r.data.tags["verlflow.backend"] == "local")
    result = compare_runs(local.info.run_id, verl_cpu.run_id, str(verl_cpu.workdir / "compare"))
    printed = capsys.readouterr().out
    assert not result.recipes_differ and "RECIPES DIFFER" not in printed, [r.key for r in result.diff.recipe]
    assert {r.key: (r.baseline, r.candidate) for r in result.diff.launch}["tag verlflow.backend"] == ("local", "verl")
    curves = {r.key: r for r in result.parity}
    for name in ("critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean"):
        assert curves[name].passed is not None, name  # both runs have the curve under this name
    # both runs profiled step 2: a trace and a summary table each, side by side in the report
    for run_id in (local.info.run_id, verl_cpu.run_id):
        files = {Path(f.path).name for f in client.list_artifacts(run_id, "profile/step_2")}
        assert "summary.json" in files and any(f.endswith(".json.gz") for f in files), (run_id, files)
    assert "## Profiles: where a step's time goes" in result.report
    assert re.search(r"\| update_actor \| [\d,.]+ \| [\d,.]+ \| [\d.]+× \|", result.report), result.report[-3000:]
    assert "The operators that differ most" in result.report
