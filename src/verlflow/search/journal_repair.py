"""A study's journal file whose last line was torn (a worker killed mid-write) is mended, not lost.

    verlflow search --study_name s1     # resumes; the torn tail is kept in optuna/s1.journal.torn

Optuna's journal is one JSON operation per line. A worker killed while appending leaves a last line without its
end: Optuna then fails every read with a ``JSONDecodeError`` traceback, and the next append lands on the torn
line, so every later resume fails too. :func:`set_aside_torn_tail` cuts the torn tail off (a last piece with
no line end, or a last line that is not JSON), keeps it in ``<journal>.torn`` and lets the study resume from
the operations before it. It holds Optuna's own journal lock, so no worker appends meanwhile.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from optuna.storages.journal import JournalFileSymlinkLock

log = logging.getLogger(__name__)


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _torn_from(data: bytes) -> int:
    """Where ``data``'s torn tail starts (``len(data)`` when there is none)."""
    cut = data.rfind(b"\n", 0, len(data)) + 1 if not data.endswith(b"\n") else len(data)
    last_start = data.rfind(b"\n", 0, max(cut - 1, 0)) + 1
    if cut > last_start and not _is_json(data[last_start:cut]):
        return last_start
    return cut


def set_aside_torn_tail(path: Path) -> bytes | None:
    """Move a torn last line of the journal at ``path`` to ``<path>.torn``; returns what was moved, or None."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    lock = JournalFileSymlinkLock(str(path))
    if not lock.acquire():
        return None
    try:
        data = path.read_bytes()
        cut = _torn_from(data)
        if cut == len(data):
            return None
        torn = data[cut:]
        torn_file = path.with_name(path.name + ".torn")
        with torn_file.open("ab") as kept:
            kept.write(torn if torn.endswith(b"\n") else torn + b"\n")
        with path.open("r+b") as journal:
            journal.truncate(cut)
    finally:
        lock.release()
    log.warning("search: the last line of %s was torn (a worker stopped mid-write): %d bytes set aside in %s; "
                "the study resumes from the %d operations before it", path, len(torn), torn_file,
                data[:cut].count(b"\n"))
    return torn
