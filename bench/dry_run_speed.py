"""What a dry run of the guide recipe costs next to verl's own bare ``main_ppo --cfg job`` of the same overrides.

    python bench/dry_run_speed.py                    # A3 profile, 5 rounds, both timed alternately
    python bench/dry_run_speed.py --device gpu --rounds 5
    python bench/dry_run_speed.py --model DIR --data DIR   # a local model: the whole rehearsal runs

Round by round, alternately (so a busy machine slows both alike): ``verlflow train --device npu
--dry_run true`` on a few synthetic GSM8K rows into a fresh SQLite store, and verl's ``python -m
verl.trainer.main_ppo --cfg job`` with the very override words that dry run would launch. Prints both
wall-clock medians and their ratio (the target is at most 1.5), plus the CPU seconds, which a loaded
machine disturbs less, and the load average. The first round of each warms the file cache and is not counted.

With the guide's hub model id (the default) and no copy in the local hub cache, the dry run's rehearsal skips
what reads the model (it says so); ``--model`` gives a local Hugging Face folder and ``--data`` a folder with
``train.parquet``/``test.parquet`` (the guide's 512-row batch needs >= 512 training rows), so the model's
config, the tokenized datasets, the first batch and the reward call are timed too.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def verl_words(device: str, data_dir: Path, out: Path, model: str | None) -> list[str]:
    """The Hydra override words the dry run would hand verl (its launch plan's, built without launching)."""
    from verlflow import config
    from verlflow.backends.train_setup import compose_train_config
    from verlflow.backends.verl import command
    from verlflow.config import PROFILE_FOR_DEVICE

    cfg = compose_train_config("qwen3-4b-gsm8k-grpo", PROFILE_FOR_DEVICE[device], str(data_dir), model or "",
                               f"verlflow.output_dir={out}", check_counts=False)
    plan = command.build_plan(cfg, run_id="0" * 32, experiment_name="Default", run_name="bench",
                              tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    return config.hydra_overrides(plan.overrides)


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system) of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} … failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("npu", "gpu"), default="npu")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up round (default 5)")
    parser.add_argument("--model", help="a local Hugging Face model folder (default: the guide's hub id)")
    parser.add_argument("--data", help="a folder with train.parquet and test.parquet (default: 8 synthetic rows)")
    args = parser.parse_args()

    from verlflow.data import gsm8k

    with tempfile.TemporaryDirectory(prefix="verlflow-bench-") as scratch:
        root = Path(scratch)
        data = Path(args.data) if args.data else root / "data"
        if not args.data:
            gsm8k.preprocess("synthetic", str(data), 8)
        words = verl_words(args.device, data, root / "outputs", args.model)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        env.pop("MLFLOW_RUN_ID", None)
        ours = [sys.executable, "-m", "verlflow.cli", "train", "--device", args.device, "--dry_run", "true",
                "--data_dir", str(data), "--overrides", f"verlflow.output_dir={root / 'outputs'}",
                *(["--model", args.model] if args.model else [])]
        theirs = [sys.executable, "-m", "verl.trainer.main_ppo", *words, "--cfg", "job"]
        results: dict[str, list[tuple[float, float]]] = {"verlflow dry run": [], "verl --cfg job": []}
        for round_no in range(args.rounds + 1):
            env["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / f'mlflow-{round_no}.db'}"
            timed([sys.executable, "-c", "import mlflow; mlflow.MlflowClient().search_experiments()"], env, root)
            for name, argv in (("verlflow dry run", ours), ("verl --cfg job", theirs)):
                wall, cpu = timed(argv, env, root)
                if round_no:
                    results[name].append((wall, cpu))
                print(f"round {round_no}{'' if round_no else ' (warm-up)'}: {name}: {wall:.1f} s wall, "
                      f"{cpu:.1f} s CPU", flush=True)
    medians = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in results.items()}
    (ours_wall, ours_cpu), (verl_wall, verl_cpu) = medians["verlflow dry run"], medians["verl --cfg job"]
    print(f"\n{'':18}{'wall s':>8}{'CPU s':>8}")
    for name, (wall, cpu) in medians.items():
        print(f"{name:18}{wall:8.1f}{cpu:8.1f}")
    print(f"{'ratio':18}{ours_wall / verl_wall:8.2f}{ours_cpu / verl_cpu:8.2f}   (target: at most 1.5)")
    print(f"load average at the end (1/5/15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs: a loaded machine stretches both, the wall ratio more than the CPU one")


if __name__ == "__main__":
    main()
