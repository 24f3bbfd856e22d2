"""What the registry says about an alias: which version holds ``champion``, since when, and why.

    python -c "from verlflow.models.champion_notes import alias_tag; print(alias_tag('champion', 'since'))"

Every ``promote`` records its decision on the registered model as tags (``verlflow.champion.version``,
``.since``, ``.why`` of the move that put it there, ``.checked``: the latest decision), and the model's and its
versions' descriptions are written from them, so the *Models* page says why a version is the champion
(gain, interval, problems) without opening the promote run. Text only: the registry writes
(:func:`verlflow.models.promotion.describe_champion`) call these.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

# Between a version's own line (accuracy, data, device, source) and what it is to the alias.
NOTE_SEPARATOR = "\n\n"
MAX_WHY_CHARS = 1000


def alias_tag(alias: str, field: str) -> str:
    """The registered-model tag holding ``field`` (version, since, why, checked) of ``alias``."""
    return f"verlflow.{alias}.{field}"


def now_utc() -> str:
    """The time a decision is stamped with: ``2026-12-05 15:04 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def decision_tags(alias: str, version: str, moved: bool, reason: str, current: Mapping[str, str],
                  when: str) -> dict[str, str]:
    """The tags a promote decision writes: a move (or a holder not yet recorded) restarts ``since`` and ``why``."""
    tags = {alias_tag(alias, "checked"): f"{when}: {reason}"[:MAX_WHY_CHARS]}
    if moved or current.get(alias_tag(alias, "version")) != version:
        tags |= {alias_tag(alias, "version"): version, alias_tag(alias, "since"): when,
                 alias_tag(alias, "why"): reason[:MAX_WHY_CHARS]}
    return tags


def model_description(alias: str, tags: Mapping[str, str]) -> str:
    """The registered model's description: the holder, since when and why, then the latest decision."""
    version = tags.get(alias_tag(alias, "version"))
    if not version:
        return ""
    text = (f"`{alias}` = version {version} since {tags.get(alias_tag(alias, 'since'), '?')}: "
            f"{tags.get(alias_tag(alias, 'why'), '?')}.")
    checked = tags.get(alias_tag(alias, "checked"), "")
    if checked and not checked.endswith(tags.get(alias_tag(alias, "why"), "")):
        text += f"{NOTE_SEPARATOR}Latest promote, {checked}."
    return text


def version_note(alias: str, tags: Mapping[str, str], version: str) -> str:
    """What ``alias`` is to one version: it holds it (since, why) or which version does."""
    holder = tags.get(alias_tag(alias, "version"))
    if not holder:
        return ""
    since = tags.get(alias_tag(alias, "since"), "?")
    if str(version) == holder:
        return f"Holds `{alias}` since {since}: {tags.get(alias_tag(alias, 'why'), '?')}."
    return f"`{alias}` is on version {holder} (since {since})."


def with_note(line: str, note: str) -> str:
    """A version's own line followed by its alias note (an older note replaced)."""
    own = line.split(NOTE_SEPARATOR, 1)[0]
    return NOTE_SEPARATOR.join(part for part in (own, note) if part)
