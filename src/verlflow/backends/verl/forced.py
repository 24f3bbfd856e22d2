"""The keys verlflow forces on every verl launch, each with the note that says why.

:func:`forced_overrides` takes the composed overrides (recipe < profile < overrides) and returns what verl is
launched with, plus one line per forced key for the console and ``config/command.txt``
(:mod:`verlflow.backends.verl.command` builds the rest of the launch around it):

- ``trainer.logger`` keeps the profile's loggers (console, tensorboard, …) and always gains ``mlflow``;
  verl's own MLflow logger then writes into *our* run, because ``MLFLOW_RUN_ID`` and an absolute
  ``MLFLOW_TRACKING_URI`` are put in its environment.
- ``trainer.project_name`` / ``trainer.experiment_name`` are the MLflow experiment and run names, *exactly*
  (always Hydra-quoted, whatever they hold: quotes, a trailing ``\\``, ``=``, ``,``, ``$``, ``${…}``): verl
  0.5's logger calls ``mlflow.set_experiment(project_name)`` before ``start_run`` picks up ``MLFLOW_RUN_ID``,
  and MLflow refuses a run whose experiment differs from the active one; a cleaned-up name would name another
  experiment.
- ``trainer.save_freq``: verl saves only when ``save_freq > 0 and (is_last_step or step % save_freq == 0)``
  (``ray_trainer.py`` / ``v1/trainer_base.py``), so the guide's ``-1`` saves nothing. A non-positive value
  becomes :data:`FINAL_ONLY_SAVE_FREQ`, larger than any run's step count: the last step, and only it, saves.
- ``trainer.default_local_dir`` is ``<run folder>/checkpoints`` unless the overrides name one.
- ``trainer.use_v1=False`` where the installed verl has that key (>= 0.9), whatever is installed, unless the
  overrides ask for V1 (kept only when the ``transfer_queue`` package it imports is installed).
- Local data, model and reward-function paths become absolute: verl runs with the run folder as working
  directory.
- ``actor_rollout_ref.rollout.trace.*``: verl's own rollout traces go to MLflow (``backend=mlflow``,
  ``token2text``), a few samples per step and agent-loop worker (the recipe's ``verlflow.rollout_traces``,
  default :data:`DEFAULT_TRACED_SAMPLES`, 0 = off), where the installed verl can sample them (>= 0.9: a verl
  without ``max_samples_per_step_per_worker`` would trace every rollout). Its tracer calls
  ``mlflow.set_experiment(project_name)`` too, so the exact project name puts the traces in the run's
  experiment; :mod:`verlflow.backends.verl.traces` links them to the run afterwards.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from verlflow import config
from verlflow.config import Device, LiteralText, VerlflowBlock
from verlflow.errors import VerlflowError

# verl saves at step % save_freq == 0 or on the last step: a period no run reaches leaves only the last step.
FINAL_ONLY_SAVE_FREQ = 1_000_000_000
REQUIRED_LOGGERS = ("console", "mlflow")


def transfer_queue_installed() -> bool:
    """Whether the package verl's V1 trainer needs (``import transfer_queue``) is installed."""
    return importlib.util.find_spec("transfer_queue") is not None


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.strip("[]").replace("'", "").replace('"', "").split(",") if v.strip()]
    return [str(v) for v in value]


def absolute_path(value: Any) -> Any:
    """A relative local path made absolute; lists element-wise; URLs (hdfs://, s3://) untouched."""
    if isinstance(value, (list, tuple)):
        return [absolute_path(v) for v in value]
    if not isinstance(value, str) or not value or "://" in value or value.startswith(("/", "${")):
        return value
    return str(Path(value).expanduser().resolve())


def _model_path(value: Any) -> Any:
    """The model path verl gets: a tiny-model sentinel built, an existing relative folder absolute."""
    from verlflow.models import model_path

    if value in model_path.SENTINELS:
        return model_path.resolve_model_path(value)
    if isinstance(value, str) and value and not value.startswith("/") and Path(value).expanduser().is_dir():
        return str(Path(value).expanduser().resolve())
    return value


# The reward function's file, read by verl from the run folder: made absolute like the data files.
REWARD_FILE_KEYS = ("custom_reward_function.path", "reward.custom_reward_function.path")
TRACE = "actor_rollout_ref.rollout.trace"
# Rollouts traced per training step and agent-loop worker unless the recipe says otherwise.
DEFAULT_TRACED_SAMPLES = VerlflowBlock.rollout_traces


def traced_samples(block: dict[str, Any]) -> int:
    """The recipe's ``verlflow.rollout_traces`` (samples traced per step and worker; 0 = off), checked."""
    raw = block.get("rollout_traces", DEFAULT_TRACED_SAMPLES)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise VerlflowError(f"verlflow.rollout_traces={raw!r} must be an integer >= 0 (samples traced per step "
                            f"and worker; 0 = off)")
    return raw


# verl's profiler tool for a device (verlflow.profile_steps) is its platform's profiler_tool: Ascend's profiler on an
# NPU, torch's elsewhere (its Chrome traces summarize the same way on every device; pass global_profiler.tool=nsys
# for Nsight on a GPU).
# The workers whose stages verl profiles (the rollout's engine has its own profiler settings).
PROFILED_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref")
# verl's npu tool: record NPU activity beside the CPU's and parse each rank's collection into its
# ascend_pytorch_profiler_<rank>.db (verl exports only the database), which verlflow.tracking.ascend_profile reads.
NPU_TOOL_CONFIG = {"profiler.tool_config.npu.contents": ["npu", "cpu"], "profiler.tool_config.npu.analysis": True}


def profiler_overrides(overrides: dict[str, Any], steps: tuple[int, ...], device: str, run_dir: Path,
                       defaults: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """verl's ``global_profiler`` for ``verlflow.profile_steps``: tool, steps, save path, the workers' switches."""
    if not steps:
        return {}, []
    if "global_profiler.steps" not in defaults:
        return {}, ["verlflow.profile_steps: this verl has no global_profiler (verl >= 0.6): steps not profiled"]
    tool = overrides.get("global_profiler.tool") or Device(device).platform.profiler_tool
    out: dict[str, Any] = {"global_profiler.tool": tool, "global_profiler.steps": list(steps),
                           "global_profiler.save_path": str(run_dir / "profile")}
    for role in PROFILED_ROLES:
        if f"{role}.profiler.enable" in defaults:
            out[f"{role}.profiler.enable"] = True
            out[f"{role}.profiler.all_ranks"] = True
        if tool == Device.NPU.platform.profiler_tool:  # NPU activity too (verl records only the CPU's), into the .db
            out.update({f"{role}.{k}": v for k, v in NPU_TOOL_CONFIG.items() if f"{role}.{k}" in defaults})
    return out, [f"global_profiler.tool={tool} steps={list(steps)}: verlflow.profile_steps, traces logged under "
                 "profile/step_<N>/"]


# verl's own determinism switches (verl >= 0.9), set by verlflow.deterministic=true: deterministic FSDP kernels
# and a batch-invariant, seeded rollout (main_ppo exports VERL_FULL_DETERMINISM to every worker).
DETERMINISM_KEYS = ("actor_rollout_ref.actor.fsdp_config.full_determinism",
                    "actor_rollout_ref.ref.fsdp_config.full_determinism",
                    "actor_rollout_ref.rollout.full_determinism")


def forced_overrides(
    overrides: dict[str, Any], *, project: str, experiment: str, run_dir: Path, traces: int = 0,
    profile_steps: tuple[int, ...] = (), device: str = "", deterministic: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The overrides verl is launched with, and one note per key verlflow forced (see the module docstring)."""
    out = dict(overrides)
    notes: list[str] = []
    defaults = config.verl_defaults()

    notes += _force_tracking(out, overrides, project, experiment)
    notes += _force_checkpoints(out, defaults, run_dir)

    if "trainer.use_v1" in defaults and "trainer.use_v1" not in overrides:
        out["trainer.use_v1"] = False
        notes.append("trainer.use_v1=False: verl's classic trainer, as the guide ran it, so A3 and H20 runs compare")
    elif "trainer.use_v1" in defaults and not transfer_queue_installed() and out.get("trainer.use_v1") is not False:
        out["trainer.use_v1"] = False
        notes.append("trainer.use_v1=False: verl's V1 trainer needs the transfer_queue package, not installed")

    sampled = f"{TRACE}.max_samples_per_step_per_worker"
    if traces and sampled in defaults and f"{TRACE}.backend" not in overrides:
        out.update({f"{TRACE}.backend": "mlflow", f"{TRACE}.token2text": True, sampled: traces})
        notes.append(f"{TRACE}.backend=mlflow: verl traces {traces} rollout(s) per step and worker into this "
                     "run's experiment (verlflow.rollout_traces=0 turns it off)")

    if deterministic:
        present = [key for key in DETERMINISM_KEYS if key in defaults and key not in overrides]
        out.update(dict.fromkeys(present, True))
        notes.append(f"{', '.join(present)}=True: verlflow.deterministic=true" if present
                     else "verlflow.deterministic=true: this verl has no full_determinism keys (verl >= 0.9 has)")

    profiling, profiling_notes = profiler_overrides(overrides, tuple(profile_steps), device, run_dir, defaults)
    out.update({k: v for k, v in profiling.items() if k not in overrides or k == "global_profiler.tool"})
    notes += profiling_notes

    _absolute_files(out)
    return out, notes


def _force_tracking(out: dict[str, Any], overrides: dict[str, Any], project: str, experiment: str) -> list[str]:
    """verl's MLflow logger on, writing into this run's experiment and name (``out`` changed in place)."""
    notes: list[str] = []
    loggers = _as_list(out.get("trainer.logger", []))
    for name in REQUIRED_LOGGERS:
        if name not in loggers:
            loggers.append(name)
    if loggers != _as_list(overrides.get("trainer.logger")):
        notes.append(f"trainer.logger={loggers}: verl's MLflow logger writes into this run")
    out["trainer.logger"] = loggers

    out["trainer.project_name"] = LiteralText(project)
    out["trainer.experiment_name"] = LiteralText(experiment)
    notes.append("trainer.project_name / trainer.experiment_name: the MLflow experiment and run names")
    return notes


def _force_checkpoints(out: dict[str, Any], defaults: dict[str, Any], run_dir: Path) -> list[str]:
    """A final checkpoint saved, into this run's own folder unless one is given (``out`` changed in place)."""
    notes: list[str] = []
    save_freq = out.get("trainer.save_freq", defaults.get("trainer.save_freq", -1))
    if not isinstance(save_freq, int) or save_freq <= 0:
        out["trainer.save_freq"] = FINAL_ONLY_SAVE_FREQ
        notes.append(f"trainer.save_freq={FINAL_ONLY_SAVE_FREQ} (was {save_freq}): verl saves on the last step "
                     "only when save_freq > 0; this period saves the final checkpoint and nothing else, so a "
                     "stopped run cannot resume (set trainer.save_freq=<N> trainer.max_actor_ckpt_to_keep=<K>)")

    if "trainer.default_local_dir" not in out:
        out["trainer.default_local_dir"] = str(run_dir / "checkpoints")
        notes.append("trainer.default_local_dir: this run's block folder (a fresh folder never resumes an old run)")
    else:
        out["trainer.default_local_dir"] = absolute_path(out["trainer.default_local_dir"])
    return notes


def _absolute_files(out: dict[str, Any]) -> None:
    """Data, reward and model paths made absolute (verl's processes start in other folders)."""
    for key in ("data.train_files", "data.val_files", *REWARD_FILE_KEYS):
        if key in out:
            out[key] = absolute_path(out[key])
    if "actor_rollout_ref.model.path" in out:
        out["actor_rollout_ref.model.path"] = _model_path(out["actor_rollout_ref.model.path"])
