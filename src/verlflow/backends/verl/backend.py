"""The verl backend: the guide's recipe on an A3 (NPU) or H20 (GPU) node, inside our MLflow run.

    mlflow run . --env-manager local -e train -P device=npu -P dry_run=true   # compose, validate, log, print
    mlflow run . --env-manager local -e train -P device=npu                   # launch verl on this A3 node
    mlflow run . --env-manager local -e train -P device=gpu -P ray_address=http://head:8265

:func:`train_verl` reads top to bottom: plan the launch (:mod:`.command`), validate it against the
installed verl, log what we own (tags, ``device_profile.json``, ``config/resolved.yaml``,
``config/command.txt``), refuse a missing device (preflight), launch (:mod:`.launch`; its output read by
:mod:`.output_watch` for the line that says why it failed), summarise,
merge the last checkpoint into a Hugging Face folder (:mod:`.merge`) and tag it
``verlflow.checkpoint_dir`` for the registry.

We log **no params**: verl's MLflow logger logs the whole resolved config itself and silently stops
logging to MLflow when a key already exists with another value.

Recipe ``verlflow:`` keys read here (set on the command line as ``-P overrides="verlflow.<key>=…"``):

- ``launch_module``: module run instead of ``verl.trainer.main_ppo``, or a ``.py`` file (the tests' stand-in).
- ``skip_preflight``: ``true`` launches without checking for NPUs/GPUs, data files and the model folder
  (a stand-in needs no device; also the way around a detection that is wrong on some machine).
- ``system_metrics_interval``: also the interval of the per-node samplers a multi-node launch on a Ray
  cluster, or any Ray job, gets (:mod:`.node_sampler`: ``system/<node>/*`` from every node, stopped when verl
  ends; a Ray job starts them from its own entrypoint on the head).
- ``output_dir``: root of the per-run folders (default ``outputs/verl``; ``<root>/<run id>/``).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from verlflow import config, secrets, stopping
from verlflow.backends.train_setup import node_hint
from verlflow.backends.verl import command as verl_command
from verlflow.backends.verl import forced
from verlflow.backends.verl import launch as verl_launch
from verlflow.backends.verl import merge as verl_merge
from verlflow.backends.verl import node_sampler as verl_node_sampler
from verlflow.backends.verl import resume as verl_resume
from verlflow.backends.verl import traces as verl_traces
from verlflow.backends.verl.command import LaunchPlan
from verlflow.backends.verl.dryrun import preflight as verl_preflight
from verlflow.backends.verl.output_watch import OutputWatch
from verlflow.backends.writable import out_of_space_advice
from verlflow.config import config_count_problems
from verlflow.device import detect as device
from verlflow.device import system_metrics
from verlflow.errors import Problem, VerlflowError, raise_problems
from verlflow.names import (
    ATTEMPT_TAG,
    CHECKPOINT_DIR_TAG,
    CHECKPOINT_SOURCE_TAG,
    DETERMINISTIC_TAG,
    DEVICE_PROFILE_HOST_TAG,
    DRY_RUN_TAG,
    EXIT_CODE_TAG,
    JEMALLOC_TAG,
    LAUNCHER_TAG,
    PREFLIGHT_TAG,
    RAY_JOB_ID_TAG,
    ROLLOUT_TRACES_TAG,
    VALIDATED_TAG,
    VERL_ERROR_TAG,
)
from verlflow.secrets import mask_env
from verlflow.tracking import lookups, tracking, writes


@dataclass
class VerlTrainResult:
    """What one verl train step did."""

    run_id: str
    dry_run: bool
    # config/command.txt: the exact launch (or what a dry run would launch).
    command: str
    # verl's exit status (0 = success); None for a dry run.
    returncode: int | None
    # <output root>/<run id>: checkpoints/, hf/, tensorboard/, verl.log.
    run_dir: str
    # The merged Hugging Face folder (tag verlflow.checkpoint_dir); None for a dry run.
    checkpoint_dir: str | None
    # The Ray job's submission id when launched with ray_address.
    ray_job_id: str | None = None


def preflight(cfg: config.ComposedConfig, plan: LaunchPlan, *, probe: device.Probe | None = None,
              environ: dict[str, str] | None = None) -> None:
    """Refuse, in one line, a launch that cannot work here: no device, too few devices, missing data/model.

    An accelerator needs its platform's torch extension installed (torch_npu), devices listed by its lister
    (npu-smi, nvidia-smi) and, on CUDA, a CUDA build of torch. ``probe``/``environ`` let tests describe a machine.
    """
    probe = probe or device.Probe()
    dev = cfg.profile.device
    platform = dev.platform
    word, hint = dev.word, f"{node_hint(cfg.profile)} or pass -P dry_run=true"
    if not dev.is_accelerator:
        # verl's own trainer on the CPU (cpu-verl profile): no device to look for, only verl and the plugin.
        from verlflow.backends.verl import cpu as verl_cpu

        verl_cpu.check_cpu_launch(plan.env)
        return
    if absent := device.absence(dev, probe=probe, environ=environ):
        raise VerlflowError(f"{absent}; {hint}")
    visible = device.count_visible(dev, probe=probe, environ=environ)
    if platform.needs_cuda_torch and probe.torch_cuda() is None:
        raise VerlflowError(f"torch here is a CPU build (torch.version.cuda is None): install a CUDA torch; {hint}")
    wanted = int(plan.overrides.get("trainer.n_gpus_per_node", config.verl_defaults()["trainer.n_gpus_per_node"]))
    nodes = int(plan.overrides.get("trainer.nnodes", 1))
    if nodes == 1 and visible < wanted:
        raise VerlflowError(
            f"trainer.n_gpus_per_node={wanted} but only {visible} {word}(s) are visible here: pass "
            f"-P overrides=\"trainer.n_gpus_per_node={visible}\" or run on a full node")
    for key in ("data.train_files", "data.val_files"):
        for path in _paths(plan.overrides.get(key)):
            if "://" not in path and not Path(path).is_file():
                from verlflow.data.fix_commands import preprocess_command

                raise VerlflowError(f"{key} {path} not found: run `{preprocess_command('', Path(path).parent)}` "
                                    "or pass -P data_dir=<folder with train.parquet and test.parquet>")
    model = str(plan.overrides.get("actor_rollout_ref.model.path", ""))
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise VerlflowError(f"model folder {model} not found: pass -P model=<a Hugging Face folder or hub id>")


def check_launch(cfg: config.ComposedConfig, plan: LaunchPlan, resolved, *, check_device: bool,
                 check_files: bool = True) -> None:
    """Run :mod:`.preflight` (and :func:`preflight` for the device) and report every problem at once."""
    if not cfg.profile.device.is_accelerator:
        # The launched verl loads the CPU plugin (its ``hf`` rollout among others): check against that verl.
        importlib.import_module("verlflow.backends.verl.cpu_plugin")
        verl_preflight.verl_names.cache_clear()
    device_name = cfg.profile.device if cfg.verlflow.launch_module == verl_command.DEFAULT_LAUNCH_MODULE else None
    launch_env = {key: value for key, value in {**os.environ, **plan.env}.items()
                  if key in ("VERL_USE_EXTERNAL_MODULES", "PYTHONPATH")}  # the user's modules verl imports
    problems, notes = verl_preflight.launch_problems(resolved, check_files=check_files, device=device_name,
                                                     stack=cfg.profile.stack, launch_env=launch_env)
    named = {problem.key for problem in problems}
    problems += [p for p in config_count_problems(resolved) if p.key not in named]
    if check_device:
        try:
            preflight(cfg, plan)
        except VerlflowError as exc:
            problems.append(Problem("device", cfg.profile.device, str(exc)))
    if cfg.profile.device.is_accelerator:  # the CPU plugin hides TRL from verl; NPU/GPU launches would crash on it
        from verlflow.backends.verl.cpu import incompatible_trl

        trl = incompatible_trl()
        if trl:
            problems.append(Problem("trl", "installed", trl))
    for note in notes:
        print(f"verlflow: {note}")
    raise_problems(problems, "the verl launch")


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def record_launch(cfg: config.ComposedConfig, plan: LaunchPlan, resolved, *, dry_run: bool,
                  ray_address: str, command: str) -> None:
    """Log what the run owns before anything launches: tags, device profile, resolved config, command."""
    # The env knobs verl runs with are the profile's, exported by the launch script, not ours.
    profile = device.collect_device_profile(cfg.profile.device, environ={**os.environ, **plan.env},
                                             profile=cfg.profile)
    tracking.log_device_profile(profile)
    tags = {
        DRY_RUN_TAG: str(dry_run).lower(),
        LAUNCHER_TAG: f"ray:{ray_address}" if ray_address else "local",
        "verlflow.launch_module": plan.launch_module,
        "verlflow.output_dir": str(plan.run_dir),
        # verl's determinism switches on (verlflow.deterministic=true), as compare reads it
        DETERMINISTIC_TAG: str(any(plan.overrides.get(k) is True for k in forced.DETERMINISM_KEYS)).lower(),
    }
    if ray_address:
        tags[DEVICE_PROFILE_HOST_TAG] = "the submitting host, not the Ray cluster"
    jemalloc = [lib for lib in plan.preload if verl_command.is_jemalloc(lib)]
    if jemalloc and not ray_address:
        tags[JEMALLOC_TAG] = "missing" if set(jemalloc) & set(verl_command.missing_preloads(plan)) else "enabled"
    writes.set_tags(tags)
    writes.log_text(OmegaConf.to_yaml(config.loggable_tree(resolved, plan.overrides)), "config/resolved.yaml")
    writes.log_text(command, "config/command.txt")


def _print_plan(plan: LaunchPlan, *, ray_address: str) -> None:
    for note in plan.notes:
        print(f"verlflow: {note}")
    if not ray_address:
        for lib in verl_command.missing_preloads(plan):
            print(verl_command.JEMALLOC_MISSING_LINE if verl_command.is_jemalloc(lib)
                  else f"verlflow: {lib} not found, not preloaded")


def train_verl(
    cfg: config.ComposedConfig,
    *,
    run_id: str,
    dry_run: bool,
    ray_address: str,
    started_at: float,
    resume_in_job: bool = False,
) -> VerlTrainResult:
    """Train ``cfg`` with verl inside the active MLflow run ``run_id`` (see the module docstring).

    ``resume_in_job``: a resumed run launched as a Ray job, whose entrypoint chooses the checkpoint to continue
    from on the cluster (a local launch is pointed at it before this is called).
    A failed launch raises :class:`VerlflowError` (run FAILED), a signal :class:`RunInterrupted` (KILLED).
    """
    plan, spec, command, resolved = _prepare_launch(cfg, run_id, dry_run=dry_run, ray_address=ray_address,
                                                    resume_in_job=resume_in_job)
    if dry_run:
        # verl's own Hydra config composed the launch's exact override words in-process (the launch's main_ppo
        # composes them again, the authority); bash must hand main_ppo those words unchanged.
        verl_launch.check_shell_words(plan.argv())
        writes.log_dict(config.loggable_tree(resolved, plan.overrides), "config/verl_job.yaml")
        writes.set_tag(VALIDATED_TAG, "verl's Hydra config (ppo_trainer), composed in-process")
        print("verlflow: dry run: verl's config composes this command line; not launched:\n")
        print(command)
        return VerlTrainResult(run_id=run_id, dry_run=True, command=command, returncode=None,
                               run_dir=str(plan.run_dir), checkpoint_dir=None)
    last = None if spec else verl_resume.trained_through(plan.checkpoint_dir, resolved.trainer.total_training_steps)
    if last is not None:  # a resumed run whose every step reached it before it stopped: only its end is left
        print(f"verlflow: resume: every step up to {last} is in the run already; verl is not launched again",
              flush=True)
        rc = 0
    else:
        nodes_at = verl_node_sampler.sampler_address(ray_address, plan.overrides.get("trainer.nnodes", 1))
        with verl_node_sampler.sampling_nodes(run_id, address=nodes_at, tracking_uri=lookups.tracking_uri(),
                                              interval_s=system_metrics.sampling_interval(cfg.verlflow)):
            try:
                rc = _launch(plan, run_id, spec=spec, ray_address=ray_address)
            except KeyboardInterrupt:  # the stop line names the checkpoint a resume continues after (not a Ray job's)
                if not spec:
                    stopping.tell_stand(verl_resume.stop_stand(run_id, plan.checkpoint_dir))
                raise
    tracking.log_run_summaries(run_id, started_at)
    if "global_profiler.save_path" in plan.overrides:  # verlflow.profile_steps: verl's traces, by step
        from verlflow.tracking.profiling import log_profile_folder

        log_profile_folder(plan.overrides["global_profiler.save_path"], plan.overrides.get("global_profiler.steps", ()))
    tensorboard = plan.env.get("TENSORBOARD_DIR")
    if tensorboard and Path(tensorboard).is_dir():
        writes.log_folder(tensorboard, "logs/tensorboard")
    hf_dir = _merge_final_checkpoint(plan, run_id)
    return VerlTrainResult(run_id=run_id, dry_run=False, command=command, returncode=rc, run_dir=str(plan.run_dir),
                           checkpoint_dir=str(hf_dir), ray_job_id=spec["submission_id"] if spec else None)


def _prepare_launch(cfg: config.ComposedConfig, run_id: str, *, dry_run: bool,
                    ray_address: str, resume_in_job: bool = False) -> tuple[LaunchPlan, dict | None, str, Any]:
    """Plan the launch, validate it with verl, log it, and refuse it when it cannot work here.

    Returns the plan, the Ray job spec (None for a local launch), the command text a user could rerun and
    verl's resolved config of that command line.
    """
    run = lookups.run_by_id(run_id)
    experiment = lookups.experiment_name(run.info.experiment_id)
    plan = verl_command.build_plan(cfg, run_id=run_id, experiment_name=experiment, run_name=run.info.run_name or "",
                                   tracking_uri=lookups.tracking_uri())
    # The forced keys are validated too: verl composes exactly what will be launched.
    resolved = config.validate_against_verl(plan.overrides)
    spec = None
    if ray_address:
        # The cluster's nodes are sampled by the job itself (node_sampler.job_sampler_line), as often as this host.
        spec = verl_launch.ray_job_spec(plan, run_id=run_id, attempt=_attempt(run), resume=resume_in_job,
                                        sample_interval_s=system_metrics.sampling_interval(cfg.verlflow))
    ray_line = verl_launch.ray_submit_command(spec, ray_address, mask=mask_env) if spec else None
    command = plan.command_text(ray_command=ray_line)
    record_launch(cfg, plan, resolved, dry_run=dry_run, ray_address=ray_address, command=command)
    _print_plan(plan, ray_address=ray_address)
    skip_preflight = cfg.verlflow.skip_preflight
    if ray_address and not skip_preflight:
        print("verlflow: Ray job: the model and data paths are the cluster's; they are not checked from here")
    check_launch(cfg, plan, resolved, check_device=not (dry_run or ray_address or skip_preflight),
                 check_files=not (skip_preflight or ray_address))
    if not dry_run:
        if ray_address:
            writes.set_tag(PREFLIGHT_TAG, "not run (Ray job: the devices are the cluster's)")
        elif skip_preflight:
            writes.set_tag(PREFLIGHT_TAG, "skipped (verlflow.skip_preflight)")
        else:
            writes.set_tag(PREFLIGHT_TAG, "passed")
    return plan, spec, command, resolved


def _attempt(run) -> int:
    """The attempt of ``run`` now starting (tag ``verlflow.attempt``, set when the attempt began); 1 if untold."""
    try:
        return int(json.loads(run.data.tags.get(ATTEMPT_TAG, ""))["attempt"])
    except (ValueError, KeyError, TypeError):
        return 1


def _launch(plan: LaunchPlan, run_id: str, *, spec: dict | None, ray_address: str) -> int:
    """Run verl (locally, or as the Ray job ``spec`` at ``ray_address``) and keep its log and traces with the run.

    Returns verl's exit status (0); a non-zero one raises :class:`VerlflowError` with verl's last error line.
    """
    log_path = plan.run_dir / "verl.log"
    watch = OutputWatch(run_id)
    print(f"verlflow: launching verl for run {run_id}; output in {log_path}", flush=True)
    launched_ms = int(time.time() * 1000)
    try:
        if spec is not None:
            writes.set_tag(RAY_JOB_ID_TAG, spec["submission_id"])
            rc = verl_launch.run_ray_job(spec, ray_address, log_path, on_line=watch)
        else:
            rc = verl_launch.run_local(plan, log_path, on_line=watch)
    finally:
        if log_path.is_file():
            writes.log_file(str(log_path), "logs")
        if plan.overrides.get(f"{forced.TRACE}.backend") == "mlflow":
            linked = verl_traces.link_rollout_traces(run_id, since_ms=launched_ms)
            writes.set_tag(ROLLOUT_TRACES_TAG, str(linked))
    writes.set_tag(EXIT_CODE_TAG, str(rc))
    if rc != 0:
        writes.set_tag(VERL_ERROR_TAG, secrets.mask_text(watch.reason()))
        space = out_of_space_advice(watch.reason(), plan.checkpoint_dir)
        raise VerlflowError(f"verl exited with status {rc}: {watch.reason()}{f'; {space}' if space else ''} "
                            "(full output: logs/verl.log)")
    return rc


def _merge_final_checkpoint(plan: LaunchPlan, run_id: str) -> Path:
    """verl's last actor checkpoint → the run's Hugging Face folder (tagged), with the merger's log kept,
    logged as the run's MLflow model at the checkpoint's step."""
    from verlflow.backends.layout import step_of
    from verlflow.outage import logged_models

    actor = verl_merge.last_actor_checkpoint(plan.checkpoint_dir)
    merge_log = plan.run_dir / "merge.log"
    try:
        hf_dir = verl_merge.merge_actor_checkpoint(actor, plan.hf_dir, log_path=merge_log).resolve()
    finally:
        if merge_log.is_file():
            writes.log_file(str(merge_log), "logs")
    from verlflow.models.checkpoint_record import record_digest

    record_digest(run_id, hf_dir, writes.log_params)
    writes.set_tags({CHECKPOINT_DIR_TAG: str(hf_dir), CHECKPOINT_SOURCE_TAG: str(actor)})
    print(f"verlflow: final checkpoint {actor} merged into {hf_dir}")
    logged_models.record_final_model(run_id, hf_dir, step_of(actor.parent))
    return hf_dir


__all__ = ["VerlTrainResult", "train_verl", "preflight", "check_launch", "record_launch"]
