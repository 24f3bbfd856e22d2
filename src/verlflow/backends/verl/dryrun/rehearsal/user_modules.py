"""The user's own modules, imported as verl's processes import them, so what they register is looked up too.

    verlflow train --dry_run true --profile my-a3.yaml \
        --overrides "actor_rollout_ref.rollout.agent.default_agent_loop=my_loop"

where ``my-a3.yaml``'s ``env`` sets ``VERL_USE_EXTERNAL_MODULES: my_agents`` (and ``PYTHONPATH`` to its folder).
verl imports every module named in ``VERL_USE_EXTERNAL_MODULES`` at the end of ``import verl`` (``verl/__init__.py``,
``import_external_libs``) in its driver and every Ray worker: a module there that calls
``@register("my_loop")`` (``experimental/agent_loop/agent_loop.py``) puts its agent loop into the registry the
workers look names up in. An agent loop may also be listed in ``agent.agent_loop_config_path`` (name and
``_target_``), which the workers load into the same registry and instantiate with ``hydra.utils.instantiate``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from verlflow.backends.verl.dryrun.rehearsal.raise_sites import message_of

EXTERNAL_MODULES = "VERL_USE_EXTERNAL_MODULES"
# verlflow's own plugins (CPU platform, secret guard) register no names the rehearsal looks up.
OWN_PREFIX = "verlflow."


def external_modules(launch_env: dict[str, str]) -> list[str]:
    """The modules verl's processes import: ``VERL_USE_EXTERNAL_MODULES`` of the launch's environment."""
    return [name.strip() for name in launch_env.get(EXTERNAL_MODULES, "").split(",")
            if name.strip() and not name.strip().startswith(OWN_PREFIX)]


@contextlib.contextmanager
def launch_path(launch_env: dict[str, str]) -> Iterator[None]:
    """The launch's ``PYTHONPATH`` first on ``sys.path`` for the block, as verl's processes have it."""
    extra = [p for p in launch_env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[:0] = extra
    try:
        yield
    finally:
        for path in extra:
            with contextlib.suppress(ValueError):
                sys.path.remove(path)


def import_external(launch_env: dict[str, str]) -> dict[str, str]:
    """Import the user's modules as ``import verl`` does; module → why it failed here (empty: all imported)."""
    failed = {}
    with launch_path(launch_env):
        for name in external_modules(launch_env):
            try:
                importlib.import_module(name)
            except Exception as exc:  # the user's module may raise anything at import
                failed[name] = f"{type(exc).__name__}: {message_of(exc)[:120]}"
    return failed


def locate(target: str, launch_env: dict[str, str]) -> Any:
    """The object a ``_target_`` dotted path names, found as hydra's ``_locate`` finds it (longest module prefix)."""
    parts = target.split(".")
    with launch_path(launch_env):
        for cut in range(len(parts) - 1, 0, -1):
            try:
                found: Any = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError as exc:
                if exc.name and not ".".join(parts[:cut]).startswith(exc.name):
                    raise  # the module exists but imports something missing: its own error
                continue
            for attribute in parts[cut:]:
                found = getattr(found, attribute)
            return found
    raise ModuleNotFoundError(f"No module named {parts[0]!r}", name=parts[0])
