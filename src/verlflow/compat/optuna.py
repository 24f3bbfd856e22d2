"""Optuna's private names verlflow relies on (present since Optuna 2.x; checked on 5.1.0).

    python -c "from verlflow.compat.optuna import BaseHeartbeat; help(BaseHeartbeat)"

``BaseHeartbeat`` (``optuna/storages/_heartbeat.py``): Optuna has no public heartbeat base class, and its
optimize loop records heartbeats and fails stale trials only for storages that subclass this one (RDBStorage
does; JournalStorage does not). A subclass implements ``record_heartbeat``, ``_get_stale_trial_ids``,
``get_heartbeat_interval`` and ``get_heartbeat_stale_trial_callback``. Fallback: none; without it a killed
worker's trial on a journal file would stay RUNNING forever, so an Optuna that moved it is refused at import
(tests/test_search_workers.py's retry checks it).
"""

from __future__ import annotations

import optuna

try:
    from optuna.storages._heartbeat import BaseHeartbeat
except ImportError as exc:  # pragma: no cover - an Optuna that moved it
    raise ImportError(f"optuna {optuna.__version__} has no optuna.storages._heartbeat.BaseHeartbeat, which "
                      "verlflow's journal heartbeats need: install optuna>=4.2,<6") from exc

__all__ = ["BaseHeartbeat", "OPTIMIZE_LOGGER"]

# The logger of Optuna's optimize loop (``optuna/study/_optimize.py``, ``_log_failed_trial``): it logs a trial whose
# objective raised, with the traceback. Checked on Optuna 5.1.0. Fallback: none needed: a filter on a logger
# Optuna no longer uses is inert (the traceback is back, nothing breaks).
OPTIMIZE_LOGGER = "optuna.study._optimize"


def trial_id(trial: optuna.trial.FrozenTrial) -> int:
    """The storage's id of ``trial`` (what a storage's trial methods take; ``FrozenTrial._trial_id``, no public
    name). Checked on Optuna 5.1.0. Fallback: none (AttributeError), as the storages themselves read it."""
    return trial._trial_id


def rdb_stale_trial_ids(storage: optuna.storages.RDBStorage, study_id: int) -> list[int]:
    """RDBStorage's own stale trials of ``study_id`` (no heartbeat for the grace period):
    ``RDBStorage._get_stale_trial_ids``, which Optuna's optimize loop calls through ``BaseHeartbeat``. Checked on
    Optuna 5.1.0. Fallback: none (AttributeError): an RDBStorage without it has no heartbeat either."""
    return list(optuna.storages.RDBStorage._get_stale_trial_ids(storage, study_id))
