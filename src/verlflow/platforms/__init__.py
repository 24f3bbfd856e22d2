"""Device kinds as platform objects: one module per kind, registered here (like the trainers' registry).

- :mod:`.base`: :class:`Platform` (what differs by kind), :class:`Device` (a registered kind's name), the registry.
- :mod:`.npu`, :mod:`.gpu`, :mod:`.cpu`: the three kinds verlflow ships.
- :mod:`.tags`: the ``device.*`` tag names.

It imports nothing else of verlflow, so ``config`` (profiles name a Device) and ``device`` (detection, identity)
both stand on it. Adding a kind is one module calling :func:`register` plus its profile YAML (docs/hardware.md).
"""

from verlflow.platforms import cpu, gpu, npu
from verlflow.platforms.base import Device, Platform, kinds, platform_of, register, unregister

for _shipped in (npu, gpu, cpu):  # in this order: messages list "npu, gpu, cpu"
    register(_shipped.PLATFORM)
Device.NPU, Device.GPU, Device.CPU = Device("npu"), Device("gpu"), Device("cpu")

__all__ = ["Device", "Platform", "kinds", "platform_of", "register", "unregister"]
