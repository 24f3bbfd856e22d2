"""Small helpers several subpackages need, each written once: error lines, filters,
output folders, the hub probe, GC, numeric settings from the environment (secrets: :mod:`verlflow.secrets`).

Nothing here knows about recipes, runs or devices; a helper moves here when a second module needs it.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verlflow.errors import StepFailed

HUB_PROBE_TIMEOUT_S = 3.0
# Numeric environment settings read by env_number() whose value could not be used: name -> the error line.
_BAD_ENV_NUMBERS: dict[str, str] = {}


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or while handling (``__cause__``, else ``__context__``), in order."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-blank line of an exception's message (or its type name), at most ``limit`` characters.

    Library errors often carry pages of context; a user-facing error or a warning shows one line.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]


def filter_quote(value: str) -> str:
    """``value`` escaped for a single-quoted string in an MLflow search filter (``tags.`k` = '<here>'``)."""
    return value.replace("'", "\\'")


def hub_unreachable(url: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """None when the Hugging Face hub answers one HEAD request for ``url`` in time, else why not.

    Asked before a hub download so an offline machine fails in seconds instead of after minutes of
    retries. Runs in a thread: client timeouts do not bound a hanging DNS lookup.
    """
    from huggingface_hub.utils import get_session

    outcome: list[str | None] = []

    def probe() -> None:
        try:
            status = get_session().head(url, timeout=timeout).status_code
            outcome.append(f"{url}: HTTP {status}" if status >= 500 else None)
        except Exception as exc:  # httpx transport errors, proxy errors: the hub is out of reach
            outcome.append(f"{url}: {first_line(exc)}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return outcome[0] if outcome else f"{url}: no answer within {timeout:g} s"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector for an import-heavy block, then resume it as it was.

    Importing MLflow, SQLAlchemy and pandas creates about a million long-lived objects; the collector,
    triggered every few hundred allocations, walks them again and again (measured: ~1 s of a 2.6 s
    start-up). Nothing in such a block makes garbage cycles worth collecting early.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def env_number(name: str, default: float, *, integer: bool = False, minimum: float | None = None) -> float:
    """The number in environment variable ``name`` (``default`` when unset or blank).

    Read at import by modules' settings (``VERLFLOW_METRICS_WRITE_S``), so a bad value must not fail the
    import with a traceback: it is remembered, ``default`` is used, and :func:`check_env_numbers` (called
    by every step before it opens a run) turns it into one line.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or (minimum is not None and value < minimum):
        kind = "an integer" if integer else "a number"
        bound = f" >= {minimum:g}" if minimum is not None else ""
        _BAD_ENV_NUMBERS[name] = f"environment variable {name}={raw!r} must be {kind}{bound}: " \
                                 f"unset it (default {default:g}) or give one"
        return default
    return value


def check_env_numbers() -> None:
    """Raise one :class:`~verlflow.errors.VerlflowError` line for the first bad :func:`env_number` setting."""
    from verlflow.errors import VerlflowError

    for name, line in _BAD_ENV_NUMBERS.items():
        if os.environ.get(name, "").strip():  # still set as it was read
            raise VerlflowError(line)


@contextlib.contextmanager
def environ_restored(keys: list[str] | tuple[str, ...]) -> Iterator[None]:
    """Give back the environment variables ``keys`` as they were (set or unset) when the block ends."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_no_symlink_loop(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, in one line, a path whose symbolic links go round in a circle (every file in it 'does not exist')."""
    from verlflow.errors import VerlflowError

    try:
        Path(path).expanduser().resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # Python reports a loop as RuntimeError, some systems as ELOOP
        raise VerlflowError(f"{what} '{path}' is a symbolic-link loop ({first_line(exc, 120)}): point it at a real "
                            "folder") from None


def check_output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """A folder we may create and write in: no existing file on its path, and writable where it exists."""
    from verlflow.errors import VerlflowError

    check_no_symlink_loop(path, what)
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


def free_space(folder: str | os.PathLike[str]) -> str:
    """``"<N> MiB free there"`` for the disk holding ``folder`` (or its nearest existing parent), and the
    file-size limit when one is set (``ulimit -f``): what a message about a failed write points the user at."""
    import resource
    import shutil

    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        facts = f"{shutil.disk_usage(path).free / 2**20:.0f} MiB free there"
    except OSError:
        facts = "free space unknown"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        facts += f", and a file-size limit of {limit / 2**20:.1f} MiB (ulimit -f)"
    return facts


# How a write that failed for space reads: the OS's words (ENOSPC, EFBIG under ``ulimit -f``, EDQUOT), SQLite's
# (SQLITE_FULL) and torch's zip writer's, which hides the OS error ("unexpected pos 1002112 vs 1002000").
OUT_OF_SPACE = re.compile(r"No space left|Errno 28\b|File too large|Errno 27\b|Disk quota exceeded|Errno 122\b|"
                          r"unexpected pos \d+ vs \d+|database or disk is full")
# The OS's own phrase in a message that wraps it (pyarrow: "[Errno 27] Error writing bytes to file. Detail: …").
SPACE_PHRASE = re.compile(r"No space left on device|File too large|Disk quota exceeded")


def out_of_space_failure(what: str, folder: str | os.PathLike[str], exc: BaseException,
                         elsewhere: str) -> StepFailed | None:
    """One line (a :class:`~verlflow.errors.StepFailed`) for ``what`` that could not be written into ``folder`` for
    space: the OS's reason, the free space there and the fix, ``elsewhere`` naming where else to write; None when
    ``exc`` (or an error it came from) is not about space."""
    from verlflow.errors import StepFailed

    cause = next((error for error in exception_chain(exc) if OUT_OF_SPACE.search(str(error))), None)
    if cause is None:
        return None
    phrase = SPACE_PHRASE.search(str(cause))
    reason = phrase.group(0) if phrase else first_line(cause, 80)
    return StepFailed(f"{what} could not be written ({reason}) to {folder} ({free_space(folder)}): free space (or "
                      f"raise the file-size limit, ulimit -f) or {elsewhere}")


def check_name_inside(name: str, what: str, root: str) -> str:
    """Refuse, in one line, a name that becomes a file or folder under ``root`` but would leave it or nest in it.

    A name is one path component: not empty, not ``.``/``..``, no ``/`` or ``\\``, no control character
    (``--study_name ../../x`` wrote its journal and checkpoints outside the project). Returns ``name``.
    """
    from verlflow.errors import VerlflowError

    if (not name or name in (".", "..") or any(c in name for c in "/\\") or
            any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise VerlflowError(f"{what} {name!r} would name a file outside {root}/ (or nested in it): use one name "
                            "without '/', '\\', '..' or control characters, e.g. letters, digits, '-', '_', '.'")
    return name
