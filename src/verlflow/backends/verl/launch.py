"""Run a :class:`~verlflow.backends.verl.command.LaunchPlan`: locally under ``bash``, or as a Ray job.

    pytest tests/test_verl_launch_status.py      # a stand-in for verl's main module, FINISHED/FAILED/KILLED

Local: ``bash -c <script>`` in its own process group, output streamed to the console and appended to
``logs/verl.log`` line by line. SIGTERM/SIGINT are forwarded to the whole group (verl, its Ray workers);
a second signal, or :data:`KILL_GRACE_S` without an exit, sends SIGKILL (the wait checks
:data:`verlflow.stopping.STOP` at each poll: a signal never raises inside it). Then :class:`RunInterrupted`
is raised, so :func:`verlflow.tracking.tracking.tracked_run` ends the run KILLED.

Ray job (``ray_address``): the same script is the entrypoint of a job submitted with Ray's
``JobSubmissionClient``; the attach variables and the profile's environment go through the job's
``runtime_env`` (so every worker on every node has them), its logs are followed, and a signal stops the
job. Before verl, the entrypoint starts the job's node samplers (:mod:`.node_sampler`) and, for a resumed
run, picks its checkpoint on the cluster (:mod:`.resume`). :func:`ray_job_spec` is the pure part,
:func:`ray_submit_command` the equivalent CLI line.

:func:`validate_with_verl` runs the plan's script with ``main_ppo --cfg job``: verl composes the exact
command line (quoting included) and prints the job config, which must agree with what we composed. A dry
run does not start it (verl's Hydra config is composed in-process, :func:`check_shell_words` checks the
quoting); it stays for a check against a verl in another environment.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import yaml

import verlflow as verlflow_package
from verlflow import secrets, stopping
from verlflow.backends.verl.command import STDOUT_MARKER, LaunchPlan
from verlflow.backends.verl.console import ConsoleFilter
from verlflow.backends.verl.memory import MemoryWatch, verl_out_of_memory
from verlflow.errors import VerlflowError
from verlflow.stopping import RunInterrupted
from verlflow.util import first_line

# Seconds a signalled launch gets to exit (verl flushes its loggers) before SIGKILL.
KILL_GRACE_S = 30.0
RAY_POLL_S = 2.0
_TERMINAL_RAY = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 143}


class _Forwarder:
    """The stop signals this process receives, passed on (``send``) instead of stopping it: a signal only sets
    :data:`verlflow.stopping.STOP` (the handler never raises), and the launch's wait hands each new one on at its
    next poll (:meth:`poll`); a second one is sent as SIGKILL."""

    def __init__(self, send: Callable[[int], None]):
        self.send = send
        self.received: list[int] = []
        self.first_at = 0.0

    def __enter__(self) -> _Forwarder:
        return self

    def poll(self) -> None:
        """Pass on the stop signals that came since the last poll."""
        for signum in stopping.received()[len(self.received):]:
            if not self.received:
                self.first_at = time.monotonic()
            self.received.append(signum)
            print(f"verlflow: {signal.Signals(signum).name} received, passing it to verl", file=sys.stderr,
                  flush=True)
            self.send(signal.SIGKILL if len(self.received) > 1 else signum)

    def overdue(self) -> bool:
        """Whether the grace period after the first signal is over."""
        return bool(self.received) and time.monotonic() - self.first_at > KILL_GRACE_S

    def interrupted(self) -> RunInterrupted | None:
        """The interrupt to raise once the launch has ended, None when no signal came."""
        return RunInterrupted(self.received[0]) if self.received else None

    def __exit__(self, *_exc) -> None:
        return None


def _pump(stream: BinaryIO, log: BinaryIO, on_line: Callable[[str], None] | None) -> None:
    """Copy a child's output to the log file and our stdout as it arrives, secrets masked (verl prints its
    resolved config, secret overrides included); the console gets one line for verl's config dump
    (:class:`~verlflow.backends.verl.console.ConsoleFilter`)."""
    known = secrets.known_values()
    console = ConsoleFilter(getattr(log, "name", "the launch's log"))
    for raw in iter(stream.readline, b""):
        text = secrets.mask_text(raw.decode(errors="replace"), known=known)
        log.write(text.encode())
        log.flush()
        _print(console(text))
        if on_line is not None:
            on_line(text.rstrip("\n"))
    _print(console.flush())


def _print(lines: list[str]) -> None:
    for line in lines:
        sys.stdout.write(line)
    if lines:
        sys.stdout.flush()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def run_streaming(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | Path,
    log_path: str | Path,
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run ``argv`` in its own process group, streaming its output to the console and ``log_path``.

    Returns the exit status. A SIGTERM/SIGINT received meanwhile is forwarded to the group and, once the
    child is gone, raised as :class:`~verlflow.tracking.tracking.RunInterrupted` (the run ends KILLED).
    """
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    stopping.stop_point()  # a stop taken while the launch was prepared: verl never starts
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        reader = threading.Thread(target=_pump, args=(proc.stdout, log, on_line), daemon=True)
        reader.start()
        with _Forwarder(lambda s: _signal_group(proc, s)) as fwd:
            try:
                while True:
                    fwd.poll()
                    try:
                        rc = proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        if fwd.overdue():
                            _signal_group(proc, signal.SIGKILL)
            finally:
                if proc.poll() is None:  # an exception of our own: never leave verl running
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                fwd.poll()
                if fwd.received:
                    # Workers of an interrupted launch may outlive its leader.
                    _signal_group(proc, signal.SIGKILL)
                # A grandchild can hold the pipe open after the child exits: don't wait for it forever.
                reader.join(timeout=10)
            interrupt = fwd.interrupted()
    if interrupt is not None:
        raise interrupt
    return rc


def launch_env(plan: LaunchPlan) -> dict[str, str]:
    """The environment the launch script starts with: ours, the run to attach to, and the launch's secrets (which
    only ever travel in the environment, never in the script or on a command line)."""
    return {**os.environ, **plan.attach_env, **plan.secret_env}


def run_local(plan: LaunchPlan, log_path: str | Path, on_line: Callable[[str], None] | None = None) -> int:
    """Launch the plan here under ``bash -c`` (profile files sourced) and return verl's exit status; verl that ran
    out of memory is its one line (:mod:`.memory`) instead."""
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    memory = MemoryWatch(on_line)
    rc = run_streaming(["bash", "-c", plan.script()], env=launch_env(plan), cwd=plan.run_dir,
                       log_path=log_path, on_line=memory)
    return _unless_out_of_memory(rc, memory, plan.overrides)


def _unless_out_of_memory(rc: int, memory: MemoryWatch, overrides: dict[str, Any] | None = None) -> int:
    """``rc``, unless verl failed after an allocator said it ran out: then its one line (:mod:`.memory`)."""
    if rc != 0 and memory.seen:
        raise verl_out_of_memory(memory.seen, rc, overrides)
    return rc


def check_shell_words(argv: list[str]) -> None:
    """Each word of the launch survives the script's quoting unchanged, as bash splits it (POSIX rules)."""
    from verlflow.backends.verl.command import shell_quote

    for word in argv:
        if shlex.split(shell_quote(word)) != [word]:
            raise VerlflowError(f"the launch script would not pass {word!r} to verl unchanged: a quoting problem")


def validate_with_verl(plan: LaunchPlan, timeout_s: float = 300) -> dict[str, Any]:
    """verl's own composition of the plan's exact command line (``main_ppo … --cfg job``), as a dict.

    Runs through the same bash script as the launch, so shell quoting is checked too. An unknown key or
    bad value is one line; a value verl reads differently from what we composed is an error naming it.
    """
    # A scratch working directory: a dry run leaves no run folder behind.
    try:
        with tempfile.TemporaryDirectory(prefix="verlflow-check-") as scratch:
            done = subprocess.run(["bash", "-c", plan.script(plan.validation_argv(), stdout_marker=True)],
                                  env=launch_env(plan), cwd=scratch, capture_output=True, text=True,
                                  timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise VerlflowError(f"verl's config check (main_ppo --cfg job) did not finish in {timeout_s:.0f} s") from None
    printed = done.stdout.rpartition(STDOUT_MARKER + "\n")[2]
    if done.returncode != 0 or not printed.strip():
        text = (done.stderr + done.stdout).splitlines()
        first = next((ln for ln in text if "Error" in ln or "not in struct" in ln or "Could not" in ln),
                     next((ln for ln in reversed(text) if ln.strip()), "no output"))
        raise VerlflowError(f"verl rejects the command line (main_ppo --cfg job): {first.strip()}")
    job = yaml.safe_load(printed)
    if not isinstance(job, dict):
        raise VerlflowError("verl's main_ppo --cfg job printed no config: is verl installed in this python?")
    from verlflow.config import DELETE, split_prefix

    for raw_key, want in plan.overrides.items():
        prefix, key = split_prefix(raw_key)
        got = _select(job, key)
        if prefix == "~":
            if got is not None and (want is DELETE or _same(got, want)):
                raise VerlflowError(f"verl still has '{key}' after '{raw_key}' on the command line")
            continue
        if not _same(got, want):
            raise VerlflowError(f"verl reads '{key}' from the command line as {got!r}, not {want!r}: a quoting problem")
    return job


def _select(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, (list, tuple)):
        if not isinstance(got, list) or len(got) != len(want):
            return False
        return all(_same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, float) or isinstance(got, float):
        try:
            return float(got) == float(want)
        except (TypeError, ValueError):
            return False
    return got == want or str(got) == str(want)


# ----------------------------------------------------------------------------------------------
# Ray jobs
# ----------------------------------------------------------------------------------------------


def ray_job_spec(plan: LaunchPlan, *, run_id: str, attempt: int = 1, sample_interval_s: float | None = None,
                 resume: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``JobSubmissionClient.submit_job`` for this plan (nothing is submitted).

    The entrypoint is the launch script run by ``python3`` on the cluster; ``runtime_env.env_vars`` holds
    the attach variables and the profile's environment, which reach every worker on every node (exports
    in the script reach only the driver). The submission id names the MLflow run and, from the second
    attempt of a resumed run on, the attempt (Ray keeps every submission id for good).

    Before verl starts, the entrypoint runs verlflow's own parts on the head: with ``resume``, the choice of
    the checkpoint to continue from (:func:`~verlflow.backends.verl.resume.job_resume_line`), and with
    ``sample_interval_s``, the per-node samplers in the background
    (:func:`~verlflow.backends.verl.node_sampler.job_sampler_line`). Their code travels with the job as
    ``py_modules`` (this verlflow package, uploaded through the dashboard, which is all a submitter reaches).
    """
    from verlflow.backends.verl.node_sampler import job_sampler_line
    from verlflow.backends.verl.resume import job_resume_line

    ray_plan = _with_python(plan, "python3")
    prelude = [job_resume_line(ray_plan.python, ray_plan.checkpoint_dir)] if resume else []
    if sample_interval_s:
        prelude.append(job_sampler_line(ray_plan.python, sample_interval_s))
    runtime_env: dict[str, Any] = {"env_vars": {**ray_plan.env, **ray_plan.secret_env, **ray_plan.attach_env}}
    if prelude or plan.secret_refs:  # the guard masking verl's params is verlflow's code: it travels with the job
        runtime_env.update({"py_modules": [str(Path(verlflow_package.__file__).parent)],
                            "excludes": ["__pycache__"]})
    return {
        "entrypoint": f"bash -c {shlex.quote(ray_plan.script(chdir=True, prelude=prelude))}",
        "runtime_env": runtime_env,
        "submission_id": f"verlflow-{run_id}" if attempt <= 1 else f"verlflow-{run_id}-attempt{attempt}",
        "metadata": {"mlflow_run_id": run_id},
    }


def _with_python(plan: LaunchPlan, python: str) -> LaunchPlan:
    from dataclasses import replace

    return replace(plan, python=python)


def ray_submit_command(spec: dict[str, Any], address: str, *, mask: Callable[[str, str], str]) -> str:
    """The ``ray job submit`` line equivalent to ``spec`` (for command.txt; env values passed through ``mask``)."""
    runtime_env = {**spec["runtime_env"],
                   "env_vars": {k: mask(k, v) for k, v in spec["runtime_env"]["env_vars"].items()}}
    return " ".join([
        "ray job submit", "--address", shlex.quote(address), "--submission-id", shlex.quote(spec["submission_id"]),
        "--runtime-env-json", shlex.quote(json.dumps(runtime_env, sort_keys=True)), "--", spec["entrypoint"],
    ])


def run_ray_job(
    spec: dict[str, Any], address: str, log_path: str | Path, on_line: Callable[[str], None] | None = None
) -> int:
    """Submit ``spec`` to the Ray cluster at ``address``, follow its logs; 0 when it SUCCEEDED.

    A SIGTERM/SIGINT stops the job (``stop_job``) and raises :class:`RunInterrupted` once it has stopped.
    """
    import asyncio

    from ray.job_submission import JobSubmissionClient

    try:
        client = JobSubmissionClient(address)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError for a bad address
        raise VerlflowError(f"cannot reach the Ray cluster at '{address}': {first_line(exc)}") from None
    stopping.stop_point()  # a stop taken while the job was prepared: it is never submitted
    try:
        job_id = client.submit_job(**spec)
    except Exception as exc:  # Ray raises RuntimeError for an HTTP error, e.g. a head whose job agent is not up yet
        raise VerlflowError(f"the Ray cluster at '{address}' did not take the job: {first_line(exc)}") from None
    print(f"verlflow: submitted Ray job {job_id} to {address}", flush=True)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    memory = MemoryWatch(on_line)  # every line goes on to on_line; an allocator's last words are kept

    def follow() -> None:
        async def tail() -> None:
            with open(log_path, "a") as log:
                async for chunk in client.tail_job_logs(job_id):
                    chunk = secrets.mask_text(chunk)
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                    log.write(chunk)
                    log.flush()
                    for line in chunk.splitlines():
                        memory(line)

        try:
            asyncio.run(tail())
        except Exception as exc:  # the log stream ends with the job, or the connection drops
            print(f"verlflow: stopped following the Ray job's logs: {exc}", file=sys.stderr)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    # Ray's stop_job sends SIGTERM, then SIGKILL after its own grace period; a second signal repeats it.
    with _Forwarder(lambda _s: client.stop_job(job_id)) as fwd:
        while True:
            fwd.poll()
            status = client.get_job_status(job_id)  # bounded by Ray's own HTTP timeout
            name = str(getattr(status, "value", status))
            if name in _TERMINAL_RAY:
                break
            if fwd.received:  # stopping: the job's status is all there is left to wait for
                time.sleep(RAY_POLL_S)
            else:
                stopping.STOP.wait(RAY_POLL_S)
        interrupt = fwd.interrupted()
    reader.join(timeout=10)
    if name == "STOPPED":
        raise interrupt or RunInterrupted(signal.SIGTERM)
    return _unless_out_of_memory(_TERMINAL_RAY[name], memory)


__all__ = [
    "KILL_GRACE_S", "run_streaming", "run_local", "launch_env", "validate_with_verl", "check_shell_words",
    "ray_job_spec", "ray_submit_command", "run_ray_job",
]
