"""verl's checkpoint folder layout, which both backends write and read.

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt    N of the newest complete save
        global_step_<N>/actor/...            one folder per saved step

verl writes the tracker file after a complete save; an interrupted or asynchronous save may leave a
``global_step_<N>`` without it, so a reader trusts the tracker only when its step is complete and otherwise
takes the highest complete step. What "complete" means is the backend's own (verl: an FSDP actor shard
config; the local trainer: a Hugging Face folder plus trainer state).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"global_step_(\d+)")


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """``<root>/global_step_<step>``."""
    return Path(root) / f"global_step_{step}"


def step_of(folder: str | os.PathLike[str]) -> int | None:
    """N of a ``global_step_<N>`` folder, None for any other name."""
    match = _STEP_DIR.fullmatch(Path(folder).name)
    return int(match.group(1)) if match else None


def complete_steps(root: str | os.PathLike[str], is_complete: Callable[[Path], bool]) -> list[int]:
    """The steps under ``root`` whose ``global_step_<N>`` folder ``is_complete``, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(step for child in root.iterdir()
                  if (step := step_of(child)) is not None and is_complete(child))


def newest_step(root: str | os.PathLike[str], is_complete: Callable[[Path], bool]) -> int | None:
    """The step a resume or a merge should read: the tracker's when complete, else the highest complete one."""
    tracker = Path(root) / TRACKER_FILE
    if tracker.is_file():
        text = tracker.read_text().strip()
        if text.isdigit() and is_complete(step_dir(root, int(text))):
            return int(text)
    steps = complete_steps(root, is_complete)
    return steps[-1] if steps else None


def write_tracker(root: str | os.PathLike[str], step: int) -> None:
    """Point the tracker file at ``step``, atomically (a reader never sees a half-written number)."""
    tmp = Path(root) / f".{TRACKER_FILE}.tmp"
    tmp.write_text(f"{step}\n")
    os.replace(tmp, Path(root) / TRACKER_FILE)
