"""One attempt at a time on a run: a resume takes a lease on the run before it trains.

    verlflow train --resume <run_id>     # a second one started meanwhile is refused in one line

Two ``--resume`` of one KILLED run started together both found it not RUNNING, both attached and both logged
steps 2-4 (twice the points). The lease is a tag, ``verlflow.lease``: ``{owner, host, pid, pid_start, at}``.
:func:`take_lease` reads it; a live holder (its process runs on this host, or its heartbeat is fresh from
another) makes the attempt refused; else it writes its own, waits :data:`SETTLE_S` (longer than any other
taker's read-to-write gap) and reads it back: only the last writer finds itself there and goes on, so of
several takers exactly one trains. A lease whose holder is dead or silent is stale and taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import HEARTBEAT_TAG
from verlflow.runs import lifecycle
from verlflow.runs.store_retry import LockRetryingClient
from verlflow.util import env_number

LEASE_TAG = "verlflow.lease"
SETTLE_S = env_number("VERLFLOW_LEASE_SETTLE_S", 2.0, minimum=0)


def _holder_alive(lease: dict, tags: dict[str, str], now: float) -> bool:
    """Whether the lease's holder may still be at work (same host: its process runs; else: a fresh heartbeat)."""
    if lease.get("host") == socket.gethostname():
        return isinstance(lease.get("pid"), int) and lifecycle.process_alive(lease["pid"], lease.get("pid_start"))
    beat = tags.get(HEARTBEAT_TAG, "")
    last = max(float(lease.get("at", 0)), float(beat) if beat.isdigit() else 0.0)
    return now - last <= lifecycle.STALE_AFTER_S


def _read(client: MlflowClient, run_id: str) -> tuple[dict, dict[str, str]]:
    tags = client.get_run(run_id).data.tags
    try:
        lease = json.loads(tags.get(LEASE_TAG, "{}"))
    except ValueError:
        lease = {}
    return (lease if isinstance(lease, dict) else {}), tags


def _refuse(run_id: str, lease: dict) -> VerlflowError:
    return VerlflowError(f"resume: run {run_id} is being resumed by process {lease.get('pid', '?')} on "
                         f"{lease.get('host', '?')} (its lease {LEASE_TAG}): one attempt at a time; wait for it "
                         "to end, or stop it first")


def take_lease(run_id: str, client: MlflowClient | None = None) -> str:
    """Take ``run_id``'s lease for this process, or raise a one-line :class:`VerlflowError` when another
    live attempt holds it. Returns the owner token written."""
    client = client or LockRetryingClient()
    lease, tags = _read(client, run_id)
    if lease and _holder_alive(lease, tags, time.time()):
        raise _refuse(run_id, lease)
    pid = os.getpid()
    mine = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": pid,
            "pid_start": lifecycle.process_start(pid), "at": int(time.time())}
    client.set_tag(run_id, LEASE_TAG, json.dumps(mine, sort_keys=True))
    time.sleep(SETTLE_S)
    lease, _ = _read(client, run_id)
    if lease.get("owner") != mine["owner"]:
        raise _refuse(run_id, lease)
    return mine["owner"]
