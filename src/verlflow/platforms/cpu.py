"""The host CPU: nothing to list or narrow, gloo, torch's profiler, the ``cpu`` profile and the smoke recipe."""

from verlflow.platforms.base import Platform

PLATFORM = Platform(kind="cpu", word="CPU", torch_type="cpu", default_profile="cpu", accelerator=False)
