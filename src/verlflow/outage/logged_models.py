"""A train run's checkpoints as MLflow 3 LoggedModels, linked to the run and to the step that saved them.

    python -c "from verlflow.outage.logged_models import run_models; print(run_models('<train run id>'))"

The train step records them while the run is open (both backends), linked the way MLflow's own
``log_model(step=)`` links a model: the model's source run is the train run, the run's outputs list the
model at its step, and the run's metrics of that step are linked to the model (its page shows them).

- The **final** checkpoint (the local trainer's last ``global_step_<N>``, verl's merged one) is the
  LoggedModel ``model``: an MLflow transformers model carrying the run's params, its weights copied once,
  here. ``register`` makes a version from it and copies nothing; for a run trained before models were
  recorded (or whose recording failed) it makes the model then, the same way.
- An **intermediate** checkpoint the recipe saves (the local trainer's ``trainer.save_freq``) is the
  LoggedModel ``checkpoint-<N>``, which holds no artifacts: MLflow cannot point a LoggedModel's artifacts
  at files elsewhere, and copying every checkpoint would double the disk a run uses. Its weights stay in
  the folder its tag ``verlflow.checkpoint_dir`` names (``trainer.max_actor_ckpt_to_keep`` may delete it
  later); ``evaluate -P model_uri=models:/<model id>`` loads them from there.

Recording is best effort: a tracking store that does not answer costs a warning, never the training.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mlflow.entities import LoggedModel, LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.compat.mlflow import latest_metrics
from verlflow.names import CHECKPOINT_DIR_TAG
from verlflow.outage.store_retry import LockRetryingClient

log = logging.getLogger(__name__)

FINAL_MODEL = "model"  # the LoggedModel name of a run's final checkpoint
CHECKPOINT_MODEL = "checkpoint-{step}"  # ... and of an intermediate one
CHECKPOINT_STEP_TAG = "verlflow.checkpoint_step"  # on a LoggedModel: the global step of its checkpoint
# What loading the model needs; pinned to what saved it. Listed so MLflow does not infer requirements
# (slow, and it drags in the CUDA world from the environment).
REQUIRED_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "accelerate")
# Metrics whose step counts samples, not training steps: never linked to a model by step.
UNSTEPPED_PREFIXES = ("system/",)
_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch
# verl's checkpoint folder name (verlflow.backends.layout reads it; models/ does not import backends/, which
# imports models/).
_STEP_FOLDER = re.compile(r"global_step_(\d+)")


def pip_requirements() -> list[str]:
    """Pinned requirements of the logged model, from the installed versions (local tags like +cpu dropped)."""
    reqs = []
    for package in REQUIRED_PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            reqs.append(f"{package}=={version(package).split('+')[0]}")
    return reqs


def step_in_path(path: str | Path) -> int | None:
    """N of the nearest ``global_step_<N>`` folder at or above ``path``; None when there is none."""
    for folder in (Path(path), *Path(path).parents):
        if match := _STEP_FOLDER.fullmatch(folder.name):
            return int(match.group(1))
    return None


def run_models(run_id: str, client: MlflowClient | None = None) -> list[LoggedModel]:
    """Every READY LoggedModel whose source run is ``run_id``, oldest first."""
    client = client or MlflowClient()
    experiment_id = client.get_run(run_id).info.experiment_id
    found, token = [], None
    while True:
        page = client.search_logged_models(experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}'",
                                           page_token=token)
        found += [m for m in page if m.status == LoggedModelStatus.READY]
        token = page.token
        if not token:
            break
    return sorted(found, key=lambda m: m.creation_timestamp)


def final_model_of(run_id: str, client: MlflowClient | None = None, *, step: int | None = None) -> LoggedModel | None:
    """The newest READY final model of a run (at ``step`` when given), None when it has none."""
    models = [m for m in run_models(run_id, client) if m.name == FINAL_MODEL
              and (step is None or m.tags.get(CHECKPOINT_STEP_TAG) == str(step))]
    return models[-1] if models else None


def checkpoint_folder_of(model: LoggedModel) -> Path | None:
    """The folder an intermediate checkpoint's LoggedModel points at (it holds no artifacts); else None."""
    if model.name.startswith(CHECKPOINT_MODEL.split("{", 1)[0]) and model.tags.get(CHECKPOINT_DIR_TAG):
        return Path(model.tags[CHECKPOINT_DIR_TAG])
    return None


def log_final_model(client: MlflowClient, run, checkpoint: Path, step: int | None) -> LoggedModel:
    """Log ``checkpoint`` (a Hugging Face folder) as the run's final model, linked to the run at ``step``.

    Built with MLflow's public LoggedModel calls (create, log artifacts, finalize) rather than ``log_model``
    in an active run, so the same code serves the train step and ``register`` of a run that has ended
    (reopening it would rewrite its status and end time).
    """
    import mlflow.transformers

    run_id = run.info.run_id
    tags = {CHECKPOINT_DIR_TAG: str(checkpoint)}
    if step is not None:
        tags[CHECKPOINT_STEP_TAG] = str(step)
    model = client.create_logged_model(experiment_id=run.info.experiment_id, name=FINAL_MODEL, source_run_id=run_id,
                                       tags=tags, params=dict(run.data.params), model_type="transformers")
    try:
        with tempfile.TemporaryDirectory(prefix="verlflow-model-") as tmp:
            saved = Path(tmp) / FINAL_MODEL
            mlflow.transformers.save_model(str(checkpoint), path=str(saved), task="text-generation",
                                           pip_requirements=pip_requirements())
            client.log_model_artifacts(model.model_id, str(saved))
        if step is not None:
            client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step)])
    except BaseException:
        _drop_unfinished(client, model.model_id)
        raise
    return client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)


def _drop_unfinished(client: MlflowClient, model_id: str) -> None:
    """Remove a model whose upload failed (no orphan beside the READY one a later try makes); where the store
    refuses that too, mark it FAILED, and the run's next final model removes it (:func:`remove_unfinished_models`)."""
    for attempt in (1, 2):
        try:
            client.delete_logged_model(model_id)
            return
        except Exception as exc:  # the store is away: whatever it raised, the upload's own error is the one to tell
            # A server that aborted the refused upload may reset the kept-alive connection the delete reused: the
            # pool drops it, and one more try goes on a new one.
            if attempt == 2 or "Connection aborted" not in str(exc):
                break
    with contextlib.suppress(Exception):
        client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)


def record_final_model(run_id: str, checkpoint: str | Path, step: int, *,
                       defer: Callable[[str, str, int], bool] | None = None) -> LoggedModel | None:
    """The train step's end (both backends): the final checkpoint as the run's model at ``step``.

    Also links the run's metrics to every model of the run at its step (the intermediate checkpoints'
    included: their steps' metrics are only now all written). Made once per step (a resumed run that
    already recorded it reuses it). None when the tracking store refused: ``defer(run_id, checkpoint, step)``
    (the local trainer's :func:`verlflow.outage.metric_buffer.defer_final_model`) may queue it behind the run's
    metrics, to be made when the server answers or by the spill file's upload; otherwise a warning, and
    ``register`` makes the model later.
    """
    from verlflow.progress import say

    try:
        model = replay_final_model(LockRetryingClient(), run_id, checkpoint, step)
    except (MlflowException, OSError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if defer is not None and defer(run_id, str(checkpoint), step):
            say(f"verlflow: final checkpoint (step {step}) queued as MLflow model of run {run_id}: the tracking "
                f"store is not answering ({reason}); it is logged with the run's metrics once the server answers")
        else:
            log.warning("final checkpoint %s of run %s not recorded as an MLflow LoggedModel (%s); register will "
                        "make it", checkpoint, run_id, reason)
        return None
    say(f"verlflow: final checkpoint (step {step}) logged as MLflow model {model.model_id} of run {run_id}")
    return model


def replay_final_model(client: MlflowClient, run_id: str, checkpoint: str | Path, step: int) -> LoggedModel:
    """The run's final model at ``step`` (made from ``checkpoint`` unless the run already has it), its metrics
    linked; raises what the store raised. Shared by the train step's end and the replay of a queued one."""
    model = final_model_of(run_id, client, step=step)
    if model is None:
        model = log_final_model(client, client.get_run(run_id), Path(checkpoint), step)
    remove_unfinished_models(client, run_id)
    link_step_metrics(client, run_id)
    return model


def remove_unfinished_models(client: MlflowClient, run_id: str) -> list[str]:
    """Delete the run's LoggedModels that never became READY (an upload that failed, or was killed and left
    PENDING), once the run has its final model; returns their ids. Before, they stayed beside the READY one in
    the UI, an orphan ``model`` per fault (a SIGKILL mid-upload, then ``--resume``)."""
    experiment_id = client.get_run(run_id).info.experiment_id
    removed, token = [], None
    while True:
        page = client.search_logged_models(experiment_ids=[experiment_id], filter_string=f"source_run_id = '{run_id}'",
                                           page_token=token)
        for model in page:
            if model.status != LoggedModelStatus.READY:
                client.delete_logged_model(model.model_id)
                removed.append(model.model_id)
        token = page.token
        if not token:
            break
    if removed:
        log.info("removed %d unfinished LoggedModel(s) of run %s (an earlier upload failed or was killed)",
                 len(removed), run_id)
    return removed


def record_checkpoint_model(run_id: str, checkpoint: str | Path, step: int, *,
                            link: Callable[[str, str, int], bool] | None = None) -> LoggedModel | None:
    """An intermediate checkpoint as a LoggedModel of the run at ``step``, its weights left where they are.

    Called while training: a tracking store that does not answer costs a warning and the record, never the
    training. ``link(run_id, model_id, step)`` (the local trainer's :func:`verlflow.outage.metric_buffer.link_model`)
    links its step's metrics behind them in the run's metric writer (one write, kept in the spill file during an
    outage); otherwise, or when it returns False, the end of training links them (:func:`record_final_model`).
    """
    client = LockRetryingClient()
    try:
        experiment_id = client.get_run(run_id).info.experiment_id
        model = client.create_logged_model(
            experiment_id=experiment_id, name=CHECKPOINT_MODEL.format(step=step), source_run_id=run_id,
            tags={CHECKPOINT_DIR_TAG: str(checkpoint), CHECKPOINT_STEP_TAG: str(step)}, model_type="transformers")
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step)])
        model = client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    except (MlflowException, OSError) as exc:
        log.warning("checkpoint of step %d not recorded as an MLflow LoggedModel (tracking store: %s); training "
                    "goes on", step, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None
    if link is not None:
        link(run_id, model.model_id, step)
    return model


def link_step_metrics(client: MlflowClient, run_id: str) -> int:
    """Link the run's metrics to each model in its outputs, at the model's step; returns the points linked.

    What MLflow's ``log_model(step=)`` does for one model, done once for all: the run's points are logged
    again with the model's id (MLflow keeps one copy on the run, and a copy on the model's page). One read of
    the run gives every key's latest point, which is all a model at the run's last step needs; a model at an
    earlier step that has nothing linked yet (a checkpoint the trainer did not link as it saved it) has the
    points of its step read from the histories of the keys that went on past it.
    """
    run = client.get_run(run_id)
    models_at: dict[int, list[str]] = {}
    for output in (run.outputs.model_outputs if run.outputs else []) or []:
        models_at.setdefault(output.step, []).append(output.model_id)
    if not models_at:
        return 0
    # Points a model already has (linked by an earlier end of this run, before a resume) are not linked again:
    # MLflow's SQL store refuses a second copy (UNIQUE constraint), which failed the resumed run's final model.
    linked = {model_id: _linked_points(client, model_id) for ids in models_at.values() for model_id in ids}
    latest = {key: m for key, m in latest_metrics(run.data).items() if not key.startswith(UNSTEPPED_PREFIXES)}
    keys = [key for key in run.data.metrics if not key.startswith(UNSTEPPED_PREFIXES)]
    points = []
    for step, model_ids in models_at.items():
        here = [m for m in latest.values() if m.step == step]
        past = [key for key in keys if key not in latest or latest[key].step > step]
        for model_id in (m for m in model_ids if linked[m] is not None):  # None: removed (never finished)
            found = here + ([p for key in past for p in client.get_metric_history(run_id, key) if p.step == step]
                            if not linked[model_id] else [])
            points += [Metric(p.key, p.value, p.timestamp, p.step, model_id=model_id, run_id=run_id) for p in found
                       if (p.key, p.timestamp, p.step) not in linked[model_id]]
    for start in range(0, len(points), _METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=points[start:start + _METRICS_PER_BATCH])
    return len(points)


def _linked_points(client: MlflowClient, model_id: str) -> set[tuple[str, int, int]] | None:
    """The (key, timestamp, step) of the points linked to ``model_id``; None when it is gone (removed unfinished)."""
    try:
        model = client.get_logged_model(model_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None
    return {(m.key, m.timestamp, m.step) for m in model.metrics or ()}


def link_points(client: MlflowClient, run_id: str, model_id: str, points: list[Metric]) -> None:
    """Link ``points`` (one step's, as the trainer logged them) to the LoggedModel ``model_id``: one write."""
    linked = [Metric(p.key, p.value, p.timestamp, p.step, model_id=model_id, run_id=run_id) for p in points
              if not p.key.startswith(UNSTEPPED_PREFIXES)]
    for start in range(0, len(linked), _METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=linked[start:start + _METRICS_PER_BATCH])
