"""MLflow's private names verlflow relies on (checked on MLflow 3.5.1 and 3.17.2, the range pyproject.toml admits).

    python -c "from verlflow.compat.mlflow import replace_monitor_client; help(replace_monitor_client)"
    python -c "from verlflow.compat.mlflow import latest_metric_steps; help(latest_metric_steps)"
    python -c "from verlflow.compat.mlflow import generated_name_words; print(generated_name_words())"
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def replace_monitor_client(monitor: Any, make_client: Callable[[str], Any]) -> bool:
    """Make ``SystemMetricsMonitor`` write through ``make_client(tracking_uri)`` (a client whose writes wait out
    a SQLite lock: MLflow's monitor stops for good at its first failed write).

    ``monitor.mlflow_logger.client`` (the monitor's ``BatchMetricsLogger`` and its client, set in
    ``mlflow/system_metrics/system_metrics_monitor.py``): checked on MLflow 3.17.2, and 3.5.1 by
    scripts/test_lowest_mlflow.sh. Fallback: where it is gone the monitor keeps MLflow's own client (a
    warning; system metrics then stop at the first lock another run holds too long). Returns whether it was
    replaced.
    """
    logger = getattr(monitor, "mlflow_logger", None)
    client = getattr(logger, "client", None)
    uri = getattr(client, "tracking_uri", None)
    if client is None or uri is None:
        log.warning("system metrics: this MLflow's monitor has no mlflow_logger.client; its writes do not wait "
                    "out a locked store")
        return False
    logger.client = make_client(uri)
    return True


def latest_metric_steps(run_data: Any) -> dict[str, float]:
    """Each metric key of a run with the step of its latest point, from the ``RunData`` one ``get_run`` returned.

    ``RunData._metric_objs`` (the Metric objects behind ``RunData.metrics``, ``mlflow/entities/run_data.py``):
    checked on MLflow 3.17.2, and 3.5.1 by scripts/test_lowest_mlflow.sh. Fallback: where it is gone every key's
    step is unknown (``math.inf``), and callers read that key's history instead.
    """
    steps: dict[str, float] = dict.fromkeys(run_data.metrics, math.inf)
    for metric in getattr(run_data, "_metric_objs", None) or ():
        steps[metric.key] = metric.step
    return steps


def validate_alias_name(alias: str) -> None:
    """Raise MLflow's own ``MlflowException`` for an alias name MLflow would refuse when the alias is set.

    ``mlflow.utils.validation._validate_model_alias_name`` and ``_validate_model_alias_name_reserved`` (MLflow's
    alias rules exist only there): checked on MLflow 3.17.2, and 3.5.1 by scripts/test_lowest_mlflow.sh.
    Fallback: where they are gone nothing is checked here; MLflow still checks the name when the alias is set.
    """
    from mlflow.utils import validation

    for check in ("_validate_model_alias_name", "_validate_model_alias_name_reserved"):
        validate = getattr(validation, check, None)
        if validate is not None:
            validate(alias)


def generated_name_words() -> tuple[frozenset[str], frozenset[str]] | None:
    """The predicates and nouns MLflow draws a made-up run name from (``<predicate>-<noun>-<number>``).

    ``mlflow.utils.name_utils._GENERATOR_PREDICATES`` / ``_GENERATOR_NOUNS`` (no public "was this name
    generated"): checked on MLflow 3.17.2, and 3.5.1 by scripts/test_lowest_mlflow.sh. Fallback: None, and
    callers count any ``word-word-number`` name as made up.
    """
    try:
        from mlflow.utils.name_utils import _GENERATOR_NOUNS, _GENERATOR_PREDICATES
    except ImportError:
        return None
    return frozenset(_GENERATOR_PREDICATES), frozenset(_GENERATOR_NOUNS)


def latest_metrics(run_data: Any) -> dict[str, Any]:
    """Each metric key of a run with its latest point (a ``Metric``: value, timestamp, step), from the ``RunData``
    one ``get_run`` returned: what a run's last step logged, without one history read per key.

    ``RunData._metric_objs`` (as :func:`latest_metric_steps`): checked on MLflow 3.17.2, and 3.5.1 by
    scripts/test_lowest_mlflow.sh. Fallback: where it is gone the result is empty, and callers read histories.
    """
    return {metric.key: metric for metric in getattr(run_data, "_metric_objs", None) or ()}


def http_retries_end_at(stop: threading.Event) -> bool:
    """Make MLflow's HTTP client give up its remaining retries of a request once ``stop`` is set: a stop never
    interrupts a request (:mod:`verlflow.stopping`), so a request to a hung server ends after the try under way
    (its own timeout) instead of after every retry (a minute and more); a request begun after the stop still gets
    its one try (a run's end).

    The ``Retry`` class (urllib3's, and ``JitteredRetry`` under urllib3 < 2) that ``mlflow/utils/request_utils.py``
    builds its sessions with, replaced by a subclass whose ``is_exhausted`` is also true once ``stop`` is set, and
    its session cache ``_cached_get_request_session`` cleared: checked on MLflow 3.17.2, and 3.5.1 by
    scripts/test_lowest_mlflow.sh. Fallback: where they are gone a request runs out its retries as before (a stop
    then takes up to one call's whole bound, :mod:`verlflow.outage.deadline`). Returns whether it was replaced.
    """
    try:
        from mlflow.utils import request_utils
    except ImportError:
        return False
    replaced = False
    for name in ("Retry", "JitteredRetry"):
        base = getattr(request_utils, name, None)
        if not isinstance(base, type) or getattr(base, "verlflow_stop", None) is stop:
            continue

        def is_exhausted(self, _base=base) -> bool:
            return stop.is_set() or _base.is_exhausted(self)

        ending = type(base.__name__, (base,), {"is_exhausted": is_exhausted, "verlflow_stop": stop})
        setattr(request_utils, name, ending)
        replaced = True
    cache = getattr(request_utils, "_cached_get_request_session", None)
    if replaced and hasattr(cache, "cache_clear"):
        cache.cache_clear()
    return replaced
