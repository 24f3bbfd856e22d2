"""Checks of user input that every step makes before it opens a run or starts heavy work.

    python -c "from verlflow.input_checks import check_output_dir; check_output_dir('/etc/passwd/x', 'output_dir')"

Each check raises :class:`~verlflow.errors.VerlflowError` with one line that names the bad value and
what would be valid, so a bad input costs seconds, leaves no run behind and prints no traceback.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from verlflow.errors import Problem, VerlflowError, raise_problems
from verlflow.util import first_line

# verl keys that count something: an integer >= the minimum (None allowed where verl derives the value).
COUNT_KEYS: dict[str, int] = {
    "data.train_batch_size": 1,
    "data.max_prompt_length": 1,
    "data.max_response_length": 1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "trainer.total_epochs": 1,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
}
OPTIONAL_COUNT_KEYS: dict[str, int] = {
    "trainer.total_training_steps": 1,
    "data.val_batch_size": 1,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
}
# Integers where -1 means "off" (verl's convention): any integer >= -1.
SWITCH_KEYS = ("trainer.save_freq", "trainer.test_freq")
NON_NEGATIVE_NUMBERS = ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.kl_loss_coef",
                        "actor_rollout_ref.actor.entropy_coeff")
STORAGE_PASSWORD_ENV = "VERLFLOW_STORAGE_PASSWORD"
_STEP = re.compile(r"global_step_(\d+)")


def _select(resolved: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(resolved, key, default=None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def config_count_problems(resolved: Any) -> list[Problem]:
    """Counts and sizes of a composed config that are not integers of the right sign (``total_training_steps=-1``
    would train nothing and still end FINISHED; ``=abc`` would fail minutes later inside verl)."""
    problems = []
    for key, minimum in {**COUNT_KEYS, **OPTIONAL_COUNT_KEYS}.items():
        value = _select(resolved, key)
        if value is None and key in OPTIONAL_COUNT_KEYS:
            continue
        if not _is_int(value) or value < minimum:
            unset = " (or leave it unset)" if key in OPTIONAL_COUNT_KEYS else ""
            problems.append(Problem(key, repr(value), f"must be an integer >= {minimum}{unset}"))
    for key in SWITCH_KEYS:
        value = _select(resolved, key)
        if value is not None and (not _is_int(value) or value < -1):
            problems.append(Problem(key, repr(value), "must be an integer: a step interval >= 1, or -1 for off"))
    for key in NON_NEGATIVE_NUMBERS:
        value = _select(resolved, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            problems.append(Problem(key, repr(value), "must be a number >= 0"))
    return problems


def check_config_counts(resolved: Any) -> None:
    """Raise every :func:`config_count_problems` at once (one line each)."""
    raise_problems(config_count_problems(resolved), "the config")


def check_output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """A folder we may create and write in: no existing file on its path, and writable where it exists."""
    folder = Path(path).expanduser()
    for part in (folder, *folder.parents):
        if part.exists():
            if not part.is_dir():
                where = "is" if part == folder else f"lies under {part}, which is"
                raise VerlflowError(f"{what} '{path}' {where} a file, not a folder: give a folder path")
            if not os.access(part, os.W_OK | os.X_OK):
                raise VerlflowError(f"{what} '{path}': no permission to write in {part}")
            break
    return folder


def check_model_folder(path: str | os.PathLike[str]) -> None:
    """A local Hugging Face folder whose config and weight files can be opened (headers only: cheap)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return  # a hub id or the tiny model: resolved elsewhere
    config = folder / "config.json"
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise VerlflowError(f"model folder '{path}': {config.name} is missing or not JSON ({exc.__class__.__name__})"
                            ": give a Hugging Face model folder") from None
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors raises its own error types and OSError for short files
            first = first_line(exc, 120)
            raise VerlflowError(f"model weights '{weights}' are unreadable ({first}): the file is corrupt or "
                                "truncated; copy the model folder again") from None


def check_parquet_split(path: str | os.PathLike[str], required: tuple[str, ...] = ()) -> int:
    """A parquet file with rows and the ``required`` columns; returns its row count (metadata only)."""
    import pyarrow.parquet as pq

    file = Path(path)
    if file.is_file() and file.stat().st_size == 0:
        raise VerlflowError(f"{file} is empty (0 bytes): preprocess again (mlflow run . -e preprocess)")
    try:
        meta = pq.ParquetFile(file)
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError for a file that is not parquet
        raise VerlflowError(f"{file} is not a readable parquet file ({first_line(exc, 120)}): "
                            "preprocess again") from None
    columns = set(meta.schema_arrow.names)
    missing = [c for c in required if c not in columns]
    if missing:
        raise VerlflowError(f"{file} lacks column(s) {', '.join(missing)} (it has {', '.join(sorted(columns))}): "
                            "give a split written by `verlflow preprocess` (verl's GSM8K schema)")
    rows = meta.metadata.num_rows
    if rows == 0:
        raise VerlflowError(f"{file} has 0 rows: preprocess with a source that has data (limit >= 0)")
    return rows


def check_trained_checkpoint(*paths: str) -> None:
    """Refuse a checkpoint written at global step 0: a run that trained nothing has nothing to register."""
    for path in paths:
        for part in Path(path).parts:
            match = _STEP.fullmatch(part)
            if match and int(match.group(1)) == 0:
                raise VerlflowError(f"checkpoint {path} is from step 0: the run trained nothing; register a run "
                                    "with trainer.total_training_steps >= 1")


def check_storage_url(storage: str) -> None:
    """A storage URL must not carry its password: ``-P`` values are logged as run params by ``mlflow run``."""
    if "://" not in storage:
        return
    if not urlsplit(storage).password:  # none, or empty (a local socket's trust login): nothing secret
        return
    launched = os.environ.get("MLFLOW_RUN_ID")
    cleanup = (f"; mlflow run has already logged it as a param of run {launched}: delete that run "
               "(mlflow runs delete --run-id …) and change the password") if launched else ""
    raise VerlflowError(
        "storage URL holds a password, which would be logged as a run param: drop it from the URL and "
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
