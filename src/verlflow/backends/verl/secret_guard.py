"""Loaded into verl's processes when a launch carries secret overrides: verl's own MLflow params are masked.

    VERL_USE_EXTERNAL_MODULES=verlflow.backends.verl.secret_guard python -m verl.trainer.main_ppo …

A secret override reaches verl as ``${oc.env:VERLFLOW_SECRET_<n>}`` (:mod:`.command`), so verl's config holds
the real value once resolved — and verl's MLflow logger logs that resolved config as the run's params
(``verl.utils.tracking.Tracking``). verl (>= 0.9) imports the modules named in ``VERL_USE_EXTERNAL_MODULES``
at the end of ``import verl`` in its driver and every Ray worker; this one wraps
``verl.utils.tracking._compute_mlflow_params_from_objects`` (private: :func:`verlflow.compat.verl.patch_mlflow_params`;
absent → a warning, nothing patched) so each param value passes :func:`verlflow.secrets.mask_value` first. The
launch's secret variables are read from this process's environment (``VERLFLOW_SECRET_<n>`` and the
secret-named ones), so a value is masked wherever it appears, whatever key it sits under.
"""

from __future__ import annotations

import functools
import warnings

from verlflow import secrets
from verlflow.compat import verl as compat_verl


def _masked_params(compute):
    @functools.wraps(compute)
    def wrapper(*args, **kwargs):
        params = compute(*args, **kwargs)
        known = secrets.known_values()
        return {key: (secrets.mask_text(value, known=known) if isinstance(value, str) and
                      not secrets.key_names_secret(key) else secrets.mask_value(key, value))
                for key, value in params.items()}

    return wrapper


def install() -> bool:
    """Wrap verl's param flattening so its MLflow logger logs masked values; False where verl has no such hook."""
    patched = compat_verl.patch_mlflow_params(_masked_params)
    if patched is False:
        warnings.warn("verlflow: this verl has no _compute_mlflow_params_from_objects; its MLflow params are not "
                      "masked", stacklevel=1)
    return bool(patched)


install()
