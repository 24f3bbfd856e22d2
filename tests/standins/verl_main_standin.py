"""A stand-in for ``python -m verl.trainer.main_ppo``: same command line, verl's real ``Tracking``, no device.

    verlflow train --recipe smoke --device gpu --backend verl --model TINY_DIR \\
        --overrides "verlflow.launch_module=tests/standins/verl_main_standin.py verlflow.skip_preflight=true"

It composes the Hydra overrides it is given into verl's full config (as main_ppo does), opens verl's
``verl.utils.tracking.Tracking`` with ``trainer.logger`` (so MLflow attaches through MLFLOW_RUN_ID),
logs two steps of verl-named metrics (one with ``@``), then acts as ``VERLFLOW_STANDIN_MODE`` says:

- ``ok`` (default): saves the final checkpoint in verl's FSDP layout (world size 1, verl's own
  FSDPCheckpointManager) under ``trainer.default_local_dir`` and exits 0;
- ``fail``: prints a verl-like error line and exits 3;
- ``hang``: prints ``STANDIN_WAITING pid=<pid>`` and sleeps until it is signalled;
- ``hang_once``: the first time (no checkpoint in ``trainer.default_local_dir`` yet) saves the checkpoint as ``ok``
  does, then waits as ``hang`` does (a run whose verl dies after a checkpoint: the test kills it); the next time
  acts as ``ok``;
- ``out_of_memory``: asks torch for 4 EiB after step 2: torch's real "DefaultCPUAllocator: can't allocate memory",
  uncaught, so the process dies with its traceback (exit 1) as verl's does;
- ``file_limit``: saves the checkpoint as ``ok`` does under a 64 KiB file-size limit (``ulimit -f``), so verl's
  checkpoint manager fails with the error a full disk gives (a disk cannot be filled on cue here).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

STEPS = 2
WAITING = "STANDIN_WAITING"
FILE_LIMIT_BYTES = 64 * 1024
# When set: a file the stand-in writes what it received into (config, environment, command lines), and it
# prints its resolved config as verl does.
RECEIVED = "VERLFLOW_STANDIN_RECEIVED"


def step_metrics(step: int) -> dict[str, float]:
    """The metrics the stand-in logs at ``step`` (verl's names, before sanitizing)."""
    return {
        "timing_s/gen": 1.0 + step,
        "timing_s/step": 2.0 * step,
        "critic/score/mean": 0.1 * step,
        "val-core/openai/gsm8k/reward/mean@1": 0.25 * step,
    }


def _record_received(cfg, path: str) -> None:
    """Write what this process was given (config, environment, its command line as ``ps`` shows it) to ``path``,
    and print the resolved config as verl's main_ppo does (its output is the run's verl.log)."""
    import json
    from pprint import pprint

    from omegaconf import OmegaConf

    resolved = OmegaConf.to_container(cfg, resolve=True)
    pprint(resolved)
    # The launch script exec's this process: its command line is the one the launch shows in ``ps``.
    cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    Path(path).write_text(json.dumps({"config": resolved, "env": dict(os.environ), "cmdline": cmdline}))


def _wait_for_a_signal() -> None:
    """Say ``STANDIN_WAITING pid=<pid>`` and sleep until a signal ends this process."""
    print(f"{WAITING} pid={os.getpid()}", flush=True)
    while True:
        signal.pause()


def main(argv: list[str]) -> int:
    from omegaconf import OmegaConf
    from verl.utils.tracking import Tracking

    from verlflow.config import parse_overrides, validate_against_verl

    cfg = validate_against_verl(parse_overrides(argv))
    mode = os.environ.get("VERLFLOW_STANDIN_MODE", "ok")
    if os.environ.get(RECEIVED):
        _record_received(cfg, os.environ[RECEIVED])
    logger = Tracking(project_name=cfg.trainer.project_name, experiment_name=cfg.trainer.experiment_name,
                      default_backend=list(cfg.trainer.logger), config=OmegaConf.to_container(cfg, resolve=True))
    for step in range(1, STEPS + 1):
        logger.log(data=step_metrics(step), step=step)
    if mode == "fail":
        print("RuntimeError: stand-in failure after step 2", flush=True)
        return 3
    if mode == "out_of_memory":
        import torch

        torch.empty(2**62, dtype=torch.uint8)
    if mode == "hang":
        _wait_for_a_signal()
    sys.path.insert(0, str(Path(__file__).parent))
    from fsdp_checkpoint import save_fsdp_checkpoint

    root = Path(cfg.trainer.default_local_dir)
    if mode == "file_limit":
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_BYTES, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    first_time = not (root / "latest_checkpointed_iteration.txt").exists()
    save_fsdp_checkpoint(cfg.actor_rollout_ref.model.path, str(root / f"global_step_{STEPS}" / "actor"),
                         world_size=1, fsdp=2, step=STEPS)
    (root / "latest_checkpointed_iteration.txt").write_text(str(STEPS))
    if mode == "hang_once" and first_time:
        _wait_for_a_signal()
    logger.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
