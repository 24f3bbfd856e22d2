"""CPU training beside other work: 40 smoke steps alone, then beside two busy loops, as a ratio within one run.

    python bench/cpu_shared_speed.py [--rounds 2] [--steps 40] [--work DIR] [--threads auto|N]

The smoke recipe's step (8 prompts x 8 samples of <= 48 tokens, one PPO mini-batch) on the untrained tiny model
(its warm start takes minutes; untrained, every response runs to 48 tokens, so a step is a little heavier).
Each figure is one fresh process training the smoke recipe's steps with the local trainer, timed from its first
step's start to its last step's end (validation, checkpoints and sample tables off). "shared" runs the same beside
two Python busy loops (one per core of a 2-core machine). Rounds alternate quiet / shared so that a drift of the
machine's other load favours neither; the median of each is printed with the ratio and the load average around it.
``--threads 2`` gives the settings before the trainer followed the free cores (a fixed two);
``--wait-policy PASSIVE`` the wait policy the step forced before it left it to OpenMP.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
import mlflow
from verlflow import config
from verlflow.backends.local.trainer import train_local
from verlflow.tracking import tracking
work, steps, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if threads != "auto":  # a fixed count, as before the trainer followed the free cores
    import verlflow.backends.local.trainer as trainer_module
    trainer_module.ThreadGovernor = lambda limit: None
mlflow.set_tracking_uri(f"sqlite:///{work}/mlflow.db")
overrides = ["actor_rollout_ref.model.path=tiny-qwen3", f"trainer.total_training_steps={steps}",
             "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
             f"verlflow.output_dir={work}/outputs"]
if threads != "auto":
    overrides.append(f"profile.env.OMP_NUM_THREADS={threads}")
cfg = config.compose("smoke", "cpu", overrides)
marks = []
with tracking.tracked_run(run_name="bench") as run:
    marks.append(time.perf_counter())
    train_local(cfg, data_dir=f"{work}/data", run_id=run.info.run_id,
                on_step_end=lambda step, metrics: marks.append(time.perf_counter()))
import torch
first_step = marks[2] - marks[1]
print("BENCH " + json.dumps({"train_s": marks[-1] - marks[1] + first_step, "threads": torch.get_num_threads()}))
"""

BUSY = "while True: pass"


def prepare(work: Path) -> None:
    """The tiny model and the smoke recipe's synthetic data, built once into ``work``."""
    if (work / "data" / "train.parquet").is_file():
        return
    from verlflow.data import gsm8k
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    resolve_model_path(TINY_SENTINEL, work / "cache")
    gsm8k.preprocess("synthetic-easy", work / "data", 0, log_to_mlflow=False)


def train_seconds(work: Path, steps: int, threads: str, wait_policy: str | None, busy: int, nice: int) -> dict:
    """One fresh training process, beside ``busy`` busy loops: its training seconds and thread count."""
    env = {**os.environ, "VERLFLOW_CACHE": str(work / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    niced = (lambda: os.nice(nice)) if nice else None
    loops = [subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=niced) for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory(dir=work) as run_dir:
            (Path(run_dir) / "data").symlink_to(work / "data")
            done = subprocess.run([sys.executable, "-c", CHILD, run_dir, str(steps), threads], env=env,
                                  capture_output=True, text=True, timeout=3600, preexec_fn=niced)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if line is None:
        sys.exit(f"the training process failed:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("BENCH "))


def main() -> None:
    """Alternate quiet and shared rounds; print each, then the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "verlflow-cpu-shared"))
    parser.add_argument("--threads", default="auto",
                        help="auto (the trainer follows the free cores) or a count kept fixed throughout")
    parser.add_argument("--wait-policy", default=None, help="OMP_WAIT_POLICY to force (default: OpenMP's own)")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the shared runs")
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness of the trainer and the loops (negative, as root: a host shared with other "
                             "work outside the benchmark disturbs it less)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prepare(work)
    figures: dict[str, list[float]] = {"quiet": [], "shared": []}
    for _ in range(args.rounds):
        for name, busy in (("quiet", 0), ("shared", args.busy)):
            before = os.getloadavg()[0]
            result = train_seconds(work, args.steps, args.threads, args.wait_policy, busy, args.nice)
            figures[name].append(result["train_s"])
            print(f"{name:6s} {result['train_s']:6.1f} s  threads {result['threads']}  "
                  f"load {before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    quiet, shared = statistics.median(figures["quiet"]), statistics.median(figures["shared"])
    print(f"{args.steps} steps, threads={args.threads}, wait policy={args.wait_policy or 'OpenMP default'}: "
          f"quiet {quiet:.1f} s, beside {args.busy} busy loops {shared:.1f} s = {shared / quiet:.2f}x quiet")


if __name__ == "__main__":
    main()
