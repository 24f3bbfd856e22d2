"""One run as the comparison sees it: read once from the tracking store, then only computed on.

:mod:`.step` fills :class:`RunSnapshot` objects; :mod:`.diff`, :mod:`.report`, :mod:`.plots` and
:mod:`.utilisation` read them, so none of those modules talks to MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verlflow.platforms.tags import NAME_TAG, TYPE_TAG

# How a table cell shows a value one run does not have.
MISSING = "-"


@dataclass
class RunSnapshot:
    """One run as read from the tracking store: identity, tags, params, latest metrics, histories."""

    role: str  # "baseline" | "candidate"
    run_id: str
    name: str
    status: str
    tags: dict[str, str]
    params: dict[str, str]
    # latest value of every metric (summaries such as timing_s_mean/* are logged once)
    metrics: dict[str, float]
    # metric key → [(step, value)] sorted by step, for the keys the report needs
    histories: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # dataset name (context) → digest, from the run's logged inputs
    datasets: dict[str, str] = field(default_factory=dict)
    experiment_id: str = ""

    @property
    def label(self) -> str:
        """``baseline: <name> (<device>)`` — how the run is named in tables and legends."""
        device = self.tags.get(NAME_TAG) or self.tags.get(TYPE_TAG) or "?"
        return f"{self.role}: {self.name} ({device})"


# What says which device a run ran on: two runs that agree on all of these ran on the same device profile.
DEVICE_IDENTITY_TAGS = ("verlflow.profile", TYPE_TAG, NAME_TAG)


def same_device_profile(baseline: RunSnapshot, candidate: RunSnapshot) -> bool:
    """Whether both runs ran on one device profile (profile name, device type and device name all equal)."""
    return all(baseline.tags.get(tag) == candidate.tags.get(tag) for tag in DEVICE_IDENTITY_TAGS)
