"""verl on the CPU: loaded into every verl process of a ``device=cpu`` launch through verl's own hook.

    VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl.cpu_plugin VERL_PLATFORM=cpu python -m verl.trainer.main_ppo …

verl (>= 0.9) imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` at the end of ``import verl``, in
the driver and in every Ray worker (workers inherit the variable). The launch environment of the
``cpu-verl`` profile sets it; no NPU/GPU profile does, so none of this ever runs on a real accelerator.
What it does, registries first:

1. registers a ``cpu`` platform in verl's ``PlatformRegistry`` (gloo, a device module of no-ops where
   ``torch.cpu`` has none, ``current_device() == "cpu"``), selected by ``VERL_PLATFORM=cpu``; its Ray
   resource is ``GPU`` because verl's resource checks count only GPU/NPU (Ray is given a fake one through
   ``RAY_OVERRIDE_RESOURCES``);
2. registers verl's FSDP engines for device ``cpu`` in ``EngineRegistry``;
3. registers an ``hf`` rollout (:mod:`.cpu_rollout`) in ``_ROLLOUT_REGISTRY`` and
   ``RolloutReplicaRegistry``;
4. patch: ``verl.utils.distributed.initialize_global_process_group_ray`` — verl builds the process-group
   backend as ``cpu:gloo,{device}:{backend}``, on the CPU ``cpu:gloo,cpu:gloo``, which torch rejects, and
   offers no hook for it; the wrapper passes ``cpu:gloo`` when the caller gave no backend;
5. patch: ``verl.utils.import_utils.is_trl_available`` returns False — verl 0.9.1's ``apply_monkey_patch``
   imports ``AutoModelForCausalLMWithValueHead`` whenever TRL is installed, which TRL >= 1 no longer has;
6. patch: ``CPUOffloadPolicy`` as the FSDP engine module sees it never pins memory — the engine gives the
   forward-only reference model ``CPUOffloadPolicy(pin_memory=True)`` unconditionally (no config key), and
   pinning needs an accelerator;
7. torch threads: no more than the cores other processes leave free when the process starts (a CPU shared with
   other work; the ``cpu-verl`` profile's ``OMP_WAIT_POLICY=PASSIVE`` keeps waiting OpenMP threads asleep);
8. verl's and Ray's known noise dropped in this process (:func:`verlflow.known_warnings.install_in_verl_process`), and
   verl's rollout traces given their prompt, response, reward and step on the root span
   (:mod:`verlflow.compat.verl_traces`).
"""

from __future__ import annotations

import importlib
import os
import types

import psutil
import torch

try:
    from verl.plugin.platform import PlatformBase, PlatformRegistry
except ImportError:  # verl < 0.9 has no platform registry
    raise ImportError("verl on the CPU needs verl >= 0.9 (its platform registry); install a newer verl "
                      "or use backend=local") from None

from verlflow.compat import verl as compat_verl

PLATFORM_NAME = "cpu"
# actor_rollout_ref.rollout.name of verlflow.backends.verl.cpu_rollout.
ROLLOUT_NAME = "hf"


def _noop(*_args, **_kwargs):
    return None


def _zero(*_args, **_kwargs):
    return 0


def _mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus no-ops for the ``torch.cuda`` calls verl makes that ``torch.cpu`` lacks."""
    module = types.ModuleType("verlflow_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    extras = {
        "empty_cache": _noop, "ipc_collect": _noop, "set_per_process_memory_fraction": _noop,
        "reset_peak_memory_stats": _noop, "memory_allocated": _zero, "memory_reserved": _zero,
        "max_memory_allocated": _zero, "max_memory_reserved": _zero, "mem_get_info": _mem_get_info,
        "get_rng_state": lambda *_a, **_k: torch.get_rng_state(),
        "set_rng_state": lambda state, *_a, **_k: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed, "manual_seed_all": torch.manual_seed,
        "get_device_name": lambda *_a, **_k: "cpu", "set_device": _noop,
    }
    for name, fn in extras.items():
        setattr(module, name, fn)
    return module


class PlatformCPU(PlatformBase):
    """verl's device abstraction for a machine without an accelerator (training and rollout on the CPU)."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu selects it.
        return False

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str):
        import contextlib

        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl sizes its placement groups and checks capacity in GPU/NPU units only.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def _register_platform() -> None:
    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def _register_engines() -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            if not compat_verl.engine_registered(model_type, backend, PLATFORM_NAME):
                EngineRegistry.register(model_type=model_type, backend=backend, device=PLATFORM_NAME)(engine)


def _unpinned_offload_policy() -> type:
    from torch.distributed.fsdp import CPUOffloadPolicy

    class UnpinnedCPUOffloadPolicy(CPUOffloadPolicy):
        """``CPUOffloadPolicy`` that ignores ``pin_memory=True``: there is no accelerator to pin for."""

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    return UnpinnedCPUOffloadPolicy


def _register_rollout() -> None:
    # By name and by loader: verl_cpu_rollout imports verl, so importing it here (inside ``import verl``) is circular.
    from verl.workers.rollout import replica

    module = "verlflow.backends.verl.cpu_rollout"
    compat_verl.register_rollout_class(ROLLOUT_NAME, "async", f"{module}.HFServerAdapter")
    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: importlib.import_module(module).HFReplica)


def install() -> None:
    """Register the CPU platform, engines and ``hf`` rollout, and apply the patches (idempotent; the patches of
    verl's namespace are :mod:`verlflow.compat.verl`'s ``patch_*``)."""
    _register_platform()
    compat_verl.patch_process_group_backend("cpu:gloo")
    compat_verl.patch_trl_unavailable()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
        _register_engines()
        compat_verl.patch_fsdp_offload_policy(_unpinned_offload_policy())
        _share_cores()
    _register_rollout()
    from verlflow import known_warnings
    from verlflow.compat import verl_traces

    known_warnings.install_in_verl_process()
    verl_traces.install()


def _share_cores() -> None:
    """This verl process's torch threads: at most the profile's ``OMP_NUM_THREADS``, no more than the cores other
    processes leave free as it starts (the profile's ``OMP_WAIT_POLICY=PASSIVE`` keeps waiting threads asleep);
    see :mod:`verlflow.device.cpu_share`."""
    from verlflow.device.cpu_share import free_cores

    limit = os.environ.get("OMP_NUM_THREADS", "")
    threads = free_cores()
    if limit.isdigit() and int(limit) > 0:
        threads = min(threads, int(limit))
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)


install()
