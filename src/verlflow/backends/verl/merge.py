"""The last verl checkpoint → a Hugging Face folder, with verl's own model merger.

    python -m verl.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor --target_dir HF

verl saves ``<default_local_dir>/global_step_N/actor/`` as one ``model_world_size_W_rank_R.pt`` shard per
rank, ``fsdp_config.json`` (FSDP version, world size) and ``huggingface/`` (config, tokenizer), and
records N in ``latest_checkpointed_iteration.txt``. :func:`last_actor_checkpoint` finds that folder and
:func:`merge_actor_checkpoint` runs verl's merger CLI on it; the result is what the registry logs.

    pytest tests/test_verl_merge.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from verlflow.backends.layout import newest_step, step_dir
from verlflow.errors import VerlflowError


def last_actor_checkpoint(checkpoint_dir: str | Path) -> Path:
    """``global_step_N/actor`` of the newest checkpoint under verl's ``trainer.default_local_dir``.

    N is verl's tracker file when it is there (verl writes it after a complete save), else the highest
    ``global_step_N`` with an ``actor/fsdp_config.json`` (async saves write no tracker).
    """
    root = Path(checkpoint_dir)
    step = newest_step(root, lambda folder: (folder / "actor" / "fsdp_config.json").is_file())
    if step is None:
        raise VerlflowError(
            f"no verl checkpoint under {root} (expected global_step_N/actor/fsdp_config.json): did the run "
            "reach its last step? With a Ray job the folder must be on storage shared with the cluster")
    return step_dir(root, step) / "actor"


def merge_command(actor_dir: str | Path, target_dir: str | Path, *, python: str | None = None) -> list[str]:
    """verl's merger command line for an FSDP actor checkpoint."""
    return [python or sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
            "--local_dir", str(actor_dir), "--target_dir", str(target_dir)]


def merge_actor_checkpoint(actor_dir: str | Path, target_dir: str | Path, *, log_path: str | Path) -> Path:
    """Merge an FSDP actor checkpoint into a Hugging Face folder (``config.json``, weights, tokenizer).

    Output is streamed to the console and ``log_path``; a failed merge is one line naming the log.
    """
    from verlflow.backends.verl.launch import run_streaming

    target = Path(target_dir)
    target.mkdir(parents=True, exist_ok=True)
    rc = run_streaming(merge_command(actor_dir, target), env=dict(os.environ), cwd=target.parent, log_path=log_path)
    if rc != 0 or not (target / "config.json").is_file():
        raise VerlflowError(f"verl's model merger failed on {actor_dir} (exit {rc}); see {log_path}")
    return target
