"""Register a train run's final checkpoint as a model version with its lineage.

    verlflow register --run_id <train run>                  # its version (made once), alias challenger → it

``register`` registers the MLflow 3 LoggedModel the train step made of its final checkpoint
(:mod:`verlflow.outage.logged_models`, ``models:/<model_id>``): the version's source run is the train run,
and nothing is copied again. A run trained before models were recorded gets that LoggedModel now, from the
Hugging Face folder it ended with (tag ``verlflow.checkpoint_dir``). Its lineage is on the version as tags:
source run, recipe, profile, backend, data digest, and the digest of its weights (``weights.digest``). A train
run registered before keeps its version, and weights identical to an existing version's (another run of the
same recipe, data and seed, in whatever experiment) are that version: it is returned, no copy is added.

Promotion (moving ``champion`` to the best version) is :mod:`verlflow.models.promotion`; the alias and name
checks both use are :mod:`verlflow.models.aliases`. Their public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import mlflow
from mlflow.entities import LoggedModel
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.errors import VerlflowError
from verlflow.models import absent, champion_notes
from verlflow.models.aliases import (  # noqa: F401  (re-exported: callers import them from the registry)
    CHALLENGER,
    CHAMPION,
    MAX_MODEL_NAME,
    SEARCH_BEST,
    check_alias,
    check_model_name,
    point_alias,
)
from verlflow.models.checkpoint_record import recorded_digest, replaced_checkpoint
from verlflow.models.evaluate import VERSION_ACCURACY_TAG
from verlflow.models.model_uri import SOURCE_RUN_TAG
from verlflow.models.one_version import keep_one_version
from verlflow.models.weights_digest import WEIGHTS_DIGEST_TAG, weights_digest
from verlflow.names import (
    BACKEND_TAG,
    CHECKPOINT_DIR_TAG,
    CHECKPOINT_SOURCE_TAG,
    DATA_DIGEST_TAG,
    DATA_DIR_TAG,
    MODEL_NAME_TAG,
    MODEL_URI_TAG,
    MODEL_VERSION_TAG,
    PROFILE_TAG,
    RECIPE_TAG,
    STEP_TAG,
)
from verlflow.outage.store_retry import LockRetryingClient, retry_on_lock
from verlflow.platforms import tags as device_tags
from verlflow.tracking import naming as run_names
from verlflow.tracking import tracking
from verlflow.util import filter_quote

# On a register run: the train run had a version already, which was returned instead of a new one.
REUSED_VERSION_TAG = "verlflow.reused_version"
# Run tags copied onto the version (besides source_run_id): where and how the checkpoint was made.
LINEAGE_TAGS = (device_tags.TYPE_TAG, device_tags.NAME_TAG, RECIPE_TAG, PROFILE_TAG, BACKEND_TAG)


# --- register -----------------------------------------------------------------------------------


def model_name_for(run, model_name: str) -> str:
    """The registered model name: as given, else the run's ``verlflow.model_name``, else its recipe's."""
    if model_name:
        return model_name
    tags = run.data.tags
    if tags.get(MODEL_NAME_TAG):
        return tags[MODEL_NAME_TAG]
    recipe = tags.get(RECIPE_TAG)
    if recipe:
        from verlflow import config

        with contextlib.suppress(VerlflowError):
            name = config.load_recipe(recipe)[1].model_name
            if name:
                return str(name)
    raise VerlflowError(f"run {run.info.run_id} names no model (no tag verlflow.model_name, no recipe "
                        "model_name): pass -P model_name=<name>")


def data_digest_of(run) -> str | None:
    """The digest of the data a run trained on, for the version's ``data.digest`` lineage tag.

    Train runs carry it as a tag when their data folder was readable at launch; otherwise (data only on
    the cluster, runs from before the tag) it is the tag of the newest finished preprocess run that wrote
    the folder of its ``data/train_files`` before it started.
    """
    if run.data.tags.get(DATA_DIGEST_TAG):
        return run.data.tags[DATA_DIGEST_TAG]
    train_files = run.data.params.get("data/train_files")
    if not train_files:
        return None
    folder = filter_quote(str(Path(train_files).expanduser().resolve().parent))
    query = (f"tags.`{STEP_TAG}` = 'preprocess' and tags.`{DATA_DIR_TAG}` = '{folder}' "
             f"and attributes.status = 'FINISHED' and attributes.start_time <= {run.info.start_time}")
    producers = MlflowClient().search_runs([run.info.experiment_id], query, order_by=["attributes.start_time DESC"],
                                           max_results=1)
    return producers[0].data.tags.get(DATA_DIGEST_TAG) if producers else None


def checkpoint_of(run) -> Path:
    """The final checkpoint of a FINISHED train run; refuses anything else in one line."""
    run_id = run.info.run_id
    if not tracking.is_finished(run):
        raise VerlflowError(f"run {run_id} is {run.info.status}, not FINISHED: only a finished train run "
                            "can be registered")
    checkpoint = run.data.tags.get(CHECKPOINT_DIR_TAG)
    if not checkpoint:
        raise VerlflowError(f"run {run_id} has no final checkpoint (tag verlflow.checkpoint_dir): register a "
                            "train run that saved one")
    path = Path(checkpoint)
    if not (path / "config.json").is_file():
        raise VerlflowError(f"checkpoint of run {run_id} is missing: no Hugging Face model at {path}")
    from verlflow.models.checks import check_trained_checkpoint

    check_trained_checkpoint(checkpoint, run.data.tags.get(CHECKPOINT_SOURCE_TAG, ""))
    if (why := replaced_checkpoint(run, path)) is not None:
        raise VerlflowError(f"register: {why}")
    if recorded_digest(run) is None:
        print(f"register: warning: run {run_id} recorded no checkpoint digest (trained before verlflow recorded "
              f"one): {path} is taken as it is now", file=sys.stderr)
    return path



def checkpoint_model(client: MlflowClient, train_run, checkpoint: Path) -> LoggedModel:
    """The train run's final checkpoint as a READY LoggedModel whose source run is the train run.

    The one the train step logged; for a run trained before that (or whose store did not answer then), one
    made now from ``checkpoint``, linked at the step its folder names.
    """
    from verlflow.outage import logged_models

    found = logged_models.final_model_of(train_run.info.run_id, client)
    if found is not None:
        return found
    step = logged_models.step_in_path(train_run.data.tags.get(CHECKPOINT_SOURCE_TAG) or checkpoint)
    model = logged_models.log_final_model(client, train_run, checkpoint, step)
    logged_models.link_step_metrics(client, train_run.info.run_id)
    return model


def existing_version(client: MlflowClient, name: str, run_id: str) -> ModelVersion | None:
    """The lowest version of ``name`` registered from train run ``run_id``, if there is one."""
    query = f"name='{filter_quote(name)}' and tags.source_run_id = '{filter_quote(run_id)}'"
    try:
        versions = client.search_model_versions(query)
    except MlflowException:
        return None
    return min(versions, key=lambda mv: int(mv.version), default=None)


def identical_version(client: MlflowClient, name: str, digest: str | None) -> ModelVersion | None:
    """The lowest version of ``name`` whose weights have this digest (tag ``weights.digest``), if any."""
    if not digest:
        return None
    query = f"name='{filter_quote(name)}' and tags.`{WEIGHTS_DIGEST_TAG}` = '{filter_quote(digest)}'"
    try:
        versions = client.search_model_versions(query)
    except MlflowException:
        return None
    return min(versions, key=lambda mv: int(mv.version), default=None)


def register_checkpoint(run_id: str, model_name: str, alias: str = CHALLENGER, *,
                        step_run_id: str | None = None) -> ModelVersion:
    """Register a train run's final checkpoint as a model version with lineage; ``alias`` (challenger) → it.

    Logged in a ``register`` run: ``step_run_id`` when one was created for it (``main``'s child), else a new one.

    A train run registered before is not registered again: its version is returned (and gets the alias), so
    a rerun of ``main`` that reuses the train run adds no duplicate version.
    """
    train_run = tracking.get_run(run_id)
    run_id = train_run.info.run_id
    checkpoint = checkpoint_of(train_run)
    name = model_name_for(train_run, model_name)
    check_model_name(name)
    check_alias(alias)
    client = LockRetryingClient()
    tags = {STEP_TAG: "register", SOURCE_RUN_TAG: run_id, MODEL_NAME_TAG: name}
    # Filed with the train run (unless the caller chose an experiment), not in Default among nothing it relates to.
    beside = client.get_experiment(train_run.info.experiment_id).name
    digest = None
    known = existing_version(client, name, run_id)
    if known is None:
        digest = recorded_digest(train_run) or weights_digest(checkpoint)  # checkpoint_of checked the record
        known = identical_version(client, name, digest)
    if known is not None:
        with tracking.tracked_run(run_name=_register_name(step_run_id, name, known.version), tags=tags,
                                  run_id=step_run_id, experiment=beside):
            point_alias(client, name, alias, known.version)
            mlflow.set_tags({MODEL_VERSION_TAG: str(known.version), REUSED_VERSION_TAG: "true"})
        why = (f"run {run_id} is already" if digest is None
               else f"run {run_id}'s weights are identical to those of")
        print(f"register: {why} {name} version {known.version}: not registered again; "
              f"alias {alias} → {known.version}")
        return known
    lineage = {"source_run_id": run_id}
    if digest:
        lineage[WEIGHTS_DIGEST_TAG] = digest
    lineage.update({k: train_run.data.tags[k] for k in LINEAGE_TAGS if train_run.data.tags.get(k)})
    if digest := data_digest_of(train_run):
        lineage[DATA_DIGEST_TAG] = digest

    with tracking.tracked_run(run_name=_register_name(step_run_id, name), tags=tags, run_id=step_run_id,
                              experiment=beside) as run:
        model = checkpoint_model(client, train_run, checkpoint)
        with contextlib.redirect_stderr(io.StringIO()):  # MLflow's "Created version …": the line below says it
            mv = retry_on_lock(mlflow.register_model, model.model_uri, name, tags=lineage)
        mv = keep_one_version(client, mv, run_id)  # two registers at once: one version stays
        point_alias(client, name, alias, mv.version)
        retry_on_lock(mlflow.set_tags, {MODEL_VERSION_TAG: str(mv.version), MODEL_URI_TAG: model.model_uri})
        if step_run_id is None:
            client.update_run(run.info.run_id, name=run_names.register_run_name(name, mv.version))
    gone = [v for v in absent.deleted_from_run(client, name, run_id) if str(v) != str(mv.version)]
    again = f" (registered again: its version {', '.join(map(str, gone))} was deleted)" if gone else ""
    print(f"register: {name} version {mv.version} from run {run_id} ({checkpoint}); alias {alias} → "
          f"{mv.version}{again}")
    return mv


def _register_name(step_run_id: str | None, name: str, version: str | int | None = None) -> str | None:
    """A standalone register's run name; ``main``'s child keeps the name ``main`` gave it."""
    return None if step_run_id else run_names.register_run_name(name, version)


def describe_version(client: MlflowClient, name: str, version: str) -> str:
    """Give a version its one-line description from its tags (result, data, device, source run); returns it.

    ``accuracy 0.4375 on 512 test problems · data 3f2a… · cpu (recipe smoke) · from train run 5d1e…``
    """
    mv = client.get_model_version(name, version)
    tags = mv.tags
    parts = []
    if tags.get(VERSION_ACCURACY_TAG):
        parts.append(f"accuracy {float(tags[VERSION_ACCURACY_TAG]):.4f} on {tags.get('eval.gsm8k.num_samples', '?')} "
                     "test problems")
    if tags.get(DATA_DIGEST_TAG):
        parts.append(f"data {tags[DATA_DIGEST_TAG]}")
    if tags.get(device_tags.TYPE_TAG):
        parts.append(f"{tags[device_tags.TYPE_TAG]} (recipe {tags.get(RECIPE_TAG, '?')})")
    parts.append(f"from train run {tags.get('source_run_id') or mv.run_id}")
    model_tags = client.get_registered_model(name).tags
    text = champion_notes.with_note(" · ".join(parts), champion_notes.version_note(CHAMPION, model_tags, version))
    client.update_model_version(name, version, description=text)
    return text


# Promotion lives in its own module; these names stay importable from the registry (main, tests, scripts).
from verlflow.models.promotion import (  # noqa: E402, F401
    PromotionDecision,
    describe,
    describe_champion,
    metric_tag_key,
    promote_alias,
    promote_best,
)
