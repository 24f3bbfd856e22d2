"""What ``auto`` means on each device: the recipe and the profile a step uses when the user names none.

    python -c "from verlflow.config.device_defaults import default_recipe; print(default_recipe('npu'))"

The table of :mod:`verlflow.backends.train_setup` (which also detects the device and picks the backend);
here as plain data so that ``models`` (evaluate's default data) reads it without importing a backend.
"""

from __future__ import annotations

from verlflow.config.schema import Device

GUIDE_RECIPE = "qwen3-4b-gsm8k-grpo"
SMOKE_RECIPE = "smoke"
PROFILE_FOR_DEVICE = {Device.NPU: "a3", Device.GPU: "h20", Device.CPU: "cpu"}
# verl's own trainer on the CPU (backend=verl, device=cpu): loads verlflow's CPU plugin into verl.
VERL_CPU_PROFILE = "cpu-verl"


def default_recipe(device: Device | str) -> str:
    """The guide's recipe on an accelerator, the smoke recipe on the CPU."""
    return SMOKE_RECIPE if Device(device) is Device.CPU else GUIDE_RECIPE
