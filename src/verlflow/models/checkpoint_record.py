"""A train run's final checkpoint, vouched for by the digest the run recorded when it made it.

The folder a run names is a tag (``verlflow.checkpoint_dir``), which anyone with EDIT on its experiment can
rewrite, and the folder may sit on a shared disk others write. When a train run records its final checkpoint it
also logs the weights' digest (:func:`verlflow.models.weights_digest.weights_digest`) as the immutable param
``verlflow.checkpoint_sha256``. ``main``'s reuse, ``register`` and ``evaluate runs:/<id>`` take the folder only
while its weights still have that digest: a rewritten tag or a replaced folder is refused in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verlflow.models.weights_digest import weights_digest
from verlflow.names import CHECKPOINT_DIGEST_PARAM
from verlflow.util import first_line

log = logging.getLogger(__name__)


def record_digest(run_id: str, folder: str | Path, log_params: Callable[[dict[str, str]], Any]) -> None:
    """Log the weights' digest of ``run_id``'s final checkpoint as its param (through ``log_params``, the run's
    own writer). Written once: a run resumed after it recorded its checkpoint keeps the first record (a warning
    when the new one differs). Best effort: with the store away, a warning says reuse will retrain the run and
    register will take the folder as it is; the run's end is not put at risk for it."""
    from verlflow.tracking import lookups
    from verlflow.tracking.run_logger import store_errors

    digest = weights_digest(folder)
    if digest is None:
        return
    try:
        recorded = lookups.run_by_id(run_id).data.params.get(CHECKPOINT_DIGEST_PARAM)
        if recorded is None:
            log_params({CHECKPOINT_DIGEST_PARAM: digest})
    except store_errors() as exc:
        log.warning("checkpoint digest of run %s not recorded (tracking store unavailable: %s): main will train it "
                    "again rather than reuse it, register will take %s as it is", run_id, first_line(exc, 200),
                    folder)
        return
    if recorded is not None and recorded != digest:
        log.warning("run %s recorded checkpoint digest %s in an earlier attempt; its new final checkpoint %s has "
                    "%s: register and reuse will refuse it (train a new run)", run_id, recorded, folder, digest)


def recorded_digest(run: Any) -> str | None:
    """The weights digest ``run`` recorded with its final checkpoint (None for a run trained before the record)."""
    return run.data.params.get(CHECKPOINT_DIGEST_PARAM)


def replaced_checkpoint(run: Any, folder: str | Path) -> str | None:
    """One line saying that ``folder`` is not the checkpoint ``run`` recorded (its weights' digest differs from
    the param); None when it is, or when the run recorded no digest."""
    recorded = recorded_digest(run)
    if recorded is None:
        return None
    found = weights_digest(folder)
    if found == recorded:
        return None
    return (f"the checkpoint at {folder} is not the one run {run.info.run_id} recorded when it trained (weights "
            f"{found or 'absent'}, recorded {recorded} in param {CHECKPOINT_DIGEST_PARAM}): the folder was replaced "
            "or the run's tag verlflow.checkpoint_dir rewritten; use a run whose checkpoint is intact")
