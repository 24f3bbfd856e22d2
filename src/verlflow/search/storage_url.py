"""The Optuna storage URL of a search: never with its password in it (``-P`` values are logged as run params).

    python -c "from verlflow.search.storage_url import check_storage_url; check_storage_url('postgresql://u@h/db')"
"""

from __future__ import annotations

import os

from verlflow.errors import VerlflowError
from verlflow.secrets import url_secret

STORAGE_PASSWORD_ENV = "VERLFLOW_STORAGE_PASSWORD"

def check_storage_url(storage: str) -> None:
    """A storage URL must not carry its password: ``-P`` values are logged as run params by ``mlflow run``."""
    where = url_secret(storage)
    if where is None:
        return
    launched = os.environ.get("MLFLOW_RUN_ID")
    cleanup = (f"; mlflow run has already logged it as a param of run {launched}: delete that run "
               "(mlflow runs delete --run-id …) and change the password") if launched else ""
    raise VerlflowError(
        f"storage URL holds a secret ({where}), which would be logged as a run param: drop it from the URL and "
        f"set PGPASSWORD or a ~/.pgpass line for PostgreSQL, or {STORAGE_PASSWORD_ENV} for any database{cleanup}"
    )


def storage_url_with_password(storage: str) -> str:
    """The URL to connect with: ``VERLFLOW_STORAGE_PASSWORD`` filled in where the URL names a user only."""
    password = os.environ.get(STORAGE_PASSWORD_ENV)
    if not password or "://" not in storage:
        return storage
    from sqlalchemy.engine import make_url

    url = make_url(storage)
    if url.username and url.password is None:
        return url.set(password=password).render_as_string(hide_password=False)
    return storage
