"""Where a recipe's model path points: a built-on-demand tiny model, a local folder, or a hub id.

    python -c "from verlflow.models.model_path import resolve_model_path; print(resolve_model_path('tiny-qwen3'))"

:func:`resolve_model_path` turns a recipe's ``actor_rollout_ref.model.path`` into something
``from_pretrained`` accepts: the names ``tiny-qwen3`` (:mod:`.tinymodel`, untrained) and ``tiny-qwen3-sft``
(:mod:`.tinymodel_sft`, warm-started) are built once into a cache folder and reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from verlflow.errors import VerlflowError
from verlflow.models.tinymodel import BUILD_VERSION, build_tiny_model
from verlflow.models.tinymodel_sft import SFT_STEPS, build_warm_started_model

# The model path a recipe uses to ask for the tiny model as initialised (untrained).
TINY_SENTINEL = "tiny-qwen3"
# ... and for the warm-started one (verlflow.models.tinymodel_sft; the smoke recipe uses it).
SFT_SENTINEL = "tiny-qwen3-sft"
SENTINELS = (TINY_SENTINEL, SFT_SENTINEL)


def default_cache_dir() -> Path:
    """Where built tiny models are kept: ``$VERLFLOW_CACHE`` or ``~/.cache/verlflow``."""
    return Path(os.environ.get("VERLFLOW_CACHE") or Path.home() / ".cache" / "verlflow")


def resolve_model_path(path_or_id: str, cache_dir: str | os.PathLike[str] | None = None, *, seed: int = 0) -> str:
    """Turn a recipe's model path into what ``from_pretrained`` accepts.

    ``tiny-qwen3`` / ``tiny-qwen3-sft`` → that model, built once into ``<cache>/<sentinel>-v<N>-seed<seed>``
    (atomically: built in a temporary folder, then renamed) and reused after; an existing folder →
    itself; a path that looks local but does not exist → a one-line error; anything else is a hub id,
    returned as is.
    """
    if path_or_id in SENTINELS:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        target = root / f"{path_or_id}-v{BUILD_VERSION}-seed{seed}"
        if not (target / "config.json").is_file():
            how = f" with a warm start of {SFT_STEPS} steps (minutes on a CPU)" if path_or_id == SFT_SENTINEL else ""
            print(f"model: building {path_or_id} once{how}; cached in {target}", flush=True)
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
            try:
                _build_sentinel(path_or_id, tmp, seed)
                try:
                    tmp.rename(target)
                except OSError:
                    # Another process finished the same build first; its copy is identical.
                    if not (target / "config.json").is_file():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return str(target)
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise VerlflowError(f"model folder '{path_or_id}' has no config.json: give a Hugging Face model folder")
        return str(path)
    if _looks_local(path_or_id):
        raise VerlflowError(
            f"model path '{path_or_id}' does not exist: give a Hugging Face model folder, a hub id "
            f"(e.g. Qwen/Qwen3-0.6B), '{SFT_SENTINEL}' or '{TINY_SENTINEL}'"
        )
    return path_or_id


def _build_sentinel(sentinel: str, folder: Path, seed: int) -> None:
    if sentinel == SFT_SENTINEL:
        build_warm_started_model(folder, seed=seed)
    else:
        build_tiny_model(folder, seed=seed)


def is_hub_id(path_or_id: str) -> bool:
    """Whether a model reference that is no existing folder reads as a hub id (``name`` or ``org/name``)."""
    return bool(path_or_id.strip()) and path_or_id not in SENTINELS and not _looks_local(path_or_id)


def _looks_local(path_or_id: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with a path shape is meant as a folder."""
    if path_or_id.startswith(("/", ".", "~")) or "\\" in path_or_id:
        return True
    return path_or_id.count("/") > 1
