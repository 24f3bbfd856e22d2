"""The data files as verl reads them: missing, not parquet, or without the columns verl's dataset and reward read.

A rule of the dry run (``preflight.data_problems``: the files are checked even where the rehearsal skips the
start-up, a model that is not on this machine) and the rehearsal's translation of verl's own failure on them
(:func:`exact_data_lines`): verl says ``Unable to find …`` or fails in its default scorer on a missing data
source, and names neither the column the file lacks, the columns it has, nor the command that writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import value_of
from verlflow.data.fix_commands import preprocess_command
from verlflow.errors import Problem
from verlflow.util import first_line

# The keys whose lines the files' own facts say best.
DATA_KEYS = ("data.train_files", "data.val_files", "data.prompt_key", "data.reward_fn_key")


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def data_problems(cfg: DictConfig) -> list[Problem]:
    """Train/val files that are missing, not parquet, or lack the columns verl's dataset and reward read."""
    import pyarrow.parquet as pq

    wanted = [str(value_of(cfg, "data.prompt_key", "prompt")), str(value_of(cfg, "data.reward_fn_key", "data_source")),
              "reward_model"]
    problems = []
    for key in ("data.train_files", "data.val_files"):
        for path in _files(value_of(cfg, key)):
            if "://" in path:
                continue
            if not Path(path).is_file():
                problems.append(Problem(key, path, f"file not found: run `{preprocess_command('', Path(path).parent)}` "
                                                   "or pass -P data_dir=<folder with train.parquet and test.parquet>"))
                continue
            try:
                columns = set(pq.read_schema(path).names)
            except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, … for a file that is not parquet
                problems.append(Problem(key, path, f"not a parquet file ({first_line(exc, 120)}): "
                                                   f"run `{preprocess_command('', Path(path).parent)}`"))
                continue
            named = {wanted[0]: "data.prompt_key", wanted[1]: "data.reward_fn_key"}
            for column in [c for c in wanted if c not in columns]:
                if column in named:
                    problems.append(Problem(named[column], column, (
                        f"{path} has no column '{column}' (it has {', '.join(sorted(columns))}): name one of "
                        f"its columns, or write the file with `{preprocess_command('', Path(path).parent)}`")))
                else:
                    problems.append(Problem(key, path, f"lacks verl's column {column}: write it with "
                                                       f"`{preprocess_command('', Path(path).parent)}`"))
    return problems


def exact_data_lines(problems: list[Problem], cfg: DictConfig) -> list[Problem]:
    """``problems`` with a line on a data key replaced by the files' own (:func:`data_problems`) for that key."""
    if not any(problem.key in DATA_KEYS for problem in problems):
        return problems
    exact: dict[str, Problem] = {}
    for problem in data_problems(cfg):
        exact.setdefault(problem.key, problem)
    return [exact.get(problem.key, problem) if problem.key in DATA_KEYS else problem for problem in problems]


__all__ = ["DATA_KEYS", "data_problems", "exact_data_lines"]
