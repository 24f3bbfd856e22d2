"""What a split is, for lineage: its content digest and its MLflow dataset.

A split's digest is of its rows' content (not of the parquet file: metadata, pyarrow version and origin do not
change it), and the two splits' digests make the folder's ``data.digest`` tag. Its MLflow dataset has the same
name, source and digest wherever it is logged, so MLflow shows one dataset that preprocess produced and the train
and evaluate runs used (:func:`log_split_inputs`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pandas as pd

from verlflow.data.checks import read_rows


def combined_digest(digests: dict[str, str]) -> str:
    """The folder's ``data.digest``: one digest of the train and test splits' digests."""
    return hashlib.sha256(f"{digests['train']}:{digests['test']}".encode()).hexdigest()[:16]


def rows_digest(rows: list[dict]) -> str:
    """Digest of the rows' content: independent of parquet metadata, pyarrow version and origin."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]  # MLflow keeps dataset digests of up to 36 characters


def split_dataset(rows: list[dict], path: Path, split: str, digest: str):
    """The MLflow dataset of one split: the same name, source and digest wherever it is logged, so MLflow
    shows one dataset that preprocess produced and train / evaluate runs used."""
    import mlflow

    with warnings.catch_warnings():  # mlflow registers two local-file sources and warns it picked one
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        return mlflow.data.from_pandas(pd.DataFrame(rows), source=str(path), name=f"gsm8k-{split}", digest=digest)


def log_split_datasets(rows: dict[str, list[dict]], paths: dict[str, Path], digests: dict[str, str],
                       contexts: dict[str, str]) -> bool:
    """Log the splits just written (their rows and digests at hand) as dataset inputs of the active run, each
    under its context (split → context); False, logging nothing, outside a run."""
    import mlflow

    if mlflow.active_run() is None:
        return False
    for split, context in contexts.items():
        _log_input(split_dataset(rows[split], paths[split], split, digests[split]), context)
    return True


def log_split_inputs(data_dir: str | Path, contexts: dict[str, str]) -> list[str]:
    """Log the splits of a preprocessed folder as inputs of the active run (split → context, e.g.
    ``{"train": "training", "test": "validation"}``); the splits logged (none when the files are elsewhere,
    e.g. only on a cluster's shared disk)."""
    import mlflow

    if mlflow.active_run() is None:
        return []
    logged = []
    for split, context in contexts.items():
        path = Path(data_dir).expanduser().resolve() / f"{split}.parquet"
        if not path.is_file():
            continue
        rows = read_rows(path)
        _log_input(split_dataset(rows, path, split, rows_digest(rows)), context)
        logged.append(split)
    return logged


def _log_input(dataset, context: str) -> None:
    """Log ``dataset`` as an input of the active run, waiting out a SQLite lock, and once more when another process
    (a second search worker) inserted the same dataset between MLflow's look-up and its insert: that refusal is a
    duplicate key on Postgres, and the second try links the row the other process made."""
    import mlflow

    from verlflow.outage.store_retry import retrying_on_lock

    retrying_on_lock(mlflow.log_input)(dataset, context=context)
