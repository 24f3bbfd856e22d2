"""The verl launch a user gets: forced keys, the bash script, the environment, Ray job spec and preflight.

Fast: composes configs in process and runs only bash; no verl subprocess.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from verlflow import config
from verlflow.backends.verl import command as verl_command
from verlflow.backends.verl import forced
from verlflow.backends.verl.backend import preflight
from verlflow.backends.verl.command import absolute_tracking_uri, build_plan
from verlflow.backends.verl.forced import FINAL_ONLY_SAVE_FREQ
from verlflow.backends.verl.launch import ray_job_spec, ray_submit_command
from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI, Probe
from verlflow.errors import VerlflowError
from verlflow.secrets import mask_env

RUN_ID = "0123456789abcdef0123456789abcdef"


def _plan(profile: str, tmp_path: Path, overrides: str = "", uri: str = "sqlite:///mlflow.db"):
    extra = {"data.train_files": "data/gsm8k/train.parquet", "data.val_files": "data/gsm8k/test.parquet"}
    cfg = config.compose("qwen3-4b-gsm8k-grpo", profile, f"verlflow.output_dir={tmp_path} {overrides}", extra=extra)
    return cfg, build_plan(cfg, run_id=RUN_ID, experiment_name="gsm8k grpo", run_name="a3-run/1", tracking_uri=uri)


@pytest.fixture(scope="module")
def a3(tmp_path_factory):
    return _plan("a3", tmp_path_factory.mktemp("a3"))


def test_a3_launch_keeps_the_guide_and_forces_what_verlflow_needs(a3):
    cfg, plan = a3
    o = plan.overrides
    assert o["trainer.n_gpus_per_node"] == 16 and o["trainer.device"] == "npu"
    assert o["trainer.logger"] == ["console", "tensorboard", "mlflow"]
    assert o["trainer.save_freq"] == FINAL_ONLY_SAVE_FREQ
    assert o["trainer.use_v1"] is False  # transfer_queue is not installed here
    # Exactly the MLflow names: verl 0.5's logger sets the experiment by this name before attaching.
    assert (o["trainer.project_name"], o["trainer.experiment_name"]) == ("gsm8k grpo", "a3-run/1")
    assert "\"trainer.project_name='gsm8k grpo'\"" in plan.command_text()
    assert o["trainer.default_local_dir"] == str(plan.run_dir / "checkpoints")
    assert plan.run_dir.name == RUN_ID
    assert Path(o["data.train_files"]).is_absolute() and o["data.train_files"].endswith("data/gsm8k/train.parquet")
    assert plan.env["TASK_QUEUE_ENABLE"] == "2" and plan.env["CPU_AFFINITY_CONF"] == "1"
    assert plan.env["TENSORBOARD_DIR"] == str(plan.run_dir / "tensorboard")
    assert plan.attach_env["MLFLOW_RUN_ID"] == RUN_ID
    assert plan.attach_env["MLFLOW_TRACKING_URI"] == f"sqlite:///{Path('mlflow.db').resolve()}"
    # The recipe's own values are untouched.
    assert o["actor_rollout_ref.actor.optim.lr"] == 5e-7 and o["actor_rollout_ref.rollout.n"] == 5
    # Every forced key is one that the installed verl accepts.
    config.validate_against_verl(o)


def test_rollout_traces_go_to_mlflow_a_few_per_step_unless_turned_off(a3, tmp_path):
    _, plan = a3
    trace = "actor_rollout_ref.rollout.trace"
    assert plan.overrides[f"{trace}.backend"] == "mlflow" and plan.overrides[f"{trace}.token2text"] is True
    assert plan.overrides[f"{trace}.max_samples_per_step_per_worker"] == forced.DEFAULT_TRACED_SAMPLES
    _, off = _plan("a3", tmp_path, "verlflow.rollout_traces=0")
    assert not any(key.startswith(trace) for key in off.overrides)
    _, own = _plan("h20", tmp_path, f"{trace}.backend=weave")  # the user's choice of tracer stands
    assert own.overrides[f"{trace}.backend"] == "weave" and f"{trace}.token2text" not in own.overrides
    with pytest.raises(VerlflowError, match=r"verlflow.rollout_traces=-1 must be an integer >= 0"):
        _plan("a3", tmp_path, "verlflow.rollout_traces=-1")


def test_a_positive_save_freq_and_an_explicit_checkpoint_folder_are_kept(tmp_path):
    _, plan = _plan("h20", tmp_path, "trainer.save_freq=50 trainer.default_local_dir=ckpts trainer.logger=[console]")
    assert plan.overrides["trainer.save_freq"] == 50
    assert plan.overrides["trainer.default_local_dir"] == str(Path("ckpts").resolve())
    assert plan.overrides["trainer.logger"] == ["console", "mlflow"]
    assert "TENSORBOARD_DIR" not in plan.env


@pytest.mark.parametrize(("uri", "expected"), [
    ("sqlite:///mlflow.db", f"sqlite:///{Path('mlflow.db').resolve()}"),
    ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),
    ("./mlruns", Path("mlruns").resolve().as_uri()),
    ("http://user:pw@host:5000", "http://user:pw@host:5000"),
])
def test_tracking_uri_is_made_absolute_for_verl(uri, expected):
    assert absolute_tracking_uri(uri) == expected


def test_command_txt_holds_the_launch_and_masks_credentials(tmp_path):
    _, plan = _plan("a3", tmp_path, uri="http://alice:s3cret@mlflow.example:5000")
    text = plan.command_text()
    assert "s3cret" not in text and "http://***@mlflow.example:5000" in text
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in text
    assert "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2" in text
    assert "-m verl.trainer.main_ppo" in text and "trainer.n_gpus_per_node=16" in text
    # The script part is valid bash.
    subprocess.run(["bash", "-n", "-c", plan.script()], check=True)


def test_the_script_sources_and_preloads_only_what_exists(tmp_path):
    _, plan = _plan("a3", tmp_path)
    present = tmp_path / "set_env.sh"
    present.write_text("export FROM_SOURCE=yes\n")
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                            "/lib/aarch64-linux-gnu/libm.so.6", "/lib64/libm.so.6") if Path(p).is_file())
    plan.source_files = [str(present), str(tmp_path / "absent.sh")]
    plan.preload = [libm, str(tmp_path / "libjemalloc.so.2")]
    probe = ["bash", "-c", "echo SRC=$FROM_SOURCE TQ=$TASK_QUEUE_ENABLE LD=$LD_PRELOAD"]
    done = subprocess.run(["bash", "-c", plan.script(probe)], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert f"SRC=yes TQ=2 LD={libm}" in done.stdout
    assert f"{tmp_path / 'absent.sh'} not found, not sourced" in done.stderr
    assert verl_command.JEMALLOC_MISSING_LINE in done.stderr


def test_ray_job_carries_the_run_and_profile_env_to_every_worker(a3):
    _, plan = a3
    spec = ray_job_spec(plan, run_id=RUN_ID)
    env = spec["runtime_env"]["env_vars"]
    assert env["MLFLOW_RUN_ID"] == RUN_ID and env["MLFLOW_TRACKING_URI"].startswith("sqlite:////")
    assert env["TASK_QUEUE_ENABLE"] == "2" and env["VLLM_USE_V1"] == "1"
    assert spec["submission_id"] == f"verlflow-{RUN_ID}"
    inner = shlex.split(spec["entrypoint"])
    assert inner[:2] == ["bash", "-c"] and "exec python3 -m verl.trainer.main_ppo" in inner[2]
    line = shlex.split(ray_submit_command(spec, "http://head:8265", mask=mask_env))
    assert line[:3] == ["ray", "job", "submit"] and line[line.index("--address") + 1] == "http://head:8265"
    assert json.loads(line[line.index("--runtime-env-json") + 1])["env_vars"]["MLFLOW_RUN_ID"] == RUN_ID
    assert line[line.index("--") + 1:] == inner


def test_launch_module_must_be_a_module_or_an_existing_file():
    assert verl_command.launch_module_of({}) == "verl.trainer.main_ppo"
    with pytest.raises(VerlflowError, match="is not a file"):
        verl_command.launch_module_of({"launch_module": "nowhere/standin.py"})
    with pytest.raises(VerlflowError, match="neither a module"):
        verl_command.launch_module_of({"launch_module": "rm -rf /"})


def _fixture(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "device" / name).read_text()


def test_preflight_passes_on_an_a3_node_and_names_what_is_missing(a3, fixtures_dir, tmp_path):
    cfg, plan = a3
    missing = str(tmp_path / "train.parquet")
    plan = replace(plan, overrides={**plan.overrides, "data.train_files": missing, "data.val_files": __file__})
    a3_smi = {" ".join(NPU_SMI_INFO): _fixture(fixtures_dir, "npu-smi-info-a3-16chip.txt")}
    with pytest.raises(VerlflowError, match=r"data.train_files .*train.parquet not found"):
        preflight(cfg, plan, probe=Probe.recorded(a3_smi, modules=["torch_npu"]), environ={})
    plan = replace(plan, overrides={**plan.overrides, "data.train_files": __file__})
    preflight(cfg, plan, probe=Probe.recorded(a3_smi, modules=["torch_npu"]), environ={})
    with pytest.raises(VerlflowError, match=r"^no NPU is visible on this machine \(torch_npu not installed\)"):
        preflight(cfg, plan, probe=Probe.recorded(a3_smi), environ={})
    # A failing npu-smi is shown with its own first error line, not as "no NPU".
    said = _fixture(fixtures_dir, "npu-smi-info-fail-8020-device-used.txt")
    busy = {" ".join(NPU_SMI_INFO): "".join(ln for ln in said.splitlines(True) if not ln.startswith("# source:"))}
    with pytest.raises(VerlflowError, match=r"^no NPU is visible here \(npu-smi info: dcmi model initialized "
                                             r"failed, because the device is used\. ret is -8020\)"):
        preflight(cfg, plan, probe=Probe.recorded(failing=busy, modules=["torch_npu"]), environ={})
    with pytest.raises(VerlflowError, match=r"trainer.n_gpus_per_node=16 but only 4 NPU"):
        preflight(cfg, plan, probe=Probe.recorded(a3_smi, modules=["torch_npu"]),
                  environ={"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3"})


def test_preflight_on_a_gpu_profile(fixtures_dir, tmp_path):
    cfg, plan = _plan("h20", tmp_path)
    table = {" ".join(NVIDIA_SMI): _fixture(fixtures_dir, "nvidia-smi-table-h20-535.txt")}
    with pytest.raises(VerlflowError, match=r"^no CUDA GPU is visible here \(nvidia-smi not found on PATH\)"):
        preflight(cfg, plan, probe=Probe.recorded(torch_cuda="12.6"), environ={})
    with pytest.raises(VerlflowError, match="torch here is a CPU build"):
        preflight(cfg, plan, probe=Probe.recorded(table), environ={})
    with pytest.raises(VerlflowError, match=r"n_gpus_per_node=8 but only 3 CUDA GPU"):
        preflight(cfg, plan, probe=Probe.recorded(table, torch_cuda="12.6"), environ={})


@pytest.mark.parametrize(("profile", "tool"), [("a3", "npu"), ("h20", "torch"), ("cpu-verl", "torch")])
def test_profile_steps_turn_on_verls_profiler_with_the_tool_of_the_device(tmp_path, profile, tool):
    _, plan = _plan(profile, tmp_path, "verlflow.profile_steps=[2,5]")
    o = plan.overrides
    assert (o["global_profiler.tool"], o["global_profiler.steps"]) == (tool, [2, 5])
    assert o["global_profiler.save_path"] == str(plan.run_dir / "profile")
    assert o["actor_rollout_ref.actor.profiler.enable"] is True and o["actor_rollout_ref.ref.profiler.enable"] is True
    config.validate_against_verl(o)


def test_an_explicit_profiler_tool_stands_and_no_steps_means_no_profiler(a3, tmp_path):
    _, own = _plan("h20", tmp_path, "verlflow.profile_steps=[2] global_profiler.tool=nsys")
    assert own.overrides["global_profiler.tool"] == "nsys"
    assert not any(k.startswith("global_profiler") or ".profiler." in k for k in a3[1].overrides)


def test_deterministic_turns_on_verls_full_determinism(a3, tmp_path):
    _, plan = _plan("h20", tmp_path, "verlflow.deterministic=true")
    assert all(plan.overrides[key] is True for key in forced.DETERMINISM_KEYS)
    config.validate_against_verl(plan.overrides)
    assert not any(key in a3[1].overrides for key in forced.DETERMINISM_KEYS)
