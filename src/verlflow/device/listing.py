"""What every device listing shares: the platform's collector, the visible-devices narrowing, MiB → GiB.

A platform's ``collector`` names a module with ``count_listed(probe) -> int`` (the devices its lister lists)
and ``fields(probe, environ) -> dict`` (name, count, memory_gb, driver, …, notes, extra: the
:class:`~verlflow.device.detect.DeviceProfile` fields); :mod:`.npu_listing` and :mod:`.gpu_listing` are the
shipped ones. A platform without one (the host CPU) lists nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from verlflow.platforms import Device, platform_of


def collector(device_type: Device | str) -> ModuleType | None:
    """The module that lists ``device_type``'s devices (its platform's ``collector``); None when it has none."""
    name = platform_of(device_type).collector
    return importlib.import_module(name) if name else None


def visible(total: int, device_type: Device | str, environ: Mapping[str, str]) -> tuple[int, str | None]:
    """(devices the process may use, a note when the platform's visible-devices variable narrows them)."""
    var = platform_of(device_type).visible_devices_var
    if var is None or var not in environ:
        return total, None
    count = min(total, len([e for e in environ[var].split(",") if e.strip()]))
    return count, (f"{var}={environ[var]} shows {count} of {total}" if count != total else None)


def gib(mib: float | None) -> float | None:
    """MiB as GiB, one decimal; None for a missing or zero figure."""
    return round(mib / 1024, 1) if mib else None
