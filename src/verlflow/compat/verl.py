"""verl's private names verlflow relies on (checked on verl 0.5.0 and 0.9.x, tests/test_verl_version_matrix.py).

    python -c "from verlflow.compat.verl import mlflow_params; print(mlflow_params({'a': {'b': [1, 2]}}))"

Both live in ``verl/utils/tracking.py`` and are what verl's own MLflow logger calls; reusing them keeps a local
run's param keys and metric names identical to a verl run's, so ``compare`` can diff the two.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from verlflow.errors import VerlflowError

SUPPORTED = ">=0.5.0,<0.10"


def mlflow_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` flattened as verl's MLflow logger flattens it (``a/b/c``, lists as ``x/list_len``).

    ``verl.utils.tracking._compute_mlflow_params_from_objects``: checked on verl 0.5.0 through 0.9.x. Fallback:
    none that would keep the keys equal; a verl without it is one line naming the supported range.
    """
    try:
        from verl.utils.tracking import _compute_mlflow_params_from_objects
    except ImportError as exc:
        raise VerlflowError(f"this verl has no verl.utils.tracking._compute_mlflow_params_from_objects: "
                            f"install a verl verlflow supports ({SUPPORTED}): {exc}") from None
    return _compute_mlflow_params_from_objects(dict(config))


@functools.lru_cache(maxsize=1)
def metric_key_sanitizer() -> Callable[[str], str]:
    """verl's metric-key sanitizer (``@`` → ``_at_``, characters MLflow refuses → ``_``).

    ``verl.utils.tracking._MlflowLoggingAdapter()._sanitize_key``: checked on verl 0.5.0 through 0.9.x.
    Fallback: a verl without it is one line naming the supported range.
    """
    try:
        from verl.utils.tracking import _MlflowLoggingAdapter
    except ImportError as exc:
        raise VerlflowError(f"this verl has no verl.utils.tracking._MlflowLoggingAdapter: "
                            f"install a verl verlflow supports ({SUPPORTED}): {exc}") from None
    return _MlflowLoggingAdapter()._sanitize_key
