"""verl's datasets, built once per process for the same inputs and reused by the rehearsals after it.

The start-up stage builds the train and validation datasets with verl's own ``create_rl_dataset``, whose
overlong-prompt filter tokenizes every row (and hashes the tokenizer for ``datasets``' fingerprint): the
largest cost of a dry run. A process that rehearses many configurations (the dry-run table of
tests/test_dry_run_rehearsal_*.py, a notebook) would build the same dataset again for every configuration
that changes nothing the dataset is made of. The key is all of that: the resolved ``data`` section, every file
it names (path, size, modification time), the tokenizer (class, chat template, its folder's files) and the
call's other arguments. A failed build is never kept (the next rehearsal builds, and fails, again); a dataset
with a processor (multi-modal) or one whose tokenizer is not a local folder is never reused.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

KEPT = 4  # datasets kept (a train and a validation set for two configurations)
_BUILT: OrderedDict[Hashable, Any] = OrderedDict()


def build(create: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``create(*args, **kwargs)`` (verl's ``create_rl_dataset``), or the dataset an equal call built before."""
    key = _key(args, kwargs)
    if key is None:
        return create(*args, **kwargs)
    if key in _BUILT:
        _BUILT.move_to_end(key)
        return _BUILT[key]
    dataset = create(*args, **kwargs)
    _BUILT[key] = dataset
    while len(_BUILT) > KEPT:
        _BUILT.popitem(last=False)
    return dataset


def _key(args: tuple, kwargs: dict[str, Any]) -> Hashable | None:
    """What the dataset is made of, or None when it cannot be told (then it is built, never reused).

    verl calls ``create_rl_dataset(data_paths, data_config, tokenizer, processor, is_train[, max_samples])``
    (0.5.0 and 0.9.1).
    """
    if len(args) < 4 or args[3] is not None:
        return None
    paths, data_config, tokenizer = args[:3]
    try:
        data = OmegaConf.to_container(data_config, resolve=True) if isinstance(data_config, DictConfig) else None
        files = OmegaConf.to_container(paths, resolve=True) if isinstance(paths, ListConfig) else paths
    except Exception:  # an interpolation that does not resolve: verl's own build says what is wrong
        return None
    words = _tokenizer_words(tokenizer)
    if data is None or words is None:
        return None
    return (repr(files), repr(data), _file_stats([files, data]), words, repr(args[4:]), repr(sorted(kwargs.items())))


def _tokenizer_words(tokenizer: Any) -> tuple | None:
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if not folder.is_dir():
        return None
    return (type(tokenizer).__qualname__, str(getattr(tokenizer, "chat_template", None)),
            _file_stats([str(p) for p in sorted(folder.iterdir())]))


def _file_stats(tree: Any) -> tuple:
    """(path, size, modification time) of every existing file named by a string anywhere in ``tree``."""
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)
        elif isinstance(node, str) and os.path.isfile(node):
            stat = os.stat(node)
            found.append((node, stat.st_size, stat.st_mtime_ns))

    walk(tree)
    return tuple(found)


__all__ = ["build", "KEPT"]
