"""Names the registry accepts, and an alias write that rides out a racing writer.

The aliases verlflow moves (``challenger`` by register, ``champion`` by promote, ``search-best`` by a search),
the checks of a model name and an alias name made before any work, and :func:`point_alias`. Shared by
:mod:`verlflow.models.registry` (register) and :mod:`verlflow.models.promotion` (promote).
"""

from __future__ import annotations

import time

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verlflow.compat import mlflow as compat_mlflow
from verlflow.errors import VerlflowError

CHALLENGER = "challenger"
CHAMPION = "champion"
# The alias a search moves to its best trial (evaluated first); challenger and champion are main's.
SEARCH_BEST = "search-best"


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


def check_alias(alias: str) -> None:
    """Reject, in one line, an alias name MLflow would reject (checked before anything is written).

    MLflow's alias rules are only in its private validators (:func:`verlflow.compat.mlflow.validate_alias_name`);
    where they moved, MLflow still checks the name when the alias is set, only later.
    """
    try:
        compat_mlflow.validate_alias_name(alias)
    except MlflowException as exc:
        raise VerlflowError(f"alias '{alias}' is rejected by MLflow: {exc.message}") from None



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

