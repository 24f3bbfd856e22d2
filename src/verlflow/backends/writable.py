"""Every folder a training writes is checked before anything trains: one line, not a crash mid-run.

    verlflow train --device cpu --overrides "verlflow.output_dir=/etc/passwd"   # one line, exit 2, no run

A ``verlflow.output_dir`` that was a file trained every step while the metric writer crashed four times and
the run's end-of-run keys were lost; a read-only HOME with the tiny model not yet built failed in a traceback
from deep in the build. :func:`check_writable_folders` names the folder and what to set instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from omegaconf import OmegaConf

from verlflow.config import ComposedConfig
from verlflow.errors import VerlflowError
from verlflow.models.model_path import SENTINELS, default_cache_dir
from verlflow.models.tinymodel import BUILD_VERSION
from verlflow.util import OUT_OF_SPACE, SPACE_PHRASE, check_output_dir, free_space

CHECKPOINT_KEY = "trainer.default_local_dir"


def check_writable_folders(cfg: ComposedConfig, folders: Iterable[tuple[Path, str]] = ()) -> None:
    """Raise one line when one of ``folders`` (``(folder, the setting naming it)``: the backend's logging
    folders), the run's checkpoint folder or the model cache it must build into cannot be written (a file where
    a folder is expected, no permission, a read-only file system)."""
    for folder, setting in folders:
        check_output_dir(folder, setting)
    if CHECKPOINT_KEY in cfg.overrides:
        check_output_dir(str(OmegaConf.select(cfg.resolved, CHECKPOINT_KEY)), CHECKPOINT_KEY)
    model = str(OmegaConf.select(cfg.resolved, "actor_rollout_ref.model.path") or "")
    cache = default_cache_dir()
    if model in SENTINELS and not any(cache.glob(f"{model}-v{BUILD_VERSION}-seed*/config.json")):
        check_model_cache(cache, model)  # it is built there first: a read-only HOME fails here, in one line


def check_model_cache(cache: Path, model: str) -> None:
    """One line, naming the variable to set, when the model cache ``cache`` cannot be written."""
    try:
        check_output_dir(cache, "model cache")
        cache.mkdir(parents=True, exist_ok=True)
        if not os.access(cache, os.W_OK | os.X_OK):
            raise PermissionError(f"no permission to write in {cache}")
    except (VerlflowError, OSError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise VerlflowError(f"model cache {cache} cannot be written ({reason}): {model} is built there once; set "
                            "VERLFLOW_CACHE to a writable folder (default ~/.cache/verlflow, under HOME)") from None


def write_error(exc: BaseException) -> str:
    """Why a write failed, in words: the OS's (``File too large``, also out of safetensors' "Error while serializing:
    I/O error: …"), or for torch's zip writer, which hides it, "the file stopped short" with torch's own words."""
    reason = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if stopped := re.search(r"unexpected pos \d+ vs \d+", reason):
        return f"the file stopped short: torch's {stopped.group(0)}"
    if phrase := SPACE_PHRASE.search(reason):
        return phrase.group(0)
    return reason


def out_of_space_advice(reason: str, folder: str | os.PathLike[str]) -> str | None:
    """When ``reason`` (an error line) says a write failed for space: the folder, its free space and what to
    do, as a clause to append; None otherwise."""
    if not OUT_OF_SPACE.search(reason):
        return None
    return (f"a write failed for space in {folder} ({free_space(folder)}): free space (or raise the file-size "
            f"limit, ulimit -f) or point {CHECKPOINT_KEY} / verlflow.output_dir at a larger disk; resume with "
            "--resume once it has room")
