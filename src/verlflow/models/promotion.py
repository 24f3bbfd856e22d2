"""Promote: move an alias (``champion``) to the best version by a metric, only when better beyond the noise.

    verlflow promote --model_name tiny-qwen3-gsm8k-smoke    # champion → best eval/gsm8k/accuracy

Versions are ranked by a metric, read from a version tag (``eval/gsm8k/accuracy`` → ``eval.gsm8k.accuracy``,
written by evaluate) or else from the version's source run, and the alias moves only to a version better beyond
the evaluation's noise (a paired test on the same problems, :mod:`verlflow.models.promotion_noise`; the gain and
its interval are printed and tagged) unless forced. MLflow has no compare-and-set for aliases, so after every
move it re-reads the registry and repairs the alias until a read confirms it: whichever of two racing promotions
writes last also checks last, so the alias never stays on the worse version. Aliases only; stages are deprecated
in MLflow and never used here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import mlflow
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow import stopping
from verlflow.errors import VerlflowError
from verlflow.models import absent, champion_notes
from verlflow.models.aliases import CHAMPION, check_alias
from verlflow.models.evaluate import VERSION_ACCURACY_TAG
from verlflow.models.model_uri import require_registered_model
from verlflow.models.promotion_noise import Gain, candidates_behind, measure_gain
from verlflow.names import MODEL_NAME_TAG, STEP_TAG, find_metric, metric_names
from verlflow.outage.store_retry import LockRetryingClient, retry_on_lock
from verlflow.tracking import naming as run_names
from verlflow.tracking import tracking
from verlflow.util import filter_quote

MAX_PROMOTION_ROUNDS = 20
_PLAIN_METRIC_KEY = re.compile(r"[\w\-./ ]+")  # what MLflow accepts as is, so verl leaves it unchanged


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
        raise _nothing_to_promote(client, name, metric)
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
            if not absent.model_exists(client, name):
                raise VerlflowError(f"registered model '{name}' was deleted while promote ran: nothing to "
                                    "promote") from None
            if str(state.best.version) not in {str(v) for v in absent.live_versions(client, name)}:
                raise VerlflowError(f"version {state.best.version} of registered model '{name}' was deleted while "
                                    "promote ran: run promote again") from None
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
        raise _nothing_to_promote(client, model_name, metric)
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


def _nothing_to_promote(client: MlflowClient, name: str, metric: str) -> VerlflowError:
    """Why no version can be promoted: the model or its versions were deleted, or none was evaluated."""
    if not absent.model_exists(client, name):
        return absent.missing_model(client, name)
    if not absent.live_versions(client, name):
        return absent.no_versions(client, name)
    return VerlflowError(f"no version of '{name}' has a value for '{metric}' (version tag "
                         f"'{metric_tag_key(metric)}' or a metric of its source run): evaluate a version first")


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


