"""One search trial: a child MLflow run under the search's run, the real train step, pruning from its metrics.

    mlflow run . --env-manager local -e search -P n_trials=1 -P recipe=smoke   # runs one trial

A trial creates its MLflow run itself, linked to the search's run by the explicit ``mlflow.parentRunId``
tag (not Optuna's deprecated MLflowCallback, which loses the link with parallel workers), with tags
``optuna.study_name``, ``optuna.trial_number`` and ``optuna.param.<key>`` (params are the train step's:
verl logs them itself, and refuses to when a key already exists). It then runs the train step as a
subprocess (``verlflow train …``, its overrides in its environment) with ``MLFLOW_RUN_ID`` set
to that run, so the local trainer and verl alike log into it. While it runs, the objective metric's
history is read from MLflow and reported to Optuna; a trial the pruner stops gets SIGTERM and its run then
ends FINISHED with the tag ``optuna.pruned=true`` and ``pruned`` in its name (pruning is the search working,
not a failure: no red cross in the runs table). The subprocess dies with its worker.

A trial's run is named ``t<number> · <its parameters, short> · <study>`` (``t3 · lr=3e-06 n=8 · smoke-default``):
what tells trials apart first, where the runs table's narrow name column still shows it.
"""

from __future__ import annotations

import collections
import getpass
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME, MLFLOW_USER

from verlflow import config, stopping
from verlflow.errors import EXIT_BAD_INPUT, VerlflowError
from verlflow.names import ERROR_TAG, STEP_TAG, metric_names
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.search.study import PARENT_RUN_ID_ATTR, RUN_ID_ATTR

# The trial's overrides reach its train step through this variable, never its command line: ``ps`` and
# ``/proc/<pid>/cmdline`` show every user a command line, and a search's fixed overrides may hold a secret.
OVERRIDES_VARIABLE = "VERLFLOW_TRIAL_OVERRIDES"
# The trial's process: on Linux it first asks for SIGTERM when its worker dies (even by SIGKILL), so a killed
# worker leaves no orphan training and its run ends KILLED; then it runs ``verlflow train`` with the overrides.
_TRIAL_ENTRY = (
    "import ctypes, os, signal, sys\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
    "    os.getppid() == int(sys.argv[1]) or sys.exit(143)\n"
    "from verlflow import cli\n"
    f"cli.main([*sys.argv[2:], '--overrides', os.environ.pop('{OVERRIDES_VARIABLE}')], own_process=True)\n"
)


class TrialFailed(Exception):
    """A trial's training failed (not the user's input): the trial is FAIL and the search goes on."""


@dataclass
class TrialRunner:
    """Runs Optuna trials as train steps; one instance per search worker."""

    recipe: str
    device: str
    data_dir: str
    parent_run_id: str
    experiment_id: str
    study_name: str
    metric: str
    tracking_uri: str
    # The search config's fixed overrides, applied before the trial's values.
    fixed_overrides: dict[str, Any] = field(default_factory=dict)
    # The composed recipe's trainer.default_local_dir; each trial saves under <it>/<study>/trial_<n>.
    checkpoint_root: str = "checkpoints"
    poll_interval: float = 5.0
    stop_timeout: float = 60.0

    def overrides(self, trial_number: int, params: dict[str, Any]) -> dict[str, Any]:
        """The trial's verl overrides: fixed ones, the trial's values, its own checkpoint folder."""
        ckpt = Path(self.checkpoint_root) / self.study_name / f"trial_{trial_number:04d}"
        return {**self.fixed_overrides, **params, "trainer.default_local_dir": str(ckpt)}

    def command(self) -> list[str]:
        """The train step's command line for a trial: the same for every trial (its overrides are in
        :meth:`environment`)."""
        return [sys.executable, "-c", _TRIAL_ENTRY, str(os.getpid()), "train", "--recipe", self.recipe,
                "--device", self.device, "--data_dir", self.data_dir]

    def environment(self, trial_number: int, run_id: str, params: dict[str, Any]) -> dict[str, str]:
        """The trial process's environment: this one's, its run, and its overrides (:data:`OVERRIDES_VARIABLE`)."""
        overrides = shlex.join(config.hydra_overrides(self.overrides(trial_number, params)))
        return {**os.environ, "MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": self.tracking_uri,
                "MLFLOW_EXPERIMENT_ID": self.experiment_id, OVERRIDES_VARIABLE: overrides}

    def __call__(self, trial: optuna.Trial, params: dict[str, Any]) -> float:
        """Run one trial to its objective value; TrialPruned when pruned, TrialFailed when training fails."""
        client = LockRetryingClient(self.tracking_uri)
        run_id = self._create_run(client, trial, params)
        with tempfile.TemporaryDirectory(prefix="verlflow-trial-") as tmp:
            log_path = Path(tmp) / "trial_output.log"
            proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1, env=self.environment(trial.number, run_id, params))
            tail: collections.deque[str] = collections.deque(maxlen=20)
            pruning = threading.Event()
            reader = threading.Thread(target=_tee, args=(proc, trial.number, log_path, tail, pruning), daemon=True)
            reader.start()
            outcome = "FAIL"
            try:
                reported: set[int] = set()
                while True:
                    finished = proc.poll() is not None
                    self._report(client, run_id, trial, reported, proc, pruning)
                    if finished:
                        break
                    stopping.STOP.wait(self.poll_interval)
                    stopping.stop_point()  # the trial's run ends KILLED in the finally below
                reader.join(timeout=30)
                value = self._result(client, run_id, trial, proc.returncode, tail)
                outcome = "COMPLETE"
                return value
            except optuna.TrialPruned:
                outcome = "PRUNED"
                raise
            finally:
                if proc.poll() is None:
                    _stop(proc, self.stop_timeout)
                reader.join(timeout=30)
                self._close_run(client, run_id, outcome, log_path)

    def _create_run(self, client: MlflowClient, trial: optuna.Trial, params: dict[str, Any]) -> str:
        frozen = trial.study.get_trials(deepcopy=False)[trial.number]
        retry_of = frozen.system_attrs.get("failed_trial")
        name = trial_run_name(self.study_name, trial.number, params)
        tags = {
            MLFLOW_PARENT_RUN_ID: self.parent_run_id,
            MLFLOW_RUN_NAME: name,
            MLFLOW_USER: getpass.getuser(),  # created by the client: its user, as start_run sets it
            # Set again by the train step; here so that a trial killed while starting still reads as one.
            STEP_TAG: "train",
            "optuna.study_name": self.study_name,
            "optuna.trial_number": str(trial.number),
            **{f"optuna.param.{key}": str(value) for key, value in params.items()},
        }
        if retry_of is not None:
            tags["optuna.retry_of"] = str(retry_of)
        run = client.create_run(self.experiment_id, tags=tags, run_name=name)
        trial.set_user_attr(RUN_ID_ATTR, run.info.run_id)
        trial.set_user_attr(PARENT_RUN_ID_ATTR, self.parent_run_id)
        return run.info.run_id

    def _report(self, client: MlflowClient, run_id: str, trial: optuna.Trial, reported: set[int],
                proc: subprocess.Popen, pruning: threading.Event) -> None:
        """Report each new validation value to Optuna; stop the training and prune when the pruner says so."""
        try:
            history = self._history(client, run_id)
        except MlflowException:
            return
        for step, value in sorted(history.items()):
            if step in reported:
                continue
            reported.add(step)
            trial.report(value, step)
            if trial.should_prune():
                pruning.set()
                if _stop(proc, self.stop_timeout):
                    sys.stdout.write(f"[trial {trial.number}] verlflow train: killed after the search's pruner "
                                     f"stopped it: no exit within {self.stop_timeout:g} s of SIGTERM "
                                     "(trial.stop_timeout in the search config)\n")
                client.set_tag(run_id, "optuna.pruned", "true")
                raise optuna.TrialPruned(f"trial {trial.number} pruned at step {step} "
                                         f"({self.metric}={value:g})")

    def _result(self, client: MlflowClient, run_id: str, trial: optuna.Trial, returncode: int,
                tail: collections.deque[str]) -> float:
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        if returncode == EXIT_BAD_INPUT:
            raise VerlflowError(f"trial {trial.number}: the train step refused its input: {last}")
        if returncode != 0:
            raise TrialFailed(f"trial {trial.number}: train exited with status {returncode}: {last}")
        history = self._history(client, run_id)
        if not history:
            raise VerlflowError(f"trial {trial.number}: its train run logged no '{self.metric}' "
                                "(the objective): check objective.metric in the search config and that "
                                "the recipe validates (trainer.test_freq > 0)")
        return history[max(history)]

    def _history(self, client: MlflowClient, run_id: str) -> dict[int, float]:
        """The objective's step → value, under whichever verl version's name the trial logged it."""
        for name in metric_names(self.metric):
            history = _last_per_step(client.get_metric_history(run_id, name))
            if history:
                return history
        return {}

    def _close_run(self, client: MlflowClient, run_id: str, outcome: str, log_path: Path) -> None:
        """Tag the trial's state, keep its output, and end its run if the train step could not."""
        try:
            client.set_tag(run_id, "optuna.state", outcome)
            if log_path.is_file() and log_path.stat().st_size:
                client.log_artifact(run_id, str(log_path), "logs")
            run = client.get_run(run_id)
            if outcome == "PRUNED":  # ended KILLED by the train step's SIGTERM handling: the search's choice
                client.set_terminated(run_id, "FINISHED")
                client.update_run(run_id, name=pruned_name(run.info.run_name))
                if ERROR_TAG in run.data.tags:  # the step's "interrupted": the search stopped it on purpose
                    client.delete_tag(run_id, ERROR_TAG)
            elif run.info.status == RunStatus.to_string(RunStatus.RUNNING):
                client.set_terminated(run_id, "FAILED")
        except MlflowException:
            pass


def trial_run_name(study_name: str, number: int, params: dict[str, Any]) -> str:
    """``t<number> · <params, short> · <study>``: the trial and its parameters first (cut to fit, never the number)."""
    from verlflow.tracking.naming import MAX_NAME_CHARS, SEPARATOR, short_overrides

    values = " ".join(short_overrides(" ".join(f"{key}={_short_value(value)}" for key, value in params.items())))
    head = f"t{number}"
    room = MAX_NAME_CHARS - len(head) - len(study_name) - 2 * len(SEPARATOR)
    values = values if len(values) <= room else values[:max(room - 1, 0)] + "…"
    return SEPARATOR.join(part for part in (head, values, study_name) if part)


def pruned_name(name: str) -> str:
    """The trial's name once pruned: ``t3 pruned · …`` (kept when it says so already)."""
    head, sep, rest = name.partition(" · ")
    return name if head.endswith(" pruned") else f"{head} pruned{sep}{rest}"


def _short_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _last_per_step(history) -> dict[int, float]:
    """Metric history as step → value (the latest value when a step was logged twice)."""
    values: dict[int, tuple[int, float]] = {}
    for m in history:
        if m.step not in values or m.timestamp >= values[m.step][0]:
            values[m.step] = (m.timestamp, m.value)
    return {step: value for step, (_, value) in values.items()}


def _tee(proc: subprocess.Popen, number: int, log_path: Path, tail: collections.deque[str],
         pruning: threading.Event) -> None:
    """Copy the trial's output to this worker's stdout (prefixed) and to its log file; keep the last lines.

    Once the pruner stopped the trial, the train step's own "interrupted" line reads as what it is: the search
    stopping it on purpose, not a failure.
    """
    assert proc.stdout is not None
    with log_path.open("w") as log_file:
        for line in proc.stdout:
            if pruning.is_set() and (interrupted := _INTERRUPTED_LINE.fullmatch(line.strip())):
                line = f"{interrupted.group(1)}stopped by the search's pruner (not a failure)\n"
            log_file.write(line)
            tail.append(line.rstrip())
            sys.stdout.write(f"[trial {number}] {line}")
            sys.stdout.flush()


# The train step's exit line on SIGTERM/SIGINT (verlflow.stopping.stop_interrupted).
_INTERRUPTED_LINE = re.compile(r"(verlflow \w+: )interrupted(?:; .*)?")  # and where its work stands


def _stop(proc: subprocess.Popen, timeout: float) -> bool:
    """SIGTERM (the train step ends its run KILLED), then SIGKILL after ``timeout`` seconds; True when killed."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True
