"""Checks of user input that every step makes before it opens a run or starts heavy work.

    python -c "from verlflow.input_checks import check_output_dir; check_output_dir('/etc/passwd/x', 'output_dir')"

Each check raises :class:`~verlflow.errors.VerlflowError` with one line that names the bad value and
what would be valid, so a bad input costs seconds, leaves no run behind and prints no traceback.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

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
# A URL query parameter or an override key whose name says it holds a secret.
_SECRET_QUERY_KEY = re.compile(r"pass(word|wd)?|pwd|secret|token|api_?key|access_?key|credential", re.IGNORECASE)
_SECRET_KEY = re.compile(r"token|key|secret|pass(word|wd)|credential", re.IGNORECASE)
# Well-known credential formats: Hugging Face, OpenAI-style, GitHub, GitLab, Slack, AWS access key ids.
_TOKEN_FORMATS = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
                            r"|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
                            r"|(AKIA|ASIA)[0-9A-Z]{16})\b")
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


def url_secret(url: str) -> str | None:
    """Where a URL carries a secret, in words (``its user part``, ``query parameter 'sslpassword'``), or None.

    Secrets ride in the user part (``user:password@``) or in query parameters whose name looks secret
    (``password=``, ``sslpassword=``, ``token=``, ``api_key=``); a parameter whose value is a file path
    (libpq's ``sslkey=/path``) names where a secret is kept, not the secret, and is allowed.
    """
    if "://" not in url:
        return None
    parts = urlsplit(url)
    try:
        password = parts.password
    except ValueError:  # an unparsable port: no user part worth reading
        password = None
    if password:  # an empty one (a local socket's trust login) holds nothing secret
        return "a password in its user part (user:password@)"
    for key, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_QUERY_KEY.search(key) and value and not _is_path(value):
            return f"query parameter '{key}'"
    return None


def _is_path(value: str) -> bool:
    return value.startswith(("/", "~", "./", "../")) or Path(value).is_file()


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


def check_tracking_uri(uri: str) -> None:
    """A tracking URI verlflow can use: no secret in it (it is printed in commands and logs) and not ``file:``.

    MLflow 3 keeps the ``file:`` store in maintenance mode and fails on it with a traceback; a password in
    the URI would reach the logs of every run that prints its upload command.
    """
    if where := url_secret(uri):
        raise VerlflowError(f"MLFLOW_TRACKING_URI holds a secret ({where}): drop it from the URI and set "
                            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead")
    if uri.startswith(("file:", "/", "./", "../", "~")):
        raise VerlflowError(f"MLFLOW_TRACKING_URI={uri} is a file store, which MLflow no longer supports: use "
                            "sqlite:///mlflow.db (a file here) or a tracking server http://host:5000")


def credential_problems(overrides: dict[str, Any]) -> list[Problem]:
    """Override values that look like credentials: a known token format anywhere, or a long random-looking
    value under a key named like ``*token*``, ``*key*``, ``*secret*``, ``*password*``.

    Overrides are logged as run params (``mlflow run`` logs ``-P overrides`` as given) and printed in the
    launch command, so a credential there leaks into the store.
    """
    problems = []
    for key, value in overrides.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(item, str):
                continue
            last = key.rsplit(".", 1)[-1]
            if _TOKEN_FORMATS.search(item) or (_SECRET_KEY.search(last) and _random_looking(item)):
                problems.append(Problem(key, "***", "looks like a credential, and overrides are logged as run "
                                        "params: set it in an environment variable instead (HF_TOKEN, "
                                        "WANDB_API_KEY, … as the library reads it), never in overrides"))
                break
    return problems


def _random_looking(value: str) -> bool:
    """Long, without spaces or path separators, mixing letter cases and digits, with high entropy."""
    if len(value) < 20 or any(c in value for c in " /\\") or _is_path(value):
        return False
    classes = sum(any(test(c) for c in value) for test in (str.islower, str.isupper, str.isdigit))
    counts = [value.count(c) for c in set(value)]
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts)
    return classes >= 2 and entropy >= 3.5


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
