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


GSM8K_SOURCE = "openai/gsm8k"  # the data_source verl's reward registry scores with its GSM8K scorer


def check_ground_truths(path: str | os.PathLike[str], source_key: str = "data_source",
                        key: str = "data.train_files") -> None:
    """Refuse a split where verl's GSM8K scorer can match no row's ground truth: every reward would be 0. The line
    names ``key``, the config key that points at the file (``data.train_files`` / ``data.val_files``).

    A ground truth is matchable when the perfect answer, ``#### <ground truth>``, scores 1 with verl's own strict
    scorer (``verl.utils.reward_score.gsm8k``: the number after ``#### ``, commas removed, compared as text), so
    ``72 dollars`` or ``1,000`` never is. Only rows whose ``source_key`` column (``data.reward_fn_key``) says
    ``openai/gsm8k`` are judged: other sources have other scorers. One matchable row is enough to pass.
    """
    import pyarrow.parquet as pq
    from verl.utils.reward_score import gsm8k

    try:
        table = pq.read_table(path, columns=[source_key, "reward_model"])
    except Exception:  # a column or page that cannot be read: the step's other checks name it
        return
    unmatchable = None
    for index, (source, reward) in enumerate(zip(table.column(source_key).to_pylist(),
                                                 table.column("reward_model").to_pylist(), strict=True)):
        if source != GSM8K_SOURCE:
            continue
        truth = (reward or {}).get("ground_truth")
        if isinstance(truth, str) and gsm8k.compute_score(f"#### {truth}", truth) > 0:
            return
        unmatchable = unmatchable or (index, truth)
    if unmatchable is not None:
        index, truth = unmatchable
        raise VerlflowError(f"{key}={path}: no row's reward_model.ground_truth is a number verl's GSM8K scorer can "
                            f"match (row {index}: {str(truth)[:60]!r}), so every reward would be 0: give plain numbers "
                            "such as '72' (as `verlflow preprocess` writes them), or a scorer of your own in "
                            "reward.custom_reward_function.path")
