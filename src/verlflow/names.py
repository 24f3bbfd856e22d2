"""Metric and tag names in one place, and the glossary the README shows.

    python -m verlflow.names        # prints the glossary as a Markdown table

Names are verl's (``group/metric/stat``), sanitized as verl's MLflow logger sanitizes them (``@`` →
``_at_``), so local runs and verl runs on A3 or H20 sit side by side in the MLflow UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")

TIMING_PREFIX = "timing_s/"
TIMING_MEAN_PREFIX = "timing_s_mean/"
TIMING_E2E = "timing_s/e2e"

TIMING_STEP = "timing_s/step"
TIMING_GEN = "timing_s/gen"
TIMING_UPDATE_ACTOR = "timing_s/update_actor"
SCORE_MEAN = "critic/score/mean"
VAL_ACCURACY = "val-core/openai/gsm8k/reward/mean_at_1"
# verl 0.9.x's reward loop adds an ``acc`` entry to each response's extra info, and verl's validation then
# names its core metric after ``acc`` instead of ``reward`` (ray_trainer's ``core_var``).
VAL_ACCURACY_VERL09 = "val-core/openai/gsm8k/acc/mean_at_1"

# One name per meaning: verlflow's canonical name → the name each supported trainer logs it under (after
# MLflow's ``@`` → ``_at_``). Reward (critic/score/mean) and timing (timing_s/*) names are the same in
# every version (verl's ``marked_timer`` names); validation accuracy is not.
METRIC_NAMES_BY_VERSION: dict[str, dict[str, str]] = {
    VAL_ACCURACY: {"local": VAL_ACCURACY, "verl 0.5.0": VAL_ACCURACY, "verl 0.9": VAL_ACCURACY_VERL09},
    SCORE_MEAN: {"local": SCORE_MEAN, "verl 0.5.0": SCORE_MEAN, "verl 0.9": SCORE_MEAN},
    TIMING_STEP: {"local": TIMING_STEP, "verl 0.5.0": TIMING_STEP, "verl 0.9": TIMING_STEP},
    TIMING_GEN: {"local": TIMING_GEN, "verl 0.5.0": TIMING_GEN, "verl 0.9": TIMING_GEN},
    TIMING_UPDATE_ACTOR: {"local": TIMING_UPDATE_ACTOR, "verl 0.5.0": TIMING_UPDATE_ACTOR,
                          "verl 0.9": TIMING_UPDATE_ACTOR},
}


def _unsanitized(name: str) -> str:
    return name.replace("_at_", "@")


def canonical_metric(name: str) -> str:
    """verlflow's name for a metric logged as ``name`` by any supported trainer (``name`` if unmapped).

    Accepts both the logged (``mean_at_1``) and verl's raw (``mean@1``) spelling.
    """
    for canonical, by_version in METRIC_NAMES_BY_VERSION.items():
        for logged in (canonical, *by_version.values()):
            if name in (logged, _unsanitized(logged)):
                return canonical
    return name


def metric_names(name: str) -> tuple[str, ...]:
    """Every name the meaning of ``name`` is logged under, canonical first: what to look a metric up by."""
    canonical = canonical_metric(name)
    found = [canonical, *METRIC_NAMES_BY_VERSION.get(canonical, {}).values()]
    found += [_unsanitized(n) for n in found] + [name]
    return tuple(dict.fromkeys(found))


def find_metric(metrics: Mapping[str, float], name: str) -> float | None:
    """The value of ``name``'s meaning in ``metrics`` under whichever version's name it was logged."""
    return next((metrics[n] for n in metric_names(name) if n in metrics), None)


def canonical_metrics(metrics: Mapping[str, T]) -> dict[str, T]:
    """``metrics`` with every per-version name renamed to its canonical name (a canonical key wins)."""
    out: dict[str, T] = {}
    for key in sorted(metrics, key=lambda k: canonical_metric(k) != k):
        out.setdefault(canonical_metric(key), metrics[key])
    return out

EVAL_ACCURACY = "eval/gsm8k/accuracy"
EVAL_ACCURACY_FLEXIBLE = "eval/gsm8k/accuracy_flexible"
EVAL_NUM_SAMPLES = "eval/gsm8k/num_samples"
EVAL_RESPONSE_LENGTH = "eval/gsm8k/response_length_mean"
# On the parent run of ``main``: the starting model's accuracy on the same problems, and trained minus base.
EVAL_ACCURACY_BASE = "eval/gsm8k/accuracy_base"
EVAL_ACCURACY_GAIN = "eval/gsm8k/accuracy_gain"

# Tags verlflow sets on runs (and, where said, on model versions or traces): key = meaning.
# which step made the run: preprocess | train | evaluate | register | search | compare | main
STEP_TAG = "verlflow.step"
RECIPE_TAG = "verlflow.recipe"  # the recipe a train/search run composed
PROFILE_TAG = "verlflow.profile"  # the device profile it composed
BACKEND_TAG = "verlflow.backend"  # verl | local
VERSION_TAG = "verlflow.version"  # verlflow's version
CODE_VERSION_TAG = "verlflow.code_version"  # digest of the package source: a reused step run must match it
MODEL_NAME_TAG = "verlflow.model_name"  # the registered model name a train run registers under
DATA_DIR_TAG = "verlflow.data_dir"  # a preprocess run's output folder
# content hash of the preprocessed rows (MLflow's pandas digest ignores nested columns)
DATA_DIGEST_TAG = "data.digest"
DATA_RUN_ID_TAG = "verlflow.data_run_id"  # the preprocess run a train run of ``main`` used
CHECKPOINT_DIR_TAG = "verlflow.checkpoint_dir"  # a train run's final Hugging Face checkpoint folder
CHECKPOINT_SOURCE_TAG = "verlflow.checkpoint_source"  # what the final checkpoint was made from
# The final checkpoint's weights digest, logged as an immutable param when the run records its checkpoint.
CHECKPOINT_DIGEST_PARAM = "verlflow.checkpoint_sha256"
IGNORED_KEYS_TAG = "verlflow.ignored_keys"  # recipe keys the local trainer does not use
MODEL_PARAMS_TAG = "model.num_params"  # parameters of the trained model (compare's MFU and FLOPs arithmetic)
DETERMINISTIC_TAG = "verlflow.deterministic"  # true: a local run that reruns bit-identically (one thread, seeded)
RESUMED_FROM_TAG = "verlflow.resumed_from"  # the checkpoint a resumed local run continued from
# Steps an interrupted attempt logged past the checkpoint its resume continued from: trained again, not logged again,
# so the run's history keeps the interrupted attempt's values for them ("4-6").
SUPERSEDED_STEPS_TAG = "verlflow.superseded_steps"
RESUMED_RUN_TAG = "verlflow.resumed_run"  # set on a run that was continued in place
TRAIN_ARGS_TAG = "verlflow.train_args"  # a train run's step parameters (JSON), for --resume
ATTEMPT_TAG = "verlflow.attempt"  # the latest attempt of a train run: {"attempt": n, "started_at": epoch s}
SOURCE_RUN_TAG = "verlflow.source_run_id"  # on a model version: the train run it came from
MODEL_VERSION_TAG = "verlflow.model_version"  # on a register run: the version it created
MODEL_URI_TAG = "verlflow.model_uri"  # on register/evaluate runs: the model URI
CHAMPION_VERSION_TAG = "verlflow.champion_version"  # on a promote decision: the version holding the alias
EVAL_ROLE_TAG = "verlflow.eval_role"  # base: an evaluate run of the starting model (``main``)
RUN_ID_TAG = "verlflow.run_id"  # on an MLflow trace: the train run it belongs to
STEP_RUN_TAG_PREFIX = "verlflow.run_id."  # on a ``main`` run: ``verlflow.run_id.<step>`` = that step's run
REUSED_TAG_PREFIX = "verlflow.reused_run_id."  # on a ``main`` run: the step runs it reused
ERROR_TAG = "verlflow.error"  # the one-line error a failed run ended with
EXIT_CODE_TAG = "verlflow.exit_code"  # verl's exit status
VERL_ERROR_TAG = "verlflow.verl_error"  # the last error line verl printed
PREFLIGHT_TAG = "verlflow.preflight"  # passed | skipped | not run, before a verl launch
VALIDATED_TAG = "verlflow.validated"  # the verl config check a dry run passed
DRY_RUN_TAG = "verlflow.dry_run"  # true on a dry run (nothing launched)
LAUNCHER_TAG = "verlflow.launcher"  # how verl was launched (local process | Ray job)
RAY_JOB_ID_TAG = "verlflow.ray_job_id"  # the Ray job a launch submitted
JEMALLOC_TAG = "verlflow.jemalloc"  # the jemalloc library preloaded, if any
ROLLOUT_TRACES_TAG = "verlflow.rollout_traces"  # how many of verl's rollout traces were linked to the run
DEVICE_PROFILE_HOST_TAG = "verlflow.device_profile_host"  # the host whose devices the device.* tags describe
SYSTEM_METRICS_TAG = "verlflow.system_metrics"  # which samplers recorded system/* metrics
SYSTEM_METRICS_INTERVAL_TAG = "verlflow.system_metrics_interval_s"  # seconds between system/* samples
HOST_TAG = "verlflow.host"  # the host a run's process lives on (to find stale RUNNING runs)
PID_TAG = "verlflow.pid"  # that process's id
PID_START_TAG = "verlflow.pid_start"  # that process's start time (a reused pid is not the run's)
HEARTBEAT_TAG = "verlflow.heartbeat"  # last sign of life of a running run
REAPED_TAG = "verlflow.reaped"  # set when ``verlflow runs`` ended a run whose process was gone
OBJECTIVE_TAG = "verlflow.objective"  # a search's objective metric
SPACE_TAG = "verlflow.space"  # fingerprint of a search's space (a study resumes only with the same one)

# (name, meaning). Per-step unless the meaning says otherwise.
GLOSSARY: list[tuple[str, str]] = [
    ("timing_s/gen", "seconds generating the step's rollouts (n responses per prompt)"),
    ("timing_s/reward", "seconds scoring responses with the GSM8K rule reward"),
    ("timing_s/old_log_prob", "seconds recomputing the behaviour policy's log-probs"),
    ("timing_s/ref", "seconds computing the reference policy's log-probs (for the KL loss)"),
    ("timing_s/adv", "seconds computing GRPO group-relative advantages"),
    ("timing_s/update_actor", "seconds of PPO epochs over mini-batches (forward, backward, optimizer)"),
    ("timing_s/step", "seconds of the whole training step"),
    ("timing_s/testing", "seconds of validation, on the steps that validate"),
    ("timing_s/e2e", "once per run: seconds from launch to the end of training"),
    ("timing_s_mean/<name>", "once per run: mean over steps of timing_s/<name> (the guide's §6.3 figures)"),
    ("perf/throughput", "tokens (prompt + response) per second per device"),
    ("perf/time_per_step", "seconds per step"),
    ("perf/total_num_tokens", "tokens (prompt + response) processed in the step"),
    ("actor/pg_loss", "clipped policy-gradient loss"),
    ("actor/kl_loss", "KL loss to the reference policy (kl_loss_type, e.g. low_var_kl)"),
    ("actor/entropy", "mean token entropy of the policy on its responses"),
    ("actor/grad_norm", "gradient norm before clipping"),
    ("actor/lr", "learning rate"),
    ("actor/pg_clipfrac", "fraction of tokens whose probability ratio was clipped"),
    ("actor/ppo_kl", "approximate KL between the behaviour and the updated policy"),
    ("actor/entropy_loss", "entropy term of the actor loss (entropy_coeff x entropy)"),
    ("actor/pg_clipfrac_lower", "fraction of tokens clipped by the lower dual-clip bound"),
    ("critic/score/mean", "mean GSM8K reward of the step's responses (also /max, /min)"),
    ("critic/rewards/mean", "mean token-level reward summed per response (also /max, /min)"),
    ("critic/advantages/mean", "mean GRPO advantage over response tokens (also /max, /min)"),
    ("critic/returns/mean", "mean return per response token (also /max, /min)"),
    ("timing_per_token_ms/<name>", "milliseconds per token of timing_s/<name> (gen, update_actor, ...)"),
    ("response_length/mean", "mean response length in tokens (also /max, /min)"),
    ("response_length/clip_ratio", "fraction of responses cut at max_response_length"),
    ("prompt_length/mean", "mean prompt length in tokens (also /max, /min)"),
    ("data/train/num_rows", "preprocess step: rows written to train.parquet"),
    ("data/test/num_rows", "preprocess step: rows written to test.parquet"),
    (VAL_ACCURACY, "validation accuracy, one greedy-or-sampled answer per test problem; verl 0.9.x logs it as "
                   f"`{VAL_ACCURACY_VERL09}` (verlflow reads either)"),
    (EVAL_ACCURACY, "evaluate step: strict accuracy (answer after '####'), verl's GSM8K scorer"),
    (EVAL_ACCURACY_FLEXIBLE, "evaluate step: accuracy taking the last number in the response"),
    (EVAL_NUM_SAMPLES, "evaluate step: problems evaluated"),
    (EVAL_RESPONSE_LENGTH, "evaluate step: mean response length in tokens"),
    # System metrics: sampled every verlflow.system_metrics_interval seconds (10) by MLflow's monitors and
    # verlflow's NPU monitor, on the machine verlflow runs on; step = sample number.
    ("system/cpu_utilization_percentage", "host CPU utilisation, % (MLflow's CPU monitor)"),
    ("system/system_memory_usage_megabytes", "host memory used, MB (also system/system_memory_usage_percentage)"),
    ("system/disk_usage_megabytes", "disk used on / (also _percentage, system/disk_available_megabytes)"),
    ("system/network_receive_megabytes", "MB received since the run began (also system/network_transmit_megabytes)"),
    ("system/gpu_<i>_utilization_percentage", "NVIDIA GPU i busy, % (MLflow's GPU monitor, needs nvidia-ml-py)"),
    ("system/gpu_<i>_memory_usage_megabytes", "GPU i memory used, MB (also system/gpu_<i>_memory_usage_percentage)"),
    ("system/gpu_<i>_power_usage_watts", "GPU i power, W (also system/gpu_<i>_power_usage_percentage)"),
    ("system/npu_<i>_utilization_percentage", "Ascend chip i AICore utilisation, % (npu-smi info)"),
    ("system/npu_<i>_hbm_usage_megabytes", "chip i HBM used, MB"),
    ("system/npu_<i>_hbm_usage_percentage", "chip i HBM used / HBM capacity, %"),
    ("system/npu_<i>_power_watts", "chip i power, W (A3: the card's power, on its first chip only)"),
    ("system/npu_<i>_temperature_celsius", "chip i temperature, °C"),
]


def glossary_markdown() -> str:
    """The glossary as a Markdown table, as it appears in docs/metrics.md."""
    lines = ["| metric | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in GLOSSARY]
    return "\n".join(lines)


def metrics_document() -> str:
    """docs/metrics.md, whole: generated here so that it never drifts from the names the code logs."""
    return "\n".join([
        "# Metrics",
        "",
        "Every metric a verlflow run logs, with verl's names (sanitized as verl's MLflow logger does: `@` →",
        "`_at_`). Per training step unless the meaning says otherwise; `system/*` are sampled every",
        "`verlflow.system_metrics_interval` seconds (10) on the machine verlflow runs on (step = sample number).",
        "",
        "Generated from `verlflow.names.GLOSSARY`: `python -m verlflow.names > docs/metrics.md`",
        "(tests/test_tracking_names.py keeps the two equal).",
        "",
        glossary_markdown(),
        "",
    ])


if __name__ == "__main__":
    print(metrics_document(), end="")
