"""Resume: the branch verl takes (``RayPPOTrainer._load_checkpoint``) and the checkpoint's layout against the run.

verl's FSDP checkpoint manager (``utils/checkpoint/fsdp_checkpoint_manager.py``, 0.5.0 and 0.9.1 alike) saves
one ``model_/optim_/extra_state_world_size_<W>_rank_<r>.pt`` per rank and each rank of the resuming run loads
the file of its own world size and rank: a checkpoint written at 8 devices cannot resume a 16-device run.
"""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ACTOR
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import value_of
from verlflow.compat import verl as compat_verl
from verlflow.errors import Problem

# verl's FSDP checkpoint files (utils/checkpoint/fsdp_checkpoint_manager.py): one per rank of the saving run.
SHARD = re.compile(r"(?:model|optim|extra_state)_world_size_(\d+)_rank_\d+\.pt")


def world_size_problems(cfg: DictConfig, folders: list[str]) -> list[Problem]:
    """A checkpoint saved by a run of another world size: each rank loads ``model_world_size_<W>_rank_<r>.pt``
    of its own world size (``FSDPCheckpointManager.load_checkpoint``), which that checkpoint does not hold."""
    nodes, per_node = value_of(cfg, "trainer.nnodes"), value_of(cfg, "trainer.n_gpus_per_node")
    if not (isinstance(nodes, int) and isinstance(per_node, int)):
        return []
    world = nodes * per_node
    for folder in folders:
        sizes = {int(m.group(1)) for name in os.listdir(folder) if (m := SHARD.fullmatch(name))}
        if sizes and world not in sizes:
            key = ("trainer.resume_from_path" if value_of(cfg, "trainer.resume_mode") == "resume_path"
                   else "trainer.default_local_dir")
            return [Problem(key, value_of(cfg, key), (
                f"{folder} was saved at world size {', '.join(map(str, sorted(sizes)))} and this run has {world} "
                f"devices (n_gpus_per_node × nnodes): each rank loads model_world_size_{world}_rank_<r>.pt "
                "(utils/checkpoint/fsdp_checkpoint_manager.py), which is not there: resume on the same world size, "
                "or start fresh (trainer.resume_mode=disable)"))]
        if sizes:
            missing = _missing_shards(cfg, folder, world)
            if missing:
                return [missing]
    return []


# What each entry of checkpoint.load_contents makes every rank load (fsdp_checkpoint_manager.py:213, :233, :241).
LOADED = {"model": "model", "optimizer": "optim", "extra": "extra_state"}


def _missing_shards(cfg: DictConfig, folder: str, world: int) -> Problem | None:
    """The files of ``load_contents`` some rank of ``world`` would not find in ``folder`` (a model-only save)."""
    section = "critic" if os.path.basename(os.path.normpath(folder)) == "critic" else ACTOR
    contents = value_of(cfg, f"{section}.checkpoint.load_contents")
    contents = list(contents) if isinstance(contents, (list, tuple)) else list(LOADED)
    present = set(os.listdir(folder))
    lacking = [f"{LOADED[c]}_world_size_{world}_rank_<r>.pt ({c})" for c in contents if c in LOADED and
               any(f"{LOADED[c]}_world_size_{world}_rank_{r}.pt" not in present for r in range(world))]
    if not lacking:
        return None
    key = "trainer.resume_from_path" if value_of(cfg, "trainer.resume_mode") == "resume_path" else \
        "trainer.default_local_dir"
    return Problem(key, value_of(cfg, key), (
        f"{folder} lacks {', '.join(lacking)} for some of the {world} ranks, and each rank loads every entry of "
        f"{section}.checkpoint.load_contents={contents} (utils/checkpoint/fsdp_checkpoint_manager.py:"
        "load_checkpoint): resume from a checkpoint saved with them, or load only what it holds "
        f"({section}.checkpoint.load_contents=['model'] starts the optimizer fresh)"))


class _CheckpointLoads:
    """Stands for a Ray worker group in ``_load_checkpoint``: a load needs the folder verl would read."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def load_checkpoint(self, path: str, **_: Any) -> None:
        """Record the load; a folder that does not exist fails as the worker's load would."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no checkpoint folder {path}")
        self.paths.append(path)


def resume(rehearsal: Any) -> None:
    """The resume branch verl takes (``RayPPOTrainer._load_checkpoint``) with the folders that exist."""
    trainer = rehearsal.trainer
    load = compat_verl.load_checkpoint(trainer)
    if load is None:
        rehearsal.findings.skipped.append("resume: this verl's trainer has no _load_checkpoint")
        return
    trainer.actor_rollout_wg = _CheckpointLoads()
    trainer.critic_wg = _CheckpointLoads()
    ok, _ = rehearsal.attempt("resume", load)
    if ok:
        rehearsal.findings.problems += world_size_problems(
            rehearsal.cfg, trainer.actor_rollout_wg.paths + trainer.critic_wg.paths)
