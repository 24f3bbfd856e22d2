"""CPU training beside other work: 40 smoke steps alone, then beside two busy loops, as a ratio within one run.

    python bench/cpu_shared_speed.py [--rounds 2] [--steps 40] [--work DIR] [--threads auto|N]

The smoke recipe's step (8 prompts x 8 samples of <= 48 tokens, one PPO mini-batch) on the untrained tiny model
(its warm start takes minutes; untrained, every response runs to 48 tokens, so a step is a little heavier).
Each figure is one fresh process running ``verlflow train --recipe smoke --device cpu`` as a user does (its run,
metric writer process, final model and summaries included; validation, checkpoints and sample tables off), with
three figures: the step loop (its first step's start to its last step's end), the end (its last step's end to the
step's return: the final model logged, the writer's last writes and exit) and the whole process (its start to its
exit, as the user waits for it). "shared" runs the same beside two Python busy loops (one per core of a 2-core
machine). Rounds alternate quiet / shared so that a drift of the machine's other load favours neither; the median
of each is printed with the ratios and the load average around it.
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
import time
from pathlib import Path

CHILD = """
import json, sys, time
from verlflow import cli
import verlflow.backends.local.trainer as trainer_module
work, steps, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if threads != "auto":  # a fixed count, as before the trainer followed the free cores
    trainer_module.ThreadGovernor = lambda limit: None
marks = []  # the training's start, then each step's end
real_train = trainer_module.LocalTrainer.train

def timed_train(trainer, *, on_step_end=None, started_at):
    def step_ended(step, metrics):
        marks.append(time.perf_counter())
        if on_step_end is not None:
            on_step_end(step, metrics)
    marks.append(time.perf_counter())
    return real_train(trainer, on_step_end=step_ended, started_at=started_at)

trainer_module.LocalTrainer.train = timed_train
overrides = ["actor_rollout_ref.model.path=tiny-qwen3", f"trainer.total_training_steps={steps}",
             "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
             f"verlflow.output_dir={work}/outputs", "verlflow.system_metrics_interval=0"]
if threads != "auto":
    overrides.append(f"profile.env.OMP_NUM_THREADS={threads}")
cli.main(["train", "--recipe", "smoke", "--device", "cpu", "--data_dir", f"{work}/data",
          "--overrides", " ".join(overrides)], own_process=True)
returned = time.perf_counter()
import torch
first_step = marks[2] - marks[1]
print("BENCH " + json.dumps({"train_s": marks[-1] - marks[1] + first_step, "end_s": returned - marks[-1],
                             "threads": torch.get_num_threads()}))
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
    """One fresh training process, beside ``busy`` busy loops: its step loop's, end's and whole process's seconds
    and its thread count."""
    env = {**os.environ, "VERLFLOW_CACHE": str(work / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    niced = (lambda: os.nice(nice)) if nice else None
    loops = [subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=niced) for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory(dir=work) as run_dir:
            (Path(run_dir) / "data").symlink_to(work / "data")
            env["MLFLOW_TRACKING_URI"] = f"sqlite:///{run_dir}/mlflow.db"
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, run_dir, str(steps), threads], env=env, cwd=run_dir,
                                  capture_output=True, text=True, timeout=3600, preexec_fn=niced)
            process_s = time.perf_counter() - started
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if line is None:
        sys.exit(f"the training process failed:\n{done.stderr[-3000:]}")
    return {**json.loads(line.removeprefix("BENCH ")), "process_s": process_s}


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
    figures: dict[str, dict[str, list[float]]] = {"quiet": {}, "shared": {}}
    for _ in range(args.rounds):
        for name, busy in (("quiet", 0), ("shared", args.busy)):
            before = os.getloadavg()[0]
            result = train_seconds(work, args.steps, args.threads, args.wait_policy, busy, args.nice)
            for figure in ("train_s", "end_s", "process_s"):
                figures[name].setdefault(figure, []).append(result[figure])
            print(f"{name:6s} step loop {result['train_s']:6.1f} s  end {result['end_s']:6.1f} s  whole process "
                  f"{result['process_s']:6.1f} s  threads {result['threads']}  "
                  f"load {before:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{args.steps} steps, threads={args.threads}, wait policy={args.wait_policy or 'OpenMP default'}, "
          f"beside {args.busy} busy loops:")
    for figure, label in (("train_s", "step loop"), ("end_s", "end"), ("process_s", "whole process")):
        quiet, shared = (statistics.median(figures[name][figure]) for name in ("quiet", "shared"))
        print(f"  {label:13s} quiet {quiet:6.1f} s, shared {shared:6.1f} s = {shared / max(quiet, 1e-9):.2f}x quiet")


if __name__ == "__main__":
    main()
