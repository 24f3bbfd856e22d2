"""Before a verl launch on Ray: the cluster answers, holds the devices verl asks for, and can reach our tracking store.

    verlflow train --device gpu --ray_address http://head:8265 --dry_run true

Run by the train step for the dry run and the launch alike: the address is asked first, before anything
is composed, and the rest before the MLflow run opens, so a wrong address costs seconds instead of a queue
slot (the launch used to find it after composing and validating verl's config). Asked through Ray's public
APIs only: ``JobSubmissionClient`` (the job API the launch submits to) and the state API's ``list_nodes``
(each node's IP and total resources).

- With ``ray_address``: the cluster must answer (one that lists no alive node yet, a head still registering
  itself, is asked again for a few seconds); it must have ``trainer.nnodes`` alive nodes with at least
  ``trainer.n_gpus_per_node`` of the device's Ray resource each (``GPU`` / ``NPU``), as verl's
  ``ResourcePoolManager._check_resource_available`` demands when the job starts; and a tracking URI that
  names this machine (``sqlite:``, ``file:``, a path, ``localhost`` / ``127.x``) is refused when any node is
  another machine, where verl's MLflow logger may run.
- Without it, ``trainer.nnodes > 1`` needs a cluster verl's ``ray.init()`` will join from here
  (``RAY_ADDRESS`` or a ``ray start`` on this machine); the same checks then apply to that cluster.

``verlflow.skip_preflight`` leaves out the resource and tracking checks, never the reachability one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verlflow.errors import Problem, VerlflowError, raise_problems
from verlflow.platforms import Device
from verlflow.secrets import mask_url_password
from verlflow.util import first_line

# Seconds a cluster gets to answer before it counts as unreachable (a reachable one answers in well under one).
ANSWER_TIMEOUT_S = 15
# Every cluster lists its head as a node; a cluster that answers with none has a head still registering
# (`ray start --head` brings up the dashboard beside the raylet, not after it): asked again for this long.
SETTLE_S = 8
TRACKING_FIX = ("set MLFLOW_TRACKING_URI to a tracking server every node reaches (mlflow server --host 0.0.0.0 "
                "on a shared host, then http://<that host>:5000)")


@dataclass(frozen=True)
class RayNode:
    """One alive node of the cluster: its IP and total resources (``{"CPU": 64.0, "GPU": 8.0, …}``)."""

    ip: str
    resources: dict[str, float] = field(default_factory=dict)


def _with_deadline(ask: Callable[[], Any], timeout_s: float) -> Any:
    """``ask()``, or TimeoutError after ``timeout_s``: Ray's GCS client retries a dead address for a minute."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = ask()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(f"no answer in {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def joined_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster a ``ray.init()`` with no address joins from here, or None when it would start one of its own.

    As Ray resolves it (``ray._private.services.get_ray_address_from_environment``): ``RAY_ADDRESS``, else the
    GCS address the latest ``ray start`` on this machine wrote to ``<RAY_TMPDIR or TMPDIR or /tmp>/ray/
    ray_current_cluster``. Never Ray's legacy scan of the machine's processes (``address="auto"`` with no such
    file), which finds any cluster running here: another user's, or another test worker's.
    """
    environ = os.environ if environ is None else environ
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"]
    temp = environ.get("RAY_TMPDIR") or environ.get("TMPDIR") or "/tmp"
    try:
        return (Path(temp) / "ray" / "ray_current_cluster").read_text().strip() or None
    except OSError:
        return None


def cluster_nodes(address: str | None, *, timeout_s: float = ANSWER_TIMEOUT_S) -> list[RayNode]:
    """The alive nodes of the Ray cluster at ``address`` (None: the one ``ray.init()`` would join from here,
    :func:`joined_address`).

    Raises :class:`VerlflowError` in one line when it does not answer, or when there is none to join.
    """
    joining = not address
    if joining:
        address = joined_address()
        if address is None:
            raise VerlflowError("no Ray cluster reachable from this machine: no RAY_ADDRESS, no `ray start` here")

    def ask() -> list[RayNode]:
        from ray.util.state import list_nodes

        if not joining:
            from ray.job_submission import JobSubmissionClient

            JobSubmissionClient(address)  # the job API the launch submits to answers (it checks the version)
        listed = until_listed(lambda: list_nodes(address=address, filters=[("state", "=", "ALIVE")],
                                                 timeout=int(timeout_s), raise_on_missing_output=False),
                              settle_s=SETTLE_S)
        return [RayNode(ip=str(_field(n, "node_ip")), resources={k: float(v) for k, v in
                                                                  (_field(n, "resources_total") or {}).items()})
                for n in listed]

    try:
        return _with_deadline(ask, timeout_s + SETTLE_S)  # the settling has its own time, not the answer's
    except Exception as exc:  # ConnectionError, the state API's ServerUnavailable, TimeoutError, auth errors
        reason = first_line(exc, 200)
        if joining:
            raise VerlflowError(f"no Ray cluster reachable from this machine: {reason}") from None
        raise VerlflowError(f"ray_address={address}: no Ray cluster answers there ({reason}): pass the dashboard "
                            "address of a running cluster's head (http://<head>:8265)") from None


def until_listed(list_once: Callable[[], list], *, settle_s: float, poll_s: float = 1.0) -> list:
    """``list_once()``, asked again every ``poll_s`` while it is empty, for up to ``settle_s``: an empty list of
    alive nodes from a cluster that answers means its head is still registering, not that it has no nodes."""
    deadline = time.monotonic() + settle_s
    listed = list_once()
    while not listed and time.monotonic() + poll_s <= deadline:
        time.sleep(poll_s)
        listed = list_once()
    return listed


def _field(node: Any, name: str) -> Any:
    return node.get(name) if isinstance(node, dict) else getattr(node, name, None)


def resource_problems(nodes: list[RayNode], *, device: Device | str, nnodes: int, per_node: int,
                      where: str) -> list[Problem]:
    """Too few nodes with ``per_node`` devices each, counted as verl's resource pool check counts them."""
    # The Ray resource verl sizes its placement groups in (verl.utils.device: NPU on Ascend, GPU otherwise).
    resource = Device(device).ray_resource
    if resource is None:
        return []
    fitting = sum(1 for node in nodes if node.resources.get(resource, 0) >= per_node)
    if fitting >= nnodes:
        return []
    listing = ", ".join(f"{n.ip}: {n.resources.get(resource, 0):g} {resource}" for n in nodes) or "none alive"
    key, value = ("trainer.nnodes", nnodes) if len(nodes) < nnodes else ("trainer.n_gpus_per_node", per_node)
    return [Problem(key, value, (
        f"verl asks for trainer.nnodes × n_gpus_per_node = {nnodes} × {per_node} {resource} (every node "
        f"{per_node}), but {where} has {fitting} such node(s) ({listing}): ask for what it has, or add nodes"))]


def local_only_reason(uri: str) -> str | None:
    """Why only this machine can use the tracking URI ``uri`` (a file here, a loopback host); None if others can."""
    if uri.strip().lower() == "databricks":  # MLflow's name for the Databricks workspace, not a path
        return None
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("", "file", "sqlite") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):
        return "names a file on this machine"
    host = (parts.hostname or "").lower()
    if host in ("localhost", "ip6-localhost"):
        return f"{host} is this machine"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return f"{host} is this machine" if address.is_loopback or address.is_unspecified else None


def this_machines_ips() -> set[str]:
    """The addresses by which Ray may know this machine: the one Ray picks, the host name's, loopback."""
    from ray.util import get_node_ip_address

    ips = {"127.0.0.1", "::1", get_node_ip_address()}
    try:
        ips |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return ips


def tracking_problems(uri: str, nodes: list[RayNode], *, here: set[str], where: str) -> list[Problem]:
    """A tracking URI only this machine can use, while some node of the cluster is another machine."""
    reason = local_only_reason(uri)
    others = sorted({n.ip for n in nodes} - here)
    if reason is None or not others:
        return []
    return [Problem("MLFLOW_TRACKING_URI", mask_url_password(uri), (
        f"{reason}, but verl's MLflow logger may run on another node of {where} ({', '.join(others[:4])}): "
        f"{TRACKING_FIX}"))]


def check_ray_launch(*, device: Device | str, nnodes: Any, per_node: Any, ray_address: str, tracking_uri: str,
                     nodes: list[RayNode] | None = None, check_resources: bool = True) -> None:
    """Refuse, in one line per problem, a launch whose Ray cluster cannot run it (see the module docstring).

    ``nodes``: the cluster at ``ray_address`` as :func:`cluster_nodes` already listed it (asked again if None).
    Sizes that are not whole numbers >= 1 are left to the preflight, which names them.
    """
    sizes_ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (nnodes, per_node))
    if not ray_address and (not sizes_ok or nnodes <= 1):
        return  # verl starts its own single-node Ray here; the device preflight covers it
    if not ray_address:
        try:
            nodes = cluster_nodes(None)
        except VerlflowError:
            raise_problems([Problem("trainer.nnodes", nnodes, (
                "more than one node needs a Ray cluster and none is reachable from this machine (no RAY_ADDRESS, "
                "no `ray start` here): pass -P ray_address=http://<head>:8265, or run `ray start --head` here "
                "and `ray start --address=<this host>:6379` on the other nodes"))])
        where = "the Ray cluster verl would join from here"
    else:
        nodes = cluster_nodes(ray_address) if nodes is None else nodes
        where = f"the Ray cluster at {ray_address}"
    if not check_resources:
        return
    problems = resource_problems(nodes, device=device, nnodes=nnodes, per_node=per_node, where=where) \
        if sizes_ok else []
    problems += tracking_problems(tracking_uri, nodes, here=this_machines_ips(), where=where)
    raise_problems(problems, "the Ray launch")


__all__ = ["RayNode", "cluster_nodes", "until_listed", "resource_problems", "local_only_reason", "this_machines_ips",
           "tracking_problems", "check_ray_launch"]
