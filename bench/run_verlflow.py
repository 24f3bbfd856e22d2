"""One verlflow local-trainer run for the benchmark, in its own process, tracked in a SQLite store.

    python bench/run_verlflow.py MODEL_DIR DATA_DIR STEPS on|off|alternate:K

``on`` logs every step to MLflow as a train run does (through the metric buffer's background writer);
``off`` replaces the per-step metric logging with nothing (the run, its params and its checkpoint stay);
``alternate:K`` switches between the two every K steps in the order on, off, off, on, on, off, off, on ...
(so a steady drift of the machine's load favours neither), and one process (same memory layout) measures
what tracking costs: ``logged`` says which steps were logged.
Prints one line ``BENCH_RESULT <json>``: per-step wall times, process and trainer-thread CPU times, the
run-queue waits of torch's threads, generated tokens, ``timing_s/*`` per step, the seconds the trainer's
thread spent in per-step logging, and the CPU seconds the buffer's writer process spent writing them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import bench_setup as setup


def overrides(model_dir: str, steps: int, output_dir: str) -> list[str]:
    """The tiny recipe turned into the benchmark's settings (same as the TRL run's)."""
    actor = "actor_rollout_ref.actor"
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_batch_size={setup.PROMPTS_PER_STEP}",
        f"actor_rollout_ref.rollout.n={setup.GENERATIONS}", f"data.max_response_length={setup.COMPLETION_TOKENS}",
        f"data.max_prompt_length={setup.MAX_PROMPT_TOKENS}", "data.shuffle=false",
        f"{actor}.optim.lr={setup.LEARNING_RATE}", f"{actor}.kl_loss_coef={setup.KL_COEF}", f"{actor}.entropy_coeff=0",
        f"{actor}.ppo_mini_batch_size={setup.PROMPTS_PER_STEP}",
        f"{actor}.ppo_micro_batch_size_per_gpu={setup.PROMPTS_PER_STEP * setup.GENERATIONS}",
        f"actor_rollout_ref.rollout.temperature={setup.TEMPERATURE}",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
        f"verlflow.output_dir={output_dir}", f"profile.env.OMP_NUM_THREADS={setup.THREADS}",
    ]


def logging_for(mode: str) -> Callable[[int], bool]:
    """step → whether that step's metrics are logged, for the mode ``on``, ``off`` or ``alternate:K``."""
    if mode.startswith("alternate:"):
        block = int(mode.split(":", 1)[1])
        return lambda step: ((step - 1) // block) % 4 in (0, 3)
    return lambda step: mode == "on"


def runqueue_wait_s(skip: set[int]) -> float:
    """Seconds this process's threads (but those in ``skip``) have waited for a core so far (Linux schedstat).

    A thread that waits in the run queue was ready to compute while another thread held its core: what the
    metric writer's CPU can take from training's threads. 0.0 where /proc has no schedstat.
    """
    total = 0
    for task in Path("/proc/self/task").glob("*") if Path("/proc/self/task").is_dir() else []:
        if int(task.name) in skip:
            continue
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def main(model_dir: str, data_dir: str, steps: int, mode: str) -> dict:
    """Train ``steps`` GRPO steps with the local trainer; per-step seconds, tokens, phases, logging time."""
    import mlflow

    from verlflow import config
    from verlflow.backends.local.trainer import train_local
    from verlflow.tracking import tracking
    from verlflow.tracking.run_logger import buffered_logging

    log_seconds: list[float] = []
    logged: list[bool] = []
    logging_on = logging_for(mode)

    def timed(real_log):
        def timed_log(metrics, step, **kwargs):
            start = time.perf_counter()
            if logging_on(step):
                real_log(metrics, step, **kwargs)
            log_seconds.append(time.perf_counter() - start)
        return timed_log

    ends: list[float] = []
    cpu: list[float] = []  # process CPU seconds (all threads): steadier than wall time on a shared machine
    trainer_cpu: list[float] = []  # CPU seconds of the trainer's own thread (the one the callbacks run in)
    waits: list[float] = []  # run-queue seconds of the trainer's other threads (torch's)
    not_torch = {threading.get_native_id()}  # the trainer's thread, whose waits are in wall - CPU already
    per_step: list[dict] = []

    def on_step_end(step, metrics):
        logged.append(logging_on(step))
        ends.append(time.perf_counter())
        cpu.append(time.process_time())
        trainer_cpu.append(time.thread_time())
        waits.append(runqueue_wait_s(not_torch))
        per_step.append(dict(metrics))

    with tempfile.TemporaryDirectory() as work:
        mlflow.set_tracking_uri(f"sqlite:///{work}/mlflow.db")
        cfg = config.compose("tiny", "cpu", overrides(model_dir, steps, os.path.join(work, "outputs")))
        with tracking.tracked_run(tags=tracking.standard_tags(backend="local", recipe="tiny", profile="cpu")) as run:
            ends.append(time.perf_counter())
            cpu.append(time.process_time())
            trainer_cpu.append(time.thread_time())
            # As the train step does: per-step metrics through the background writer.
            with buffered_logging(Path(work) / "spill", "bench").open(run.info.run_id) as logger:
                buffer = logger.buffer
                logger.log_metrics = timed(logger.log_metrics)  # the trainer's per-step call, timed
                waits.append(runqueue_wait_s(not_torch))
                train_local(cfg, data_dir=data_dir, run_id=run.info.run_id, on_step_end=on_step_end, logger=logger)
        history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "timing_s/step")
    return {
        "step_s": [b - a for a, b in zip(ends, ends[1:], strict=False)],
        "cpu_s": [b - a for a, b in zip(cpu, cpu[1:], strict=False)],
        "trainer_cpu_s": [b - a for a, b in zip(trainer_cpu, trainer_cpu[1:], strict=False)],
        "torch_wait_s": [b - a for a, b in zip(waits, waits[1:], strict=False)],
        "tokens": [m["response_length/mean"] * setup.PROMPTS_PER_STEP * setup.GENERATIONS for m in per_step],
        "timing": [{k: v for k, v in m.items() if k.startswith("timing_s/")} for m in per_step],
        "log_s": log_seconds, "logged": logged, "logged_steps": len(history), "writer_cpu_s": buffer.write_cpu_s,
    }


if __name__ == "__main__":
    os.environ.setdefault("TQDM_DISABLE", "1")
    result = main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
    print("BENCH_RESULT " + json.dumps(result), flush=True)
