"""What "the same work" is, declared once: the recipe, the model, and the settings that fix how much a run computes.

    python -c "from verlflow.compare.same_work import WORK; print([key.label for key in WORK])"

Two sides do the same work when every key of :data:`WORK` reads the same on both; only then does ``compare`` give a
speed verdict (:mod:`verlflow.compare.first_screen`), and a difference is named on the first screen's first line.
The model is known by its name (the last part of ``actor_rollout_ref.model.path``: ``Qwen/Qwen3-4B`` and
``/models/Qwen3-4B`` are one model), so a path that differs between machines is not a difference, another model is.
Plain computation on :class:`RunSnapshot` objects.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from verlflow import names
from verlflow.compare.snapshot import RunSnapshot
from verlflow.names import RECIPE_TAG

MODEL_PATH_PARAM = "actor_rollout_ref/model/path"
# The folder verlflow builds a tiny model into (models.model_path: <name>-v<N>-seed<seed>): one model with its name,
# which is what the local trainer logs while verl logs the folder.
_BUILT = re.compile(r"^(tiny-qwen3(?:-sft)?)-v\d+-seed\d+$")
UNSET = (None, "", "None", "null")


@dataclass(frozen=True)
class WorkKey:
    """One thing the same work shares: how the first screen names it, and how it is read from a run."""

    label: str
    read: Callable[[RunSnapshot], str | None]


def model_name(snap: RunSnapshot) -> str | None:
    """The model a run trained, by name: the last part of its model path (``Qwen3-4B``); None when not logged."""
    path = snap.params.get(MODEL_PATH_PARAM)
    if path in UNSET:
        return None
    name = str(path).rstrip("/").rsplit("/", 1)[-1] or str(path)
    return _BUILT.sub(r"\1", name)  # verlflow's own tiny model: its name, or the folder it was built into


def steps(snap: RunSnapshot) -> str | None:
    """Training steps: ``trainer.total_training_steps`` as configured, else the length of the reward curve."""
    configured = snap.params.get("trainer/total_training_steps")
    if configured not in UNSET:
        return configured
    curve = snap.histories.get(names.SCORE_MEAN)
    return str(len(curve)) if curve else None


def _param(key: str) -> Callable[[RunSnapshot], str | None]:
    return lambda snap: snap.params.get(key)


# Everything that fixes how much one run computes. A difference in any of them makes two runs different work:
# another model, more samples per step, more passes over each batch (ppo_epochs), longer answers allowed, more steps.
WORK: tuple[WorkKey, ...] = (
    WorkKey("recipe", lambda snap: snap.tags.get(RECIPE_TAG)),
    WorkKey("model", model_name),
    WorkKey("batch", _param("data/train_batch_size")),
    WorkKey("rollout n", _param("actor_rollout_ref/rollout/n")),
    WorkKey("ppo_epochs", _param("actor_rollout_ref/actor/ppo_epochs")),
    WorkKey("max response length", _param("data/max_response_length")),
    WorkKey("rollout response length", _param("actor_rollout_ref/rollout/response_length")),
    WorkKey("steps", steps),
)


def work_differences(baseline: RunSnapshot, candidate: RunSnapshot) -> list[str]:
    """How the two sides' work differs, one entry per differing key of :data:`WORK`: ``ppo_epochs 1 vs 2``."""
    out = []
    for key in WORK:
        base, cand = key.read(baseline), key.read(candidate)
        if base != cand:
            out.append(f"{key.label} {base or '?'} vs {cand or '?'}")
    return out
