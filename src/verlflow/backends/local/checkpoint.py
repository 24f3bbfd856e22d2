"""Checkpoints of the local GRPO trainer: a Hugging Face folder plus what resuming needs.

    ls checkpoints/<project>/<experiment>/global_step_4/actor/huggingface

Layout under ``trainer.default_local_dir`` (verl's own names, so one habit serves both backends)::

    latest_checkpointed_iteration.txt     the newest complete step, as verl writes it
    global_step_<N>/
      actor/huggingface/                  save_pretrained model + tokenizer: what gets registered
      trainer_state.pt                    optimizer, lr scheduler, global step, RNG states

A checkpoint is written into a hidden temporary folder and renamed into place, and the tracker file is
replaced atomically afterwards, so a run killed while saving never leaves a half checkpoint that
``trainer.resume_mode=auto`` would pick up.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from verlflow.backends.layout import complete_steps, newest_step, step_dir, step_of, write_tracker
from verlflow.backends.writable import free_space, write_error
from verlflow.errors import StepFailed, VerlflowError
from verlflow.models.tinymodel import make_tokenizer_config_portable

STATE_FILE = "trainer_state.pt"
HF_SUBDIR = Path("actor") / "huggingface"


def hf_dir(checkpoint: str | os.PathLike[str]) -> Path:
    """The Hugging Face model folder inside a ``global_step_<N>`` checkpoint."""
    return Path(checkpoint) / HF_SUBDIR


def rng_state() -> dict[str, Any]:
    """Every RNG the trainer draws from (sampling, shuffles), to continue a run exactly."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | os.PathLike[str], step: int, model: Any, tokenizer: Any, state: dict[str, Any],
    *, keep: int | None = None,
) -> Path:
    """Write ``global_step_<step>`` atomically, point the tracker at it, keep the newest ``keep``.

    Returns the checkpoint's Hugging Face folder.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(hf_dir(tmp))
        tokenizer.save_pretrained(hf_dir(tmp))
        make_tokenizer_config_portable(hf_dir(tmp))
        torch.save(state, tmp / STATE_FILE)
    except (OSError, RuntimeError, SafetensorError) as exc:  # a full disk, a file-size limit (safetensors: own type)
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_failure(root, step, exc) from None
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    write_tracker(root, step)
    if keep and keep > 0:
        for old in complete_steps(root, _is_complete)[:-keep]:
            shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return hf_dir(final)


def _is_complete(checkpoint: Path) -> bool:
    """A local-trainer checkpoint holds its trainer state and a loadable Hugging Face folder."""
    return (checkpoint / STATE_FILE).is_file() and (hf_dir(checkpoint) / "config.json").is_file()


def find_resume_checkpoint(root: str | os.PathLike[str], mode: str, resume_from: str | None) -> Path | None:
    """The checkpoint to resume from (verl's ``trainer.resume_mode``): auto | disable | resume_path."""
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = Path(str(resume_from)).expanduser()
        if not _is_complete(path):
            raise VerlflowError(
                f"trainer.resume_from_path={resume_from} is not a local-trainer checkpoint: give a "
                f"global_step_<N> folder holding {STATE_FILE} and {HF_SUBDIR}"
            )
        return path
    step = newest_step(root, _is_complete)
    return None if step is None else step_dir(root, step)


def resume_candidates(root: str | os.PathLike[str], mode: str, resume_from: str | None) -> list[Path]:
    """The checkpoints a resume may read, best first: :func:`find_resume_checkpoint`'s, then (``auto``) every
    older complete one, so that a newest checkpoint that cannot be read falls back to the one before it."""
    found = find_resume_checkpoint(root, mode, resume_from)
    if found is None or mode != "auto":
        return [] if found is None else [found]
    older = [step_dir(root, step) for step in reversed(complete_steps(root, _is_complete))]
    return [found, *(path for path in older if path != found)]


def write_failure(root: Path, step: int, exc: BaseException) -> StepFailed:
    """One line for a checkpoint that could not be written: the folder, why, and the free space there (a failure of
    the machine, not of the input: a run ``mlflow run`` opened is named "train · failed: …")."""
    return StepFailed(f"the step-{step} checkpoint could not be written to {root} ({write_error(exc)}; "
                         f"{free_space(root)}): "
                         "free space (or raise the file-size limit, ulimit -f) or point trainer.default_local_dir / "
                         "verlflow.output_dir at a larger disk; resume with --resume once it has room")


def load_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer state saved with a checkpoint (optimizer, scheduler, step, RNG)."""
    # Our own file, written by save_checkpoint: it holds numpy RNG state, so not weights-only.
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)


def checkpoint_step(checkpoint: str | os.PathLike[str]) -> int:
    """N of a ``global_step_<N>`` folder."""
    step = step_of(checkpoint)
    if step is None:
        raise VerlflowError(f"checkpoint folder '{checkpoint}' is not named global_step_<N>")
    return step
