"""The dry run's checks, registered by name like the trainers are, each declaring what it needs.

A check is one function of the dry run (a rule module's, or a stage of the rehearsal of verl's start-up),
registered under the name ``docs/preflight.md`` gives it (``module.function``); every row of that page names
exactly one registered check (``tests/test_preflight_doc.py``). What a check needs decides where it can run:

- ``config``: the resolved config alone;
- ``verl``: the installed verl's code (its registries, config dataclasses, functions);
- ``files``: the model, data or reward files the config names, on this machine (not for a Ray job, whose
  paths are the cluster's);
- ``devices``: the profile's device kind and world size (``n_gpus_per_node × nnodes``), by arithmetic;
- ``cluster``: the profile's cluster image (its verl and packages, ``config/stacks/``).

Two groups run in registration order: ``launch`` (:func:`verlflow.backends.verl.dryrun.preflight.launch_problems`
runs them, the rehearsal first) and ``rehearsal`` (its stages, run by
:func:`verlflow.backends.verl.dryrun.rehearsal.rehearse` on one shared :class:`~.rehearsal.state.Rehearsal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NEEDS = ("config", "verl", "files", "devices", "cluster")
GROUPS = ("launch", "rehearsal")


@dataclass(frozen=True)
class Check:
    """One registered check: its name in docs/preflight.md, what it needs, and how it runs.

    ``run`` takes the group's state (a launch's :class:`~.preflight.Launch`, or the rehearsal) and returns
    what it found; ``after`` names checks of the same group that must have passed first, and ``unmet`` is
    what the dry run says when they did not (empty: nothing).
    """

    name: str
    group: str
    needs: frozenset[str]
    run: Callable[[Any], Any]
    after: tuple[str, ...] = ()
    unmet: str = ""


_CHECKS: dict[str, Check] = {}


def register(name: str, *, group: str, needs: tuple[str, ...], after: tuple[str, ...] = (),
             unmet: str = "") -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register the decorated function as the check ``name`` of ``group`` (run in registration order)."""
    unknown = set(needs) - set(NEEDS)
    if group not in GROUPS or unknown or not needs:
        raise ValueError(f"check {name}: group {group!r} (one of {GROUPS}), needs {needs} (some of {NEEDS})")

    def add(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if name in _CHECKS:
            raise ValueError(f"check {name} is registered twice")
        missing = [a for a in after if a not in _CHECKS or _CHECKS[a].group != group]
        if missing:
            raise ValueError(f"check {name} runs after {missing}, which are not registered before it in {group}")
        _CHECKS[name] = Check(name, group, frozenset(needs), run, tuple(after), unmet)
        return run

    return add


def registered(group: str | None = None) -> tuple[Check, ...]:
    """The registered checks (of ``group``), in the order they run; importing
    :mod:`verlflow.backends.verl.dryrun.preflight` registers all of them (it imports the rehearsal, which registers its
    stages), so a caller that needs every check imports that module first."""
    return tuple(c for c in _CHECKS.values() if group is None or c.group == group)


__all__ = ["NEEDS", "GROUPS", "Check", "register", "registered"]
