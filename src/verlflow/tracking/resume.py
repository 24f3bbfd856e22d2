"""Resume a train run: the same MLflow run, its own arguments, its last checkpoint, its attempts timed.

    verlflow train --resume <run_id>                 # same as: mlflow run . -e train -P resume=<run_id>

A train run records the arguments it was started with (tag ``verlflow.train_args``, vouched for by the digest
its first attempt logged as an immutable param, ``verlflow.train_args_sha256``: a tag rewritten on the server
is refused, never run); resuming reuses them for every argument the user leaves at its default, attaches to
that run (by its id), and the trainer continues from the run's newest checkpoint (its checkpoint folder is
keyed by run id); a verl run, from its newest checkpoint whose step reached the run
(:mod:`verlflow.backends.verl.resume`), logged as ``attempt/resumed_from_step``.
Each attempt's wall time is logged as ``attempt/e2e_s`` (step = attempt number) and ``timing_s/e2e``
sums every attempt. An attempt that could not log its own time (SIGKILL, the OOM killer) is timed on
resume from its start (tag ``verlflow.attempt``) to its last step. Launched through ``mlflow run``, the
launcher's fresh run only points at the resumed one (tag ``verlflow.resumed_run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import time
from collections.abc import Iterator
from typing import Any

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.names import ATTEMPT_TAG, HOST_TAG, PID_TAG, RESUMED_RUN_TAG, STEP_TAG, TRAIN_ARGS_TAG
from verlflow.process import lease, lifecycle
from verlflow.secrets import MASK, mask_text
from verlflow.tracking.run_logger import DirectLogger, RunLogger

ATTEMPT_METRIC = "attempt/e2e_s"
ARGS_DIGEST_PARAM = "verlflow.train_args_sha256"  # the digest of the train_args tag, logged once at the run's start
# The training step an attempt continued after (0 = from the start); step = attempt number.
RESUMED_FROM_STEP_METRIC = "attempt/resumed_from_step"
CHECKPOINT_PARAM = "trainer/default_local_dir"  # as verl's logger flattens trainer.default_local_dir
LIFE_SIGN_METRIC = "timing_s/step"  # logged at the end of every step, by both backends


def args_record(request: Any) -> tuple[dict[str, str], dict[str, str]]:
    """What lets ``--resume`` restart a run with the arguments (a train request) it was started with: a tag holding
    them, and a param holding the tag's digest (:data:`ARGS_DIGEST_PARAM`).

    Anyone with EDIT on the experiment can rewrite a tag; a param, once logged, cannot be changed. The resume runs
    what the tag says only while it still matches the param logged at the run's start (:func:`vouched_args`).
    """
    recorded = {f.name: getattr(request, f.name) for f in dataclasses.fields(request) if f.name != "resume"}
    text = mask_text(json.dumps(recorded, sort_keys=True))  # a secret is given again on resume
    return {TRAIN_ARGS_TAG: text}, {ARGS_DIGEST_PARAM: _digest(text)}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def vouched_args(run_id: str, tags: dict[str, str], params: dict[str, str]) -> dict[str, Any]:
    """The arguments run ``run_id`` was started with, from its tag, when the param logged at its start vouches for
    it; refused in one line when the tag was rewritten or cannot be vouched for. A run with neither resumes with
    the arguments the user gives now."""
    text, digest = tags.get(TRAIN_ARGS_TAG), params.get(ARGS_DIGEST_PARAM)
    if text is None and digest is None:
        return {}
    if text is None or digest is None:
        raise VerlflowError(f"resume: run {run_id}'s tag {TRAIN_ARGS_TAG} cannot be vouched for (it has no param "
                            f"{ARGS_DIGEST_PARAM} logged at its start): nothing it says is run; start a new run with "
                            "its arguments")
    if _digest(text) != digest:
        raise VerlflowError(f"resume: run {run_id}'s tag {TRAIN_ARGS_TAG} was changed after the run started (it no "
                            f"longer matches the param {ARGS_DIGEST_PARAM} logged then): nothing it says is run; "
                            "start a new run, and find out who edited this one")
    return json.loads(text)


def prepare_resume(request: Any) -> Any:
    """Check that ``request.resume`` names a resumable train run and return the request to resume it with.

    ``request`` is the step's train request (a dataclass): an argument the user gave (not equal to its
    default) wins over the recorded one; a different config is then refused by the trainer, which keeps
    the run's params. The caller attaches to the run by its id (``request.resume``).
    """
    run_id = request.resume
    client = MlflowClient()
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise VerlflowError(f"resume: no run with id '{run_id}' in this tracking store") from None
    tags = run.data.tags
    if tags.get(STEP_TAG) != "train":
        raise VerlflowError(f"resume: run {run_id} is a '{tags.get('verlflow.step', 'non-verlflow')}' run, "
                            "not a train run")
    if run.info.status == "FINISHED":  # before: exit 0 after a LoggedModel BAD_REQUEST warning, nothing trained
        raise VerlflowError(f"resume: run {run_id} is FINISHED: there is nothing to continue; register it "
                            f"(verlflow register --run_id {run_id}) or start a new run")
    if run.info.status == "RUNNING":
        reason = lifecycle.why_dead(tags)
        if reason is None:
            raise VerlflowError(f"resume: run {run_id} is still RUNNING (process {tags.get(PID_TAG, '?')} "
                                f"on {tags.get(HOST_TAG, '?')}): stop it first, or reap it if it is dead")
        lifecycle.reap([run.info.experiment_id], client=client)
    recorded = vouched_args(run_id, tags, run.data.params)
    if MASK in str(recorded.get("overrides") or "") and not request.overrides:
        raise VerlflowError(f"resume: run {run_id} was started with secrets in its overrides, recorded masked "
                            f"({recorded['overrides'][:200]}): give the same overrides again with --overrides")
    lease.take_lease(run_id)  # two resumes started together: one trains, the other is refused here
    changes = {f.name: recorded[f.name] for f in dataclasses.fields(request)
               if f.name in recorded and getattr(request, f.name) == f.default}
    overrides = changes.get("overrides", request.overrides)
    folder = run.data.params.get(CHECKPOINT_PARAM)
    if folder and "trainer.default_local_dir=" not in str(overrides or ""):
        # The run's own checkpoint folder, wherever it was started from (mlflow run works in the project dir).
        changes["overrides"] = f"{overrides or ''} trainer.default_local_dir={shlex.quote(folder)}".strip()
    launcher_run = os.environ.get("MLFLOW_RUN_ID")
    if launcher_run and launcher_run != run_id:
        with contextlib.suppress(MlflowException):
            client.set_tag(launcher_run, RESUMED_RUN_TAG, run_id)
    return dataclasses.replace(request, **changes)


@contextlib.contextmanager
def attempt_clock(run_id: str, started_at: float, logger: RunLogger | None = None) -> Iterator[float]:
    """Yield the start time that makes ``timing_s/e2e`` cover earlier attempts too; log this attempt's time
    through ``logger``, the run's (default: straight to MLflow).

    ``timing_s/e2e`` = the earlier attempts' ``attempt/e2e_s`` + (end of training - ``started_at``). A killed
    attempt that logged no time of its own is timed here first (:func:`killed_attempt_s`).
    """
    client = MlflowClient()
    logger = logger or DirectLogger(run_id, client)
    try:
        earlier = [m.value for m in client.get_metric_history(run_id, ATTEMPT_METRIC)]
        run = client.get_run(run_id)
    except MlflowException:
        earlier, run = [], None
    killed = killed_attempt_s(client, run, len(earlier)) if run is not None else None
    if killed is not None:
        earlier.append(killed)
        _log_attempt(logger, len(earlier), killed, int(time.time() * 1000))
    attempt = len(earlier) + 1
    started = {ATTEMPT_TAG: json.dumps({"attempt": attempt, "started_at": started_at})}
    with contextlib.suppress(Exception):  # bookkeeping for a later resume must not stop this attempt
        logger.set_tags(started)
    try:
        yield started_at - sum(earlier)
    finally:
        now = time.time()
        _log_attempt(logger, attempt, now - started_at, int(now * 1000))


def killed_attempt_s(client: MlflowClient, run, logged: int) -> float | None:
    """Seconds the run's last attempt lived when it ended without logging them; None when it logged them.

    From the attempt's start (tag ``verlflow.attempt``) to its last sign of life, its last step's
    ``timing_s/step`` (its heartbeat tag is this attempt's by now). The time after that step is not known.
    """
    try:
        last = json.loads(run.data.tags.get(ATTEMPT_TAG, ""))
        attempt, started_at = int(last["attempt"]), float(last["started_at"])
    except (ValueError, KeyError, TypeError):
        return None
    if attempt <= logged:
        return None
    signs = [started_at]
    with contextlib.suppress(MlflowException):
        signs += [m.timestamp / 1000 for m in client.get_metric_history(run.info.run_id, LIFE_SIGN_METRIC)]
    return max(signs) - started_at


def _log_attempt(logger: RunLogger, attempt: int, seconds: float, timestamp_ms: int) -> None:
    with contextlib.suppress(Exception):  # a tracking outage must not mask how the attempt ended
        logger.log_metrics({ATTEMPT_METRIC: seconds}, attempt, timestamp_ms)


def log_resumed_from(run_id: str, step: int) -> None:
    """Record on the run that the attempt now starting continues after training step ``step``."""
    client = MlflowClient()
    attempt = len(client.get_metric_history(run_id, ATTEMPT_METRIC)) + 1
    client.log_batch(run_id, metrics=[Metric(RESUMED_FROM_STEP_METRIC, step, int(time.time() * 1000), attempt)])
