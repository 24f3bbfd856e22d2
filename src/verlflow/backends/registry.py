"""The trainers behind one interface, registered by name as verl registers its advantage estimators.

    python -c "from verlflow.backends.registry import backend_names; print(backend_names())"

A backend is a :class:`TrainBackend` subclass decorated with ``@register_backend("<name>")``; ``steps/train.py``
asks :func:`get_backend` for the one the user chose (or :func:`default_backend` for the device) and calls the
interface, never a backend's own modules. The two built-in backends register when their ``entry`` module is
imported (:data:`BUILTIN_MODULES`, on the first lookup); a backend of one's own registers by importing its
module before the step runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from verlflow.config import ComposedConfig
from verlflow.errors import VerlflowError
from verlflow.platforms import Device, Platform
from verlflow.tracking.run_logger import RunLogger, RunLogging, direct_logging

AUTO = "auto"
# The modules whose import registers the shipped backends (the local trainer, the verl launch).
BUILTIN_MODULES = ("verlflow.backends.local.entry", "verlflow.backends.verl.entry")
_REGISTRY: dict[str, TrainBackend] = {}


@dataclass(frozen=True)
class TrainLaunch:
    """How the user asked to train, beyond the composed config: what a backend may refuse or use."""

    # The folder holding train.parquet / test.parquet.
    data_dir: str
    # Compose, validate, log and print the launch without running it.
    dry_run: bool = False
    # A Ray cluster to submit to ('' = here).
    ray_address: str = ""
    # A train run id to continue in place from its last checkpoint ('' = a new training).
    resume: str = ""


class TrainBackend:
    """What the train step asks of a trainer. Subclass it, set ``name`` through :func:`register_backend`."""

    # The registered name (``local``, ``verl``): the ``backend`` step parameter and the run's verlflow.backend tag.
    name: ClassVar[str] = ""
    # Whether it trains on a device of this platform when the user says backend=auto (verl: the accelerators,
    # local: the host CPU), so a kind added later has a default backend without naming it here.
    default_for: ClassVar[Callable[[Platform], bool]] = staticmethod(lambda platform: False)
    # Profiles it needs instead of the device's default one (verl on the CPU: cpu-verl).
    profile_for: ClassVar[Mapping[Device, str]] = {}
    # Whether the config's counts and both data splits are checked before the run opens (the verl launch leaves
    # them to its preflight, which lists them with every other launch mistake).
    checks_up_front: ClassVar[bool] = True

    def find_cluster(self, launch: TrainLaunch) -> Any:
        """Before anything is composed: reach what the launch needs outside this machine (a Ray cluster)."""
        return None

    def check_config(self, cfg: ComposedConfig) -> None:
        """Refuse, in one line, a composed config this trainer cannot run (the search checks each choice)."""

    def prepare(self, cfg: ComposedConfig, launch: TrainLaunch, cluster: Any) -> Any:
        """Before the run opens: refuse what cannot work (seconds, not minutes); what :meth:`train` needs."""
        return None

    def run_logging(self, cfg: ComposedConfig) -> RunLogging:
        """How its runs log metrics, tables and tags, and the folders that needs (default: straight to MLflow)."""
        return direct_logging()

    def samples_system_metrics(self, launch: TrainLaunch) -> bool:
        """Whether the run samples system metrics while it trains (a dry run launches nothing)."""
        return True

    def train(self, cfg: ComposedConfig, launch: TrainLaunch, *, run_id: str, started_at: float,
              prepared: Any, logger: RunLogger | None = None) -> Any:
        """Train inside the open run ``run_id``, writing into it through ``logger`` (what :meth:`run_logging`
        opened for it; a backend whose trainer logs by itself may leave it); the backend's result."""
        raise NotImplementedError(f"backend '{self.name}' does not train")


def register_backend(name: str) -> Callable[[type[TrainBackend]], type[TrainBackend]]:
    """Class decorator: register a :class:`TrainBackend` under ``name`` (a second one under a name is an error)."""

    def decorate(cls: type[TrainBackend]) -> type[TrainBackend]:
        if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
            raise ValueError(f"backend '{name}' is already registered ({type(_REGISTRY[name]).__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls()
        return cls

    return decorate


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def backend_names() -> tuple[str, ...]:
    """Every registered backend's name, sorted."""
    _load_builtins()
    return tuple(sorted(_REGISTRY))


def get_backend(name: str) -> TrainBackend:
    """The backend registered as ``name``; one line naming the valid ones for an unknown one."""
    _load_builtins()
    if name not in _REGISTRY:
        raise VerlflowError(f"unknown backend '{name}': use one of {', '.join((AUTO, *backend_names()))}")
    return _REGISTRY[name]


def default_backend(dev: Device) -> TrainBackend:
    """The backend that trains on ``dev`` when the user says backend=auto."""
    _load_builtins()
    found = [b for b in _REGISTRY.values() if b.default_for(Device(dev).platform)]
    if len(found) != 1:
        raise VerlflowError(f"{len(found)} backends train on {dev} by default: name one with -P backend=…")
    return found[0]
