"""verlflow's local GRPO trainer against TRL's GRPOTrainer on this CPU, same settings, alternating runs.

    pip install --no-deps --target .bench-site "trl==1.16.0"    # once; or: pip install -e ".[bench]"
    python bench/grpo_vs_trl.py [--data tests/fixtures/gsm8k] [--rounds 2] [--steps 12]

Builds both models offline (verlflow's tiny Qwen3, and a 3.5 M Qwen3 on the same tokenizer), takes the
first GSM8K train prompts from ``--data``, then per round and model runs both trainers, each in a fresh
process, alternating which goes first. Settings (bench_setup.py): fp32, 2 threads, 4 prompts x 4
generations, <= 64 completion tokens, lr 5e-7, KL 0.001, 12 steps; a figure is the median of steps 3-12.
Tracking's cost, each round and model: one more local-trainer run switches per-step MLflow logging on
and off in blocks of steps (on, off, off, on, ...; bench_setup.ALTERNATE). Each pair of neighbouring
blocks gives the extra time training's threads waited with logging on (see on_over_off), which with the
logging call is the figure, and the step-time ratio on / off, which this VM's steal makes noisy.
The metric writer process's CPU time is reported too.
Prints a table and writes everything to ``--out`` (JSON). TRL is imported only by bench/run_trl.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_setup as setup

HERE = Path(__file__).resolve().parent
FIRST_STEP = 3  # steps 1-2 warm up (allocator, first-call overheads) and are left out


def run_worker(args: list[str], threads: int) -> dict:
    """Run one bench worker script in a fresh process and return its BENCH_RESULT."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(setup.REPO / "src"), str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line.removeprefix("BENCH_RESULT "))
    raise SystemExit(f"bench worker {args[0]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def summarise(raw: dict) -> dict:
    """Median step seconds and median generated tokens/s over steps FIRST_STEP.., per-phase medians."""
    steps = raw["step_s"][FIRST_STEP - 1:]
    tokens = raw["tokens"][FIRST_STEP - 1:]
    out = {"step_s": statistics.median(steps),
           "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, steps, strict=True))}
    if raw.get("cpu_s"):
        cpu = raw["cpu_s"][FIRST_STEP - 1:]
        out["cpu_step_s"] = statistics.median(cpu)
        out["tokens_per_cpu_s"] = statistics.median(t / s for t, s in zip(tokens, cpu, strict=True))
    if "timing" in raw:
        timing = raw["timing"][FIRST_STEP - 1:]
        out["phases"] = {k.removeprefix("timing_s/"): statistics.median(t[k] for t in timing) for k in timing[0]}
        out["log_s"] = statistics.median(raw["log_s"][FIRST_STEP - 1:])
    if raw.get("writer_cpu_s") is not None and raw["step_s"]:
        # The writer's CPU over the whole run, per step: what tracking takes from the cores training uses.
        out["writer_cpu_step_s"] = raw["writer_cpu_s"] / len(raw["step_s"])
    return out


def on_over_off(raw: dict, model: str) -> dict:
    """Tracking's cost from a run whose logging went on, off, off, on, ... in blocks of steps.

    Per block, the median over its steps (its first ``settle`` left out: the writer is still writing the
    previous block then, or has not written this one yet) of two figures, and per pair of neighbouring
    blocks (one on, one off) their difference or ratio; the medians over pairs are the result:

    - ``waited``: seconds training's threads were kept waiting, as Linux accounts them: the trainer's thread's
      wall time minus its CPU time (waits for the GIL or for a core) plus torch's threads' waits for a core.
      The writer can only slow training through these; the hypervisor's steal is in neither, so this stays
      steady on a shared machine. ``tracking_share`` = that difference on / off plus the trainer's own
      time in the logging call, over the step time: what tracking costs training.
    - the step's wall time, whose ratio on / off is the direct figure but swings by +-10% per pair here.
    """
    block, settle, _ = setup.ALTERNATE[model]
    waited = [w - c + t for w, c, t in zip(raw["step_s"], raw["trainer_cpu_s"], raw["torch_wait_s"], strict=True)]
    blocks = []
    for start in range(0, len(raw["step_s"]) - block + 1, block):
        kept = slice(start + settle, start + block)
        blocks.append((raw["logged"][start], statistics.median(raw["step_s"][kept]),
                       statistics.median(waited[kept])))
    ratios, extra_waits = [], []
    for first, second in zip(blocks[::2], blocks[1::2], strict=False):
        on, off = (first, second) if first[0] else (second, first)
        ratios.append(on[1] / off[1])
        extra_waits.append((on[2] - off[2]) / off[1])
    log_share = statistics.median(s for s, logged in zip(raw["log_s"], raw["logged"], strict=False) if logged) / \
        statistics.median(raw["step_s"])
    return {"on_step_s": statistics.median(b[1] for b in blocks if b[0]),
            "off_step_s": statistics.median(b[1] for b in blocks if not b[0]),
            "pair_ratios": ratios, "on_over_off": statistics.median(ratios), "pair_extra_waits": extra_waits,
            "log_share": log_share, "tracking_share": statistics.median(extra_waits) + log_share}


def describe(run: dict) -> str:
    """One run's headline figures, for the progress lines."""
    if "on_over_off" in run:
        waits = " ".join(f"{100 * w:+.2f}%" for w in run["pair_extra_waits"])
        pairs = " ".join(f"{r:.3f}" for r in run["pair_ratios"])
        return (f"tracking costs training {100 * run['tracking_share']:.2f}% (extra waits per block pair {waits}); "
                f"wall on / off {run['on_over_off']:.3f} (pairs {pairs})")
    return f"step {run['step_s']:.2f} s  {run['tokens_per_s']:.0f} tok/s  cpu {run.get('cpu_step_s', 0):.2f} s/step"


def main() -> None:
    """Build, run alternating rounds, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=setup.REPO / "tests" / "fixtures" / "gsm8k")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "grpo_vs_trl.json")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("VERLFLOW_CACHE") or
                                                          Path.home() / ".cache" / "verlflow") / "bench")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=list(setup.MODELS), choices=setup.MODELS)
    parser.add_argument("--trl-site", default=str(setup.REPO / ".bench-site"),
                        help="a `pip install --target` folder holding trl (ignored when it does not exist)")
    parser.add_argument("--no-tracking", action="store_true", help="skip the logging on/off runs")
    args = parser.parse_args()
    if not (args.data / "train.jsonl").is_file() and not (args.data / "train.parquet").is_file():
        raise SystemExit(f"--data {args.data}: no train.jsonl or train.parquet there; give the GSM8K folder "
                         "(e.g. --data tests/fixtures/gsm8k, real GSM8K rows)")
    sys.path.insert(0, str(setup.REPO / "src"))
    models = setup.build_models(args.work)
    data_dir = setup.prepare_data(args.data.resolve(), args.work / "gsm8k")
    trl_site = args.trl_site if Path(args.trl_site).is_dir() else ""
    load_before = os.getloadavg()
    started = time.time()
    runs: list[dict] = []
    for round_no in range(args.rounds):
        for name in args.models:
            order = ["verlflow", "trl"] if round_no % 2 == 0 else ["trl", "verlflow"]
            if not args.no_tracking:
                order.append("verlflow-alternating")
            for trainer in order:
                if trainer == "trl":
                    cmd = [str(HERE / "run_trl.py"), str(models[name]), str(data_dir), str(args.steps), trl_site]
                elif trainer == "verlflow":
                    cmd = [str(HERE / "run_verlflow.py"), str(models[name]), str(data_dir), str(args.steps), "on"]
                else:
                    block, _, blocks = setup.ALTERNATE[name]
                    cmd = [str(HERE / "run_verlflow.py"), str(models[name]), str(data_dir), str(block * blocks),
                           f"alternate:{block}"]
                raw = run_worker(cmd, setup.THREADS)
                figures = summarise(raw) if trainer != "verlflow-alternating" else on_over_off(raw, name)
                runs.append({"round": round_no, "model": name, "trainer": trainer, **figures, "raw": raw})
                print(f"round {round_no + 1} {name:5s} {trainer:21s} {describe(runs[-1])}  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.with_suffix(".partial.json").write_text(json.dumps(runs, indent=1))
    report = {"settings": {k: getattr(setup, k) for k in ("THREADS", "PROMPTS_PER_STEP", "GENERATIONS",
                                                          "COMPLETION_TOKENS", "LEARNING_RATE", "KL_COEF")},
              "steps": args.steps, "rounds": args.rounds, "load_before": load_before, "load_after": os.getloadavg(),
              "seconds": time.time() - started, "params": {n: setup.parameter_count(models[n]) for n in args.models},
              "runs": runs}
    report["table"] = table(runs, args.models)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"\nload average before {load_before[0]:.1f}, after {report['load_after'][0]:.1f}; "
          f"{report['seconds']:.0f} s; results in {args.out}")


def table(runs: list[dict], models: list[str]) -> list[dict]:
    """Per model and round: both trainers' figures and the verlflow/TRL ratio, plus the tracking ratio."""
    rows = []
    for name in models:
        for round_no in sorted({r["round"] for r in runs}):
            pick = {r["trainer"]: r for r in runs if r["model"] == name and r["round"] == round_no}
            ours, theirs = pick["verlflow"], pick["trl"]
            row = {"model": name, "round": round_no + 1, "trl_step_s": theirs["step_s"],
                   "verlflow_step_s": ours["step_s"], "trl_tok_s": theirs["tokens_per_s"],
                   # generated tokens per CPU second (process time, all threads), verlflow over TRL
                   "cpu_ratio": ours.get("tokens_per_cpu_s", 0) / max(theirs.get("tokens_per_cpu_s", 0), 1e-9),
                   "verlflow_tok_s": ours["tokens_per_s"], "ratio": ours["tokens_per_s"] / theirs["tokens_per_s"],
                   "phases": ours["phases"], "log_share": ours["log_s"] / ours["step_s"],
                   "writer_share": ours.get("writer_cpu_step_s", 0.0) / ours["step_s"],
                   # of all the CPU the training process used (both cores), the share the metric writer took
                   "writer_cpu_share": ours.get("writer_cpu_step_s", 0.0) / max(ours.get("cpu_step_s", 0.0), 1e-9)}
            if "verlflow-alternating" in pick:
                alternating = pick["verlflow-alternating"]
                row["logging_on_over_off"] = alternating["on_over_off"]
                row["logging_pair_ratios"] = alternating["pair_ratios"]
                row["tracking_share"] = alternating["tracking_share"]
                row["tracking_log_share"] = alternating["log_share"]
                row["tracking_pair_waits"] = alternating["pair_extra_waits"]
            rows.append(row)
    return rows


def print_table(report: dict) -> None:
    """The markdown table the README shows."""
    print("\n| model | round | TRL step s | verlflow step s | TRL tok/s | verlflow tok/s | verlflow/TRL "
          "| same, by CPU seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for row in report["table"]:
        print(f"| {row['model']} ({report['params'][row['model']] / 1e6:.2f} M) | {row['round']} | "
              f"{row['trl_step_s']:.2f} | {row['verlflow_step_s']:.2f} | {row['trl_tok_s']:.0f} | "
              f"{row['verlflow_tok_s']:.0f} | {row['ratio']:.2f}x | {row['cpu_ratio']:.2f}x |")
    print("\nverlflow per-phase medians (timing_s/*, seconds):")
    for row in report["table"]:
        phases = "  ".join(f"{k} {v:.3f}" for k, v in row["phases"].items())
        print(f"  {row['model']:5s} round {row['round']}: {phases}")
    print("\ntracking (MLflow, SQLite store; the metric writer is a process at the lowest CPU priority):")
    for row in report["table"]:
        if "tracking_share" not in row:
            continue
        print(f"  {row['model']:5s} round {row['round']}: tracking costs training {100 * row['tracking_share']:.2f}% "
              f"of a step (logging call {100 * row['tracking_log_share']:.2f}%, extra waits of training's threads "
              f"{100 * (row['tracking_share'] - row['tracking_log_share']):.2f}%); "
              f"wall on / off {row['logging_on_over_off']:.3f}; "
              f"the writer's own CPU {100 * row['writer_cpu_share']:.2f}% of the trainer's")
    for name in sorted({row["model"] for row in report["table"]}):
        rows = [row for row in report["table"] if row["model"] == name and "tracking_share" in row]
        if rows:
            ratios = [ratio for row in rows for ratio in row["logging_pair_ratios"]]
            share = statistics.median(row["tracking_share"] for row in rows)
            print(f"  {name:5s} all rounds: tracking costs training {100 * share:.2f}% (median of rounds); "
                  f"wall on / off median {statistics.median(ratios):.3f} of {len(ratios)} block pairs "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
