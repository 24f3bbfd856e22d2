"""Prices for ``compare``'s cost figures, in the unit each is quoted in: per chip-hour, node-hour or device-hour.

    verlflow compare --baseline <h20 run> --candidate <a3 run> --prices prices.yaml

A buyer is quoted per card or chip (``chip_hour``), per server (``node_hour``) or, on some clouds, per device as
verl counts them (``device_hour``). These differ on an A3: verl counts each of a 910C chip's two dies as a
device, so a per-chip price typed as ``device_hour`` would double the A3's cost. The template,
``docs/prices-template.yaml``, names the unit of every profile; :func:`read_prices` reads such a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from verlflow.errors import VerlflowError

# unit → what one of it is
PRICE_UNITS = {"chip_hour": "chip", "node_hour": "node", "device_hour": "device"}
EXAMPLE = "{chip_hour: 2.4}, {node_hour: 20.0} or {device_hour: 1.2}"


@dataclass(frozen=True)
class Price:
    """One profile's price: an amount per hour of one ``chip``, ``node`` or ``device`` (verl's count)."""

    amount: float
    unit: str  # a key of PRICE_UNITS

    @property
    def per(self) -> str:
        """What the price is for: ``chip``, ``node`` or ``device``."""
        return PRICE_UNITS[self.unit]


def read_prices(path: str) -> dict[str, Price]:
    """``-P prices=<yaml>``: profile name → :class:`Price`; one line naming the bad entry for a bad file.

    The file maps each profile to one price, per chip-hour, node-hour or device-hour (verl's devices: an A3
    device is one die, half a 910C chip)::

        h20: {node_hour: 20.0}
        a3: {chip_hour: 3.0}
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise VerlflowError(f"prices={path}: no such file: give a YAML file such as 'h20: {{node_hour: 20.0}}' "
                            "(template: docs/prices-template.yaml)")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise VerlflowError(f"prices={path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise VerlflowError(f"prices={path}: expected a mapping of profile → one of {EXAMPLE}")
    out = {}
    for profile, entry in data.items():
        valid = isinstance(entry, dict) and len(entry) == 1 and next(iter(entry)) in PRICE_UNITS
        value = next(iter(entry.values())) if valid else None
        if not valid or isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise VerlflowError(f"prices={path}: profile '{profile}' has {entry!r}: give one positive price, "
                                f"{EXAMPLE}")
        out[str(profile)] = Price(float(value), next(iter(entry)))
    return out
