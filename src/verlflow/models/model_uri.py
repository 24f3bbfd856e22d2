"""Where a model URI points: local folders to load it from, and the training run behind it.

    python -c "from verlflow.models.model_uri import resolve_model; print(resolve_model('models:/my-model@champion'))"

Accepted: ``models:/<name>@<alias>``, ``models:/<name>/<version>``, ``models:/m-<id>`` (an MLflow 3
logged model; a train run's intermediate checkpoint is read from its folder), ``runs:/<run_id>/<path>``,
``runs:/<run_id>`` (the run's final checkpoint, tag ``verlflow.checkpoint_dir``; evaluations of it are
linked to the run's final LoggedModel), a local Hugging Face or MLflow transformers model folder, and a Hugging Face
hub id (``Qwen/Qwen3-4B``), taken from Hugging Face's cache and downloaded into it first when missing, as
verl does (``huggingface_hub.snapshot_download``; ``HF_HOME``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` apply).
Anything that points at nothing is one line naming what exists instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow import stopping
from verlflow.errors import VerlflowError
from verlflow.models import absent
from verlflow.models.checks import check_model_folder, check_tokenizer_folder
from verlflow.models.model_path import is_hub_id
from verlflow.names import CHECKPOINT_DIR_TAG, SOURCE_RUN_TAG
from verlflow.util import first_line

_URI_FORMS = ("runs:/<run_id>[/<path>], models:/<name>@<alias>, models:/<name>/<version>, a hub id (org/name) "
              "or a local model folder")


@dataclass
class ResolvedModel:
    """Where a model URI points: local folders to load from, and the lineage we could find."""

    uri: str
    model_dir: Path
    tokenizer_dir: Path
    # The training run the weights came from (None for a bare folder).
    source_run_id: str | None = None
    registered_name: str | None = None
    version: str | None = None
    # The MLflow 3 LoggedModel behind it (evaluation metrics are linked to it), when there is one.
    model_id: str | None = None


def resolve_model(model_uri: str) -> ResolvedModel:
    """Turn a model URI into local folders plus lineage; one clear line when it points at nothing."""
    uri = model_uri.strip()
    if not uri:
        raise VerlflowError(f"model_uri is empty: give {_URI_FORMS}")
    if uri.startswith("models:/"):
        return _resolve_registered(uri)
    if uri.startswith("runs:/"):
        return _resolve_run(uri)
    folder = Path(uri).expanduser()
    if folder.is_dir():
        return _from_folder(uri, folder)
    if is_hub_id(uri):
        return _from_hub(uri)
    raise VerlflowError(f"model '{model_uri}' is neither an existing folder nor a model URI: give {_URI_FORMS}")


def _resolve_registered(uri: str) -> ResolvedModel:
    client = MlflowClient()
    ref = uri.removeprefix("models:/").strip("/")
    name, alias, version = ref, None, None
    if "@" in ref:
        name, _, alias = ref.partition("@")
    elif "/" in ref:
        name, _, version = ref.rpartition("/")
    elif ref.startswith("m-"):  # an MLflow 3 logged model id: no registry lineage
        resolved = _from_logged_model(client, uri, ref)
        resolved.model_id = ref
        return resolved
    else:
        raise VerlflowError(f"model URI '{uri}' names no version: use models:/{ref}@<alias> or models:/{ref}/<n>")
    require_registered_model(client, name)
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException:
        raise (absent.missing_alias(client, name, alias) if alias
               else absent.missing_version(client, name, version)) from None
    source_run = mv.tags.get("source_run_id") or _source_of_run(client, mv.run_id)
    resolved = _from_download(f"models:/{name}/{mv.version}", source_run_id=source_run)
    resolved.uri, resolved.registered_name, resolved.version = uri, name, str(mv.version)
    resolved.model_id = logged_model_id(mv)
    return resolved


def logged_model_id(mv) -> str | None:
    """The LoggedModel a registered version was made from (``models:/m-…`` source), None for older versions."""
    model_id = getattr(mv, "model_id", None)
    if model_id:
        return model_id
    source = str(getattr(mv, "source", "") or "")
    ref = source.removeprefix("models:/")
    return ref if source.startswith("models:/") and ref.startswith("m-") and "/" not in ref else None


def require_registered_model(client: MlflowClient, name: str) -> None:
    """One clear line when no registered model has this name: deleted (named so) or never made, listing what exists."""
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        stopping.stop_point()  # the request failed riding out its timeout after a stop: no second one
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise  # the server failed or did not answer: the step words that (not "no such model")
        raise absent.missing_model(client, name) from None


def _resolve_run(uri: str) -> ResolvedModel:
    client = MlflowClient()
    run_id, _, path = uri.removeprefix("runs:/").partition("/")
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise VerlflowError(f"no run '{run_id}' in the tracking store {mlflow.get_tracking_uri()}") from None
    source = run.data.tags.get(SOURCE_RUN_TAG, run_id)
    if not path.strip("/"):
        checkpoint = run.data.tags.get(CHECKPOINT_DIR_TAG)
        if not checkpoint:
            raise VerlflowError(f"run {run_id} has no final checkpoint (tag verlflow.checkpoint_dir): "
                                f"give runs:/{run_id}/<artifact path> instead")
        from verlflow.models.checkpoint_record import replaced_checkpoint

        if (why := replaced_checkpoint(run, checkpoint)) is not None:
            raise VerlflowError(why)
        resolved = _from_folder(uri, Path(checkpoint))
        resolved.source_run_id = source
        resolved.model_id = _final_model_id(client, run_id)
        return resolved
    return _from_download(uri, source_run_id=source)


def _final_model_id(client: MlflowClient, run_id: str) -> str | None:
    """The LoggedModel the train step made of the run's final checkpoint (evaluations are linked to it)."""
    from verlflow.outage.logged_models import final_model_of

    model = final_model_of(run_id, client)
    return model.model_id if model is not None else None


def _from_download(uri: str, *, source_run_id: str | None) -> ResolvedModel:
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except MlflowException as exc:
        if "No such artifact" in str(exc):  # a local store whose artifacts were removed
            raise _artifacts_gone(uri, "no files") from None
        raise VerlflowError(f"cannot download model '{uri}': {first_line(exc)}") from None
    except OSError as exc:  # the same on MLflow < 3.6: a bare OSError naming the missing folder
        if "No such file or directory" not in str(exc):
            raise
        raise _artifacts_gone(uri, "no files") from None
    if local.is_dir() and not (local / "MLmodel").is_file() and not (local / "config.json").is_file():
        # A server downloads nothing, without an error, when the artifacts are gone: not a folder the user gave
        raise _artifacts_gone(uri, "no files" if not any(local.iterdir()) else "no MLmodel or config.json")
    resolved = _from_folder(uri, local)
    resolved.source_run_id = source_run_id
    return resolved


def _artifacts_gone(uri: str, held: str) -> VerlflowError:
    return VerlflowError(f"model '{uri}' has {held} in the artifact store (its artifacts were removed): register "
                         "its run again, or give another version")


def _from_hub(repo_id: str) -> ResolvedModel:
    """A hub model's snapshot in Hugging Face's cache, downloaded into it first when the hub can be reached."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        local = Path(snapshot_download(repo_id=repo_id))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        raise VerlflowError(
            f"hub model '{repo_id}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why} (offline): "
            f"download it where the hub is reachable (hf download {repo_id}) or give a local model folder"
        ) from None
    except RepositoryNotFoundError:
        raise VerlflowError(f"hub model '{repo_id}' does not exist on the Hugging Face hub (or needs a login "
                            f"it does not have): give an existing hub id or a local model folder") from None
    except (HfHubHTTPError, ValueError, OSError) as exc:
        raise VerlflowError(f"cannot download hub model '{repo_id}': {first_line(exc)}") from None
    return _from_folder(repo_id, local)


def _from_folder(uri: str, folder: Path) -> ResolvedModel:
    """A Hugging Face folder, or an MLflow transformers model folder (``MLmodel`` + ``model/``)."""
    if (folder / "MLmodel").is_file():
        from mlflow.models import Model

        flavor = Model.load(str(folder / "MLmodel")).flavors.get("transformers")
        if not flavor or not flavor.get("model_binary"):
            raise VerlflowError(f"model '{uri}' is not a transformers model saved with its weights")
        model_dir = folder / flavor["model_binary"]
        tokenizer_dir = folder / "components" / "tokenizer"
        tokenizer_dir = tokenizer_dir if tokenizer_dir.is_dir() else model_dir
        check_tokenizer_folder(tokenizer_dir)
        return ResolvedModel(uri, model_dir, tokenizer_dir)
    if not (folder / "config.json").is_file():
        raise VerlflowError(f"model folder '{folder}' has no config.json: give a Hugging Face model folder")
    check_model_folder(folder)
    check_tokenizer_folder(folder)  # else transformers loads no chat template and evaluate fails asking for one
    return ResolvedModel(uri, folder, folder)


def _source_of_run(client: MlflowClient, run_id: str | None) -> str | None:
    """The training run behind a run that logged a model (a register run points at it by tag)."""
    if not run_id:
        return None
    try:
        return client.get_run(run_id).data.tags.get(SOURCE_RUN_TAG, run_id)
    except MlflowException:
        return run_id


def _from_logged_model(client: MlflowClient, uri: str, model_id: str) -> ResolvedModel:
    """A LoggedModel's artifacts; an intermediate checkpoint's (which holds none) from the folder it names."""
    from verlflow.outage.logged_models import checkpoint_folder_of

    try:
        model = client.get_logged_model(model_id)
    except MlflowException:
        raise VerlflowError(f"no logged model '{model_id}' in the tracking store {mlflow.get_tracking_uri()}") from None
    source_run_id = _source_of_run(client, model.source_run_id)
    folder = checkpoint_folder_of(model)
    if folder is None:
        return _from_download(uri, source_run_id=source_run_id)
    if not (folder / "config.json").is_file():
        raise VerlflowError(f"logged model '{model_id}' is a checkpoint kept at {folder}, which is gone (the trainer "
                            "keeps only the newest trainer.max_actor_ckpt_to_keep): evaluate a newer one")
    resolved = _from_folder(uri, folder)
    resolved.source_run_id = source_run_id
    return resolved

