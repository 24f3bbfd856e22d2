"""Checks of a data split a step is given: a readable parquet file with rows and verl's columns.

    python -c "from verlflow.data.checks import check_parquet_split; check_parquet_split('data/synthetic/test.parquet')"
"""

from __future__ import annotations

import os
from pathlib import Path

from verlflow.errors import VerlflowError
from verlflow.util import first_line


def check_parquet_split(path: str | os.PathLike[str], required: tuple[str, ...] = ()) -> int:
    """A parquet file with rows and the ``required`` columns; returns its row count (metadata only)."""
    import pyarrow.parquet as pq

    file = Path(path)
    if file.is_file() and file.stat().st_size == 0:
        from verlflow.data.fix_commands import preprocess_command

        raise VerlflowError(f"{file} is empty (0 bytes): preprocess again: `{preprocess_command('', file.parent)}`")
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


def parquet_columns(path: str | os.PathLike[str]) -> list[str]:
    """The column names of a parquet file, sorted ([] when it cannot be read: :func:`check_parquet_split` says why)."""
    import pyarrow.parquet as pq

    try:
        return sorted(pq.read_schema(path).names)
    except Exception:  # not parquet / unreadable: reported by check_parquet_split with the reason
        return []


def read_rows(path: str | os.PathLike[str]) -> list[dict]:
    """Every row of a parquet split, as dicts; a file whose pages cannot be read (corrupt, truncated) is one line
    naming it, where pyarrow raised ``OSError: Couldn't deserialize thrift`` from deep in a step."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError for damaged pages
        raise VerlflowError(f"{path} is corrupt: its rows cannot be read ({first_line(exc, 120)}): preprocess "
                            "again (mlflow run . -e preprocess), or give another data_dir") from None
