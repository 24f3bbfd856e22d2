"""How long ``verlflow compare`` takes on two long runs: 220 steps x 100 metrics each, in a SQLite store.

    python bench/compare_at_scale.py [--steps 220] [--metrics 100] [--repeats 3]

Writes two synthetic train runs (verl-named per-step metrics incl. the report's curves and timers,
the end-of-run summaries, the smoke recipe's flattened params, device tags of a cpu profile) into a
fresh SQLite store, then times the whole ``verlflow compare`` command in a new process (start-up
included), ``--repeats`` times, and prints each time and the best.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CURVE_KEYS = ["critic/score/mean", "val-core/openai/gsm8k/reward/mean_at_1", "response_length/mean",
              "actor/entropy", "actor/kl_loss", "actor/grad_norm", "actor/pg_loss"]
TIMERS = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "step"]


def make_runs(uri: str, steps: int, metrics: int) -> tuple[str, str]:
    """Two FINISHED runs (baseline cpu, candidate cpu with another seed) of ``steps`` x ``metrics``."""
    import mlflow
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from verlflow import config
    from verlflow.tracking import tracking

    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    experiment = client.create_experiment("compare-bench")
    params = tracking.flatten_params(config.compose("smoke", "cpu").to_container())
    keys = CURVE_KEYS + [f"timing_s/{t}" for t in TIMERS]
    keys += [f"bench/extra_{i}" for i in range(metrics - len(keys))]
    ids = []
    for seed, name in ((0, "baseline-cpu"), (1, "candidate-cpu")):
        run = client.create_run(experiment, run_name=name, tags={
            "verlflow.backend": "local", "verlflow.recipe": "smoke", "verlflow.profile": "cpu",
            "device.type": "cpu", "device.name": "bench", "sw.torch": "2.13.0", "sw.verl": "0.9.1"})
        rid = run.info.run_id
        client.log_batch(rid, params=[Param(k, str("None" if v is None else v)) for k, v in params.items()],
                         tags=[RunTag("mlflow.runName", name)])
        now = int(time.time() * 1000)
        points = [Metric(k, 1.0 + 0.1 * math.sin(step / 7 + i + seed) + 0.001 * step, now + step, step)
                  for step in range(1, steps + 1) for i, k in enumerate(keys)]
        for start in range(0, len(points), 1000):
            client.log_batch(rid, metrics=points[start:start + 1000])
        summaries = {f"timing_s_mean/{t}": 1.0 + seed * 0.1 for t in TIMERS} | {"timing_s/e2e": 300.0 + seed}
        client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in summaries.items()])
        client.set_terminated(rid, "FINISHED")
        ids.append(rid)
    return ids[0], ids[1]


def main() -> None:
    """Build the store, time the compare command, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=220)
    parser.add_argument("--metrics", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    with tempfile.TemporaryDirectory(prefix="verlflow-compare-bench-") as work:
        uri = f"sqlite:///{work}/mlflow.db"
        baseline, candidate = make_runs(uri, args.steps, args.metrics)
        env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
        seconds = []
        for attempt in range(args.repeats):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "verlflow.cli", "compare", "--baseline", baseline,
                                   "--candidate", candidate, "--output_dir", f"{work}/out{attempt}"],
                                  env=env, capture_output=True, text=True, cwd=work)
            seconds.append(time.perf_counter() - start)
            if done.returncode:
                raise SystemExit(f"verlflow compare failed ({done.returncode}):\n{done.stderr[-2000:]}")
            print(f"verlflow compare, 2 runs x {args.steps} steps x {args.metrics} metrics: "
                  f"{seconds[-1]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"best of {args.repeats}: {min(seconds):.2f} s (target <= 3 s)")


if __name__ == "__main__":
    main()
