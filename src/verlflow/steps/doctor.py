"""Step ``doctor``: can the guide's recipe launch on this machine? One table row per item, then a verdict.

    verlflow doctor --device npu          # same as: mlflow run . --env-manager local -e doctor -P device=npu

What each row checks is :mod:`verlflow.device.doctor`; exits 2 naming what blocks the launch.
"""

from __future__ import annotations

from verlflow.errors import VerlflowError
from verlflow.step_requests import DoctorRequest


def run_doctor(request: DoctorRequest):
    """Print the table; raise (exit 2) naming what blocks the launch; the rows."""
    from verlflow.backends.train_setup import auto_profile
    from verlflow.device import detect
    from verlflow.device.doctor import diagnose, render

    dev = detect.detect_device(request.device)
    if not dev.is_accelerator:
        raise VerlflowError("no NPU or GPU found on this machine (npu-smi and nvidia-smi list none): verl needs "
                            "one; pass --device npu or --device gpu to see what is missing, or use backend=local")
    rows = diagnose(dev, auto_profile(dev) if request.profile == "auto" else request.profile)
    print(render(rows))
    for row in rows:
        if row.note:
            print(f"verlflow doctor: note: {row.note}")
    blocking = [r for r in rows if r.ok is False]
    if blocking:
        raise VerlflowError("the launch cannot proceed: " + "; ".join(f"{r.item}: {r.found} ({r.fix})"
                                                                       for r in blocking))
    print("verlflow doctor: the launch can proceed")
    return rows
