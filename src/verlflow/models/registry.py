"""Register a train run's final checkpoint, and promote the best version with an alias.

    verlflow register --run_id <train run>                  # its version (made once), alias challenger → it
    verlflow promote --model_name tiny-qwen3-gsm8k-smoke    # champion → best eval/gsm8k/accuracy

``register`` registers the MLflow 3 LoggedModel the train step made of its final checkpoint
(:mod:`verlflow.runs.logged_models`, ``models:/<model_id>``): the version's source run is the train run,
and nothing is copied again. A run trained before models were recorded gets that LoggedModel now, from the
Hugging Face folder it ended with (tag ``verlflow.checkpoint_dir``). Its lineage is on the version as tags:
source run, recipe, profile, backend, data digest, and the digest of its weights (``weights.digest``). A train
run registered before keeps its version, and weights identical to an existing version's (another run of the
same recipe, data and seed, in whatever experiment) are that version: it is returned, no copy is added.

``promote`` ranks versions by a metric, read from a version tag (``eval/gsm8k/accuracy`` →
``eval.gsm8k.accuracy``, written by evaluate) or else from the version's source run, and moves an alias
(``champion``) only to a version better beyond the evaluation's noise (a paired test on the same problems,
:mod:`verlflow.models.promotion_noise`; the gain and its interval are printed and tagged) unless forced.
MLflow has no compare-and-set for aliases, so after every move it re-reads the registry and repairs the
alias until a read confirms it: whichever of two racing promotions writes last also checks last, so the
alias never stays on the worse version. Aliases only; stages are deprecated in MLflow and never used here.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.entities import LoggedModel
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow import stopping
from verlflow.errors import VerlflowError
from verlflow.models import champion_notes
from verlflow.models.evaluate import VERSION_ACCURACY_TAG
from verlflow.models.model_uri import SOURCE_RUN_TAG, require_registered_model
from verlflow.models.one_version import keep_one_version
from verlflow.models.promotion_noise import Gain, candidates_behind, measure_gain
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
    find_metric,
    metric_names,
)
from verlflow.runs import naming as run_names
from verlflow.runs import tracking
from verlflow.runs.store_retry import LockRetryingClient, retry_on_lock
from verlflow.util import filter_quote

CHALLENGER = "challenger"
CHAMPION = "champion"
# The alias a search moves to its best trial (evaluated first); challenger and champion are main's.
SEARCH_BEST = "search-best"
# On a register run: the train run had a version already, which was returned instead of a new one.
REUSED_VERSION_TAG = "verlflow.reused_version"
# Run tags copied onto the version (besides source_run_id): where and how the checkpoint was made.
LINEAGE_TAGS = ("device.type", "device.name", RECIPE_TAG, PROFILE_TAG, BACKEND_TAG)
MAX_PROMOTION_ROUNDS = 20
_PLAIN_METRIC_KEY = re.compile(r"[\w\-./ ]+")  # what MLflow accepts as is, so verl leaves it unchanged


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
    return path


def point_alias(client: MlflowClient, name: str, alias: str, version: str | int, attempts: int = 5) -> None:
    """Point ``alias`` of ``name`` at ``version``, riding out another process writing the same alias.

    Two search workers may set ``challenger`` at the same moment; a SQLite store refuses the second insert
    (a unique key). The write is idempotent, so it is simply retried; the last refusal is raised.
    """
    for attempt in range(attempts):
        try:
            client.set_registered_model_alias(name, alias, str(version))
            return
        except MlflowException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def checkpoint_model(client: MlflowClient, train_run, checkpoint: Path) -> LoggedModel:
    """The train run's final checkpoint as a READY LoggedModel whose source run is the train run.

    The one the train step logged; for a run trained before that (or whose store did not answer then), one
    made now from ``checkpoint``, linked at the step its folder names.
    """
    from verlflow.runs import logged_models

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
        digest = weights_digest(checkpoint)
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
    print(f"register: {name} version {mv.version} from run {run_id} ({checkpoint}); alias {alias} → "
          f"{mv.version}")
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
    if tags.get("device.type"):
        parts.append(f"{tags['device.type']} (recipe {tags.get(RECIPE_TAG, '?')})")
    parts.append(f"from train run {tags.get('source_run_id') or mv.run_id}")
    model_tags = client.get_registered_model(name).tags
    text = champion_notes.with_note(" · ".join(parts), champion_notes.version_note(CHAMPION, model_tags, version))
    client.update_model_version(name, version, description=text)
    return text


def describe_champion(client: MlflowClient, decision: PromotionDecision) -> None:
    """Write a promote decision where the registry shows it: which version holds the alias, since when, why.

    Tags on the registered model (:mod:`verlflow.models.champion_notes`), its description, and every version's
    description (its own line, then what the alias is to it). Kept apart from the decision itself.
    """
    if decision.version is None:
        return
    name, alias = decision.model_name, decision.alias
    current = client.get_registered_model(name).tags
    tags = champion_notes.decision_tags(alias, decision.version, decision.moved, decision.reason, current,
                                        champion_notes.now_utc())
    for key, value in tags.items():
        client.set_registered_model_tag(name, key, value)
    if alias != CHAMPION:  # the descriptions speak of the champion; other aliases keep their tags only
        return
    merged = {**current, **tags}
    client.update_registered_model(name, description=champion_notes.model_description(alias, merged))
    for mv in client.search_model_versions(f"name='{filter_quote(name)}'"):
        note = champion_notes.version_note(alias, merged, str(mv.version))
        client.update_model_version(name, mv.version, description=champion_notes.with_note(mv.description or "", note))


# MLflow's registry keeps a model's name in a 256-character column (registered_models.name).
MAX_MODEL_NAME = 256


def check_model_name(name: str) -> None:
    """A name MLflow's registry accepts and verlflow's URIs can carry (``models:/<name>/…``): no '/', ':' or
    blanks anywhere, at most :data:`MAX_MODEL_NAME` characters; checked before any work."""
    if not name.strip() or "/" in name or ":" in name or any(c.isspace() for c in name):
        raise VerlflowError(f"model name '{name}' is not a valid registered model name: no '/', ':' or blanks")
    if len(name) > MAX_MODEL_NAME:
        raise VerlflowError(f"model name '{name[:40]}…' is {len(name)} characters long: MLflow's registry holds at "
                            f"most {MAX_MODEL_NAME}")


# --- promote ------------------------------------------------------------------------------------


@dataclass
class PromotionDecision:
    """What promote did with an alias, and why."""

    model_name: str
    alias: str
    metric: str
    moved: bool
    version: str | None  # the alias holder afterwards
    value: float | None
    previous_version: str | None
    previous_value: float | None
    reason: str
    run_id: str | None = None
    gain: Gain | None = None  # the best version's gain over the previous holder, with its noise


def check_alias(alias: str) -> None:
    """Reject, in one line, an alias name MLflow would reject (checked before anything is written).

    MLflow's alias rules are only in its private validators (no public check); where they moved, MLflow
    still checks the name when the alias is set, only later.
    """
    from mlflow.utils import validation

    try:
        validation._validate_model_alias_name(alias)
        validation._validate_model_alias_name_reserved(alias)
    except AttributeError:  # the validators moved: MLflow checks the name when the alias is set
        return
    except MlflowException as exc:
        raise VerlflowError(f"alias '{alias}' is rejected by MLflow: {exc.message}") from None


def metric_tag_key(metric: str) -> str:
    """The version tag a metric is read from first (``eval/gsm8k/accuracy`` → ``eval.gsm8k.accuracy``)."""
    return VERSION_ACCURACY_TAG if metric == "eval/gsm8k/accuracy" else metric.replace("/", ".")


class _Scorer:
    """Reads a version's value of the metric: version tag first, then its source run's metric."""

    def __init__(self, client: MlflowClient, metric: str):
        self.client, self.metric = client, metric
        self.keys = [key for name in metric_names(metric) for key in (metric_tag_key(name), name)]
        self._runs: dict[str, dict[str, float]] = {}

    def __call__(self, mv: ModelVersion) -> float | None:
        for key in self.keys:
            raw = mv.tags.get(key)
            if raw not in (None, ""):
                try:
                    return float(raw)
                except ValueError:
                    continue
        run_id = mv.tags.get("source_run_id") or mv.run_id
        if not run_id:
            return None
        if run_id not in self._runs:
            try:
                self._runs[run_id] = self.client.get_run(run_id).data.metrics
            except MlflowException:
                self._runs[run_id] = {}
        run_metrics = self._runs[run_id]
        value = find_metric(run_metrics, self.metric)
        if value is None and not _PLAIN_METRIC_KEY.fullmatch(self.metric):
            # verl logs 'mean@1' as 'mean_at_1': look the metric up the way it was logged.
            value = run_metrics.get(tracking.sanitize_metric_key(self.metric))
        return value


@dataclass
class _State:
    holder: ModelVersion | None
    holder_value: float | None
    best: ModelVersion | None
    best_value: float | None
    gain: Gain | None = None  # the best's gain over the holder with its noise, where it can be measured


def _read_state(client: MlflowClient, name: str, alias: str, scorer: _Scorer) -> _State:
    """The alias holder and the best version, both read fresh from the registry."""
    versions = list(client.search_model_versions(f"name='{filter_quote(name)}'"))
    scored = [(value, int(mv.version), mv) for mv in versions if (value := scorer(mv)) is not None]
    holder = None
    with contextlib.suppress(MlflowException):
        holder = client.get_model_version_by_alias(name, alias)
    holder_value = scorer(holder) if holder is not None else None
    if not scored:
        return _State(holder, holder_value, None, None)
    best_value, _, best = max(scored, key=lambda item: (item[0], item[1]))  # ties: the newest version
    gain = None
    if holder is not None and holder_value is not None and str(holder.version) != str(best.version) \
            and best_value > holder_value:
        # the best was picked from every other scored version (and a search's from its trials): a best of k
        compared = sum(candidates_behind(client, mv) for _, _, mv in scored if str(mv.version) != str(holder.version))
        gain = measure_gain(client, scorer.metric, best, best_value, holder, holder_value, comparisons=compared)
    return _State(holder, holder_value, best, best_value, gain)


def _should_move(state: _State, force: bool) -> tuple[bool, str]:
    if state.best is None:
        return False, "no version has the metric"
    if state.holder is not None and str(state.holder.version) == str(state.best.version):
        return False, f"version {state.best.version} already holds it and is the best ({state.best_value:g})"
    if force:
        return True, "forced"
    if state.holder is None:
        return True, "no version held it"
    if state.holder_value is None:
        return True, f"the holder, version {state.holder.version}, has no value of the metric"
    if state.best_value > state.holder_value:
        than = f"{state.best_value:g} is better than {state.holder_value:g} of version {state.holder.version}"
        if state.gain is None:
            return True, f"{than} (no per-problem scores or sample counts to measure the noise)"
        if state.gain.beyond_noise:
            return True, f"{than}, beyond the noise: {state.gain.describe()}"
        return False, (f"version {state.best.version}'s {state.best_value:g} against {state.holder_value:g} of "
                       f"version {state.holder.version} is within the noise: {state.gain.describe()}")
    return False, (f"the best, {state.best_value:g} of version {state.best.version}, is not strictly better than "
                   f"{state.holder_value:g} of version {state.holder.version}")


def promote_alias(
    client: MlflowClient, name: str, metric: str, alias: str, force: bool,
    *, before_write: Callable[[], None] | None = None,
) -> PromotionDecision:
    """Move ``alias`` to the best version by ``metric`` (see the module docstring); no run, no printing.

    ``before_write`` runs between a decision and its write, where a racing promotion can interleave
    (tests use it to make that race happen on purpose).
    """
    scorer = _Scorer(client, metric)
    first = _read_state(client, name, alias, scorer)
    if first.best is None:
        raise VerlflowError(f"no version of '{name}' has a value for '{metric}' (version tag "
                            f"'{metric_tag_key(metric)}' or a metric of its source run): evaluate a version first")
    previous, previous_value = first.holder, first.holder_value
    state, moved, reason = first, False, ""
    for _ in range(MAX_PROMOTION_ROUNDS):
        move, why = _should_move(state, force and not moved)
        reason = why if not moved else reason  # the first decision is the one to explain
        if not move:
            break
        if before_write is not None:
            before_write()
        stopping.stop_point()  # a stop taken while the registry was read: the alias stays where it is
        try:
            client.set_registered_model_alias(name, alias, state.best.version)
        except MlflowException as exc:
            raise VerlflowError(f"MLflow refused alias '{alias}' on '{name}': {exc.message}") from None
        moved = True
        # Re-read: a racing promotion may have written in between with an older view of the registry.
        state = _read_state(client, name, alias, scorer)
    else:
        if _should_move(state, False)[0]:
            raise VerlflowError(f"alias '{alias}' of '{name}' kept changing under {MAX_PROMOTION_ROUNDS} promotions")
    final = state.holder
    moved = final is not None and (previous is None or str(final.version) != str(previous.version))
    return PromotionDecision(
        model_name=name, alias=alias, metric=metric, moved=moved,
        version=str(final.version) if final else None, value=state.holder_value,
        previous_version=str(previous.version) if previous else None, previous_value=previous_value, reason=reason,
        gain=first.gain,
    )


def promote_best(model_name: str, metric: str, alias: str, force: bool, *,
                 run_id: str | None = None) -> PromotionDecision:
    """Move ``alias`` (champion) to the best version by ``metric`` if better beyond the noise, in a ``promote`` run.

    ``run_id``: the run to log into, already created (``main``'s child); else a new one.
    """
    check_alias(alias)
    client = LockRetryingClient()
    require_registered_model(client, model_name)
    scorer = _Scorer(client, metric)
    if _read_state(client, model_name, alias, scorer).best is None:  # fail before opening a run
        raise VerlflowError(f"no version of '{model_name}' has a value for '{metric}' (version tag "
                            f"'{metric_tag_key(metric)}' or a metric of its source run): evaluate a version first")
    tags = {STEP_TAG: "promote", MODEL_NAME_TAG: model_name}
    run_name = None if run_id else run_names.promote_run_name(model_name, alias)
    with tracking.tracked_run(run_name=run_name, tags=tags, run_id=run_id,
                              experiment=None if run_id else _newest_version_experiment(client, model_name)) as run:
        decision = promote_alias(client, model_name, metric, alias, force)
        decision.run_id = run.info.run_id
        retry_on_lock(mlflow.set_tags, {
            "promote.alias": alias, "promote.metric": metric, "promote.moved": str(decision.moved).lower(),
            "promote.version": decision.version or "", "promote.previous_version": decision.previous_version or "",
            "promote.reason": decision.reason[:5000],
        })
        if (gain := decision.gain) is not None:
            retry_on_lock(mlflow.set_tags, {"promote.gain": f"{gain.gain:.6g}", "promote.gain_low": f"{gain.low:.6g}",
                                            "promote.gain_high": f"{gain.high:.6g}",
                                            "promote.problems": str(gain.problems), "promote.test": gain.method,
                                            "promote.comparisons": str(gain.comparisons)})
            if gain.p_value is not None:
                retry_on_lock(mlflow.set_tag, "promote.p_value", f"{gain.p_value:.4g}")
    describe_champion(client, decision)
    print(describe(decision))
    return decision


def _newest_version_experiment(client: MlflowClient, name: str) -> str | None:
    """Where a standalone promote is filed (unless the caller chose): beside the newest version's train run."""
    try:
        versions = client.search_model_versions(f"name='{filter_quote(name)}'")
        newest = max(versions, key=lambda mv: int(mv.version), default=None)
        run_id = newest and (newest.tags.get("source_run_id") or newest.run_id)
        return client.get_experiment(client.get_run(run_id).info.experiment_id).name if run_id else None
    except MlflowException:
        return None


def describe(decision: PromotionDecision) -> str:
    """One line saying what promote did and why."""
    where = f"'{decision.model_name}' alias {decision.alias}"
    if decision.moved:
        before = f"version {decision.previous_version}" if decision.previous_version else "unset"
        return f"promote: {where}: {before} → version {decision.version} ({decision.metric}: {decision.reason})"
    return f"promote: {where} stays on version {decision.version} ({decision.metric}: {decision.reason})"

