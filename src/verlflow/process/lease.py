"""One attempt at a time on a run: a resume takes a lease on the run before it trains.

    verlflow train --resume <run_id>     # a second one started meanwhile is refused in one line

Two ``--resume`` of one KILLED run started together both found it not RUNNING, both attached and both logged
steps 2-4 (twice the points). A lease is a **param**, ``verlflow.lease.<N>`` = ``{owner, host, pid, pid_start,
at}``, because MLflow's store refuses a second value for a param key (its primary key is the run and the key,
so of two writers of one key exactly one succeeds, whatever the timing): the store itself is the
compare-and-swap. :func:`take_lease` finds the newest lease N; a live holder (its process runs on this host, or
the run's heartbeat is fresh from another) makes the attempt refused; else it writes lease N + 1, and a taker
that loses that write is refused naming the winner. A lease whose holder is dead or silent is stale: the next
taker writes the next number. (A tag, read back after a pause, let two slow takers both win under load.)
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import HEARTBEAT_TAG
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.process import lifecycle

LEASE_PARAM = "verlflow.lease"
LEASE_TAG = "verlflow.lease"


def _holder_alive(lease: dict, tags: dict[str, str], now: float) -> bool:
    """Whether the lease's holder may still be at work (same host: its process runs; else: a fresh heartbeat)."""
    if lease.get("host") == socket.gethostname():
        return isinstance(lease.get("pid"), int) and lifecycle.process_alive(lease["pid"], lease.get("pid_start"))
    beat = tags.get(HEARTBEAT_TAG, "")
    last = max(float(lease.get("at", 0)), float(beat) if beat.isdigit() else 0.0)
    return now - last <= lifecycle.STALE_AFTER_S


def _leases(client: MlflowClient, run_id: str) -> tuple[int, dict, dict[str, str]]:
    """The newest lease's number (0: none), its content, and the run's tags."""
    run = client.get_run(run_id)
    numbers = [int(k.rsplit(".", 1)[1]) for k in run.data.params if k.startswith(LEASE_PARAM + ".")
               and k.rsplit(".", 1)[1].isdigit()]
    newest = max(numbers, default=0)
    try:
        lease = json.loads(run.data.params[f"{LEASE_PARAM}.{newest}"]) if newest else {}
    except ValueError:
        lease = {}
    return newest, (lease if isinstance(lease, dict) else {}), run.data.tags


def _refuse(run_id: str, lease: dict) -> VerlflowError:
    return VerlflowError(f"resume: run {run_id} is being resumed by process {lease.get('pid', '?')} on "
                         f"{lease.get('host', '?')} (its lease {LEASE_PARAM}): one attempt at a time; wait for it "
                         "to end, or stop it first")


def take_lease(run_id: str, client: MlflowClient | None = None) -> str:
    """Take ``run_id``'s lease for this process, or raise a one-line :class:`VerlflowError` when another
    live attempt holds it. Returns the owner token written."""
    client = client or LockRetryingClient()
    newest, lease, tags = _leases(client, run_id)
    if lease and _holder_alive(lease, tags, time.time()):
        raise _refuse(run_id, lease)
    pid = os.getpid()
    mine = {"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": pid,
            "pid_start": lifecycle.process_start(pid), "at": int(time.time())}
    try:
        client.log_param(run_id, f"{LEASE_PARAM}.{newest + 1}", json.dumps(mine, sort_keys=True))
    except MlflowException:
        _, winner, _ = _leases(client, run_id)  # another taker wrote this number first
        if winner.get("owner") != mine["owner"]:
            raise _refuse(run_id, winner) from None
        raise
    client.set_tag(run_id, LEASE_TAG, json.dumps(mine, sort_keys=True))  # for people: who holds it now
    return mine["owner"]
