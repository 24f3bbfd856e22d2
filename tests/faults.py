"""Faults a test asks a step to suffer, for real, at a safe point: ``python tests/fault_cli.py <kind>[@run] <step> …``.

    python tests/fault_cli.py bad_alloc@run train …   # a real uncaught std::bad_alloc inside the train run

Kinds: ``bad_alloc`` (libstdc++'s ``operator new`` asked for 4 EiB through ctypes: the C++ runtime prints
"terminate called after throwing an instance of 'std::bad_alloc'" and aborts, as a failed allocation in native code
does), ``abort`` (``os.abort()``), ``segv`` (a read of address 0), ``kill`` (SIGKILL to itself, as the OOM killer
sends), ``memory`` (a real ``MemoryError`` from a 4 EiB ``bytearray``). ``@run``: only at a safe point inside an open
MLflow run (the step's run is RUNNING when it dies), ``@run:N`` at the N-th of them (the trainer's step loop and
its sampling are safe points); otherwise the first safe point. Tests only: ``tests/fault_cli.py`` hands
:func:`inject` to :func:`verlflow.stopping.on_safe_point`; verlflow itself reads no fault variable.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_seen = {"in_run": 0}  # safe points reached inside a run so far


def inject(spec: str) -> bool:
    """Suffer the fault ``spec`` names when its place is reached; False when not here (no run open yet)."""
    kind, _, where = spec.partition("@")
    if where.startswith("run"):
        mlflow = sys.modules.get("mlflow")
        if mlflow is None or mlflow.active_run() is None:
            return False
        _seen["in_run"] += 1
        if _seen["in_run"] < int(where.partition(":")[2] or 1):
            return False
    sys.stderr.flush()
    if kind == "bad_alloc":
        new = ctypes.CDLL("libstdc++.so.6")["_Znwm"]  # operator new(size_t)
        new.argtypes, new.restype = [ctypes.c_size_t], ctypes.c_void_p
        new(2**62)
    elif kind == "abort":
        os.abort()
    elif kind == "segv":
        ctypes.string_at(0)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "memory":
        bytearray(2**62)
    return True
