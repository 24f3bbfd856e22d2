"""§6.4 of the comparison: device utilisation, memory and power of two runs, from their ``system/*`` metrics.

    verlflow compare --baseline <h20 run> --candidate <a3 run> --output_dir out   # out/utilisation.png

The guide's §6.3 finds A3 slower than H20 but cannot say why; the system metrics every train run
records (MLflow's CPU/memory/GPU monitors, verlflow's NPU monitor) can. Per run and device type
(``npu`` from ``system/npu_<i>_*``, ``gpu`` from MLflow's ``system/gpu_<i>_*``), over all samples:

- utilisation and memory: at each sample the mean over the devices, then the mean of that over the
  run; the peak is the highest single device sample;
- power: at each sample the sum over the devices that report it (an A3 card reports on its first
  chip), then its mean and peak — the whole node's draw, comparable between an A3 and an H20 node;
- the host's CPU utilisation and memory, from MLflow's CPU monitor.

A multi-node run's per-node samplers (:mod:`verlflow.backends.verl.node_sampler`) log under MLflow's node
ids, ``system/<node>/…``. When a run has such keys, only they are read (the unscoped ones are the machine
verlflow ran on, one of those nodes or none): the figures above pool every node's devices (utilisation and
memory: mean across all nodes' devices; power: the cluster's draw; host: mean across nodes), and each node
also gets its own row of means.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verlflow.compare.report import candidate_over_baseline, table
from verlflow.compare.snapshot import MISSING, RunSnapshot
from verlflow.device.system_metrics import DEFAULT_INTERVAL_S
from verlflow.names import SYSTEM_METRICS_INTERVAL_TAG
from verlflow.platforms import Device, platform_of
from verlflow.platforms.tags import TYPE_TAG

SYSTEM_PREFIX = "system/"
# system/[<node id>/]<kind>_<index>_<name>: MLflow puts a node id in when MLFLOW_SYSTEM_METRICS_NODE_ID is set; what
# each kind calls the four figures is its platform's system_metric_keys (gpu: MLflow's GPUMonitor; npu:
# verlflow.device.npu_monitor), so only a registered kind with such names counts (see _device_key).
_KIND_KEY = re.compile(r"^system/(?:[^/]+/)?([a-z][a-z0-9]*)_(\d+)_([a-z_]+)$")


def metric_names(kind: str) -> Mapping[str, str]:
    """Figure (util, mem_mb, mem_pct, power) → the name ``kind``'s per-device system metrics use; {} for none."""
    return platform_of(kind).system_metric_keys if kind in Device else {}


def _device_key(key: str) -> re.Match | None:
    """``key`` as (kind, index, name) when it is one device's system metric of a kind that logs them."""
    m = _KIND_KEY.match(key)
    return m if m and metric_names(m.group(1)) else None


HOST_CPU = "system/cpu_utilization_percentage"
HOST_MEMORY = "system/system_memory_usage_megabytes"
# system/[<node id>/]<host figure>
HOST_KEY = re.compile(r"^system/(?:([^/]+)/)?(cpu_utilization_percentage|system_memory_usage_megabytes)$")
HOST_FIGURES = {"cpu_utilization_percentage": "cpu", "system_memory_usage_megabytes": "host_mem"}

# (figure, label) in table order
FIGURES: list[tuple[str, str]] = [
    ("util", "device utilisation (%)"),
    ("mem_mb", "device memory used (MB)"),
    ("mem_pct", "device memory used (%)"),
    ("power", "device power, all devices (W)"),
    ("cpu", "host CPU utilisation (%)"),
    ("host_mem", "host memory used (MB)"),
]


@dataclass
class Series:
    """One figure of one run: step → value (the per-sample mean or sum over devices), and the peak."""

    points: dict[int, float]
    peak: float

    @property
    def mean(self) -> float:
        """Mean over the samples."""
        return sum(self.points.values()) / len(self.points)


@dataclass
class RunUtilisation:
    """The §6.4 figures of one run; ``device`` is ``npu``/``gpu`` or None (host metrics only)."""

    device: str | None
    device_count: int
    interval_s: float
    series: dict[str, Series]
    # node id → that node's figures, for runs whose nodes were sampled under MLflow node ids (else empty)
    nodes: dict[str, dict[str, Series]] = field(default_factory=dict)

    def describe(self) -> str:
        """``npu × 16`` / ``gpu × 8`` / ``host only``, with ``on 2 nodes`` when nodes were sampled."""
        text = f"{self.device} × {self.device_count}" if self.device else "host only"
        return f"{text} on {len(self.nodes)} nodes" if len(self.nodes) > 1 else text


def system_keys(snap: RunSnapshot) -> list[str]:
    """The ``system/*`` keys a run logged."""
    return sorted(k for k in snap.metrics if k.startswith(SYSTEM_PREFIX))


def node_of(key: str) -> str | None:
    """The MLflow node id in ``system/<node>/<name>``; None for an unscoped ``system/<name>``."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 else None


def needed_keys(snap: RunSnapshot) -> list[str]:
    """The ``system/*`` keys §6.4 reads for a run (not disk or network): the node-scoped ones when it has any."""
    keys = [k for k in system_keys(snap)
            if ((m := _device_key(k)) and m.group(3) in metric_names(m.group(1)).values()) or HOST_KEY.match(k)]
    scoped = [k for k in keys if node_of(k)]
    return scoped or keys


def _device_type(snap: RunSnapshot, keys: Sequence[str]) -> str | None:
    found = {m.group(1) for k in keys if (m := _device_key(k))}
    tagged = snap.tags.get(TYPE_TAG)
    if tagged in found:
        return tagged
    return sorted(found)[0] if found else None


def _across_devices(histories: Mapping[str, list[tuple[int, float]]], keys: Sequence[str], *, total: bool) -> Series:
    by_step: dict[int, list[float]] = defaultdict(list)
    for key in keys:
        for step, value in histories.get(key, []):
            by_step[step].append(value)
    points = {s: (sum(v) if total else sum(v) / len(v)) for s, v in by_step.items() if v}
    peak = max(points.values()) if total else max(max(v) for v in by_step.values())
    return Series(dict(sorted(points.items())), peak)


def run_utilisation(snap: RunSnapshot, histories: Mapping[str, list[tuple[int, float]]]) -> RunUtilisation | None:
    """The run's §6.4 figures from its ``system/*`` histories; None when it logged no system metrics."""
    keys = [k for k in needed_keys(snap) if histories.get(k)]
    if not keys:
        return None
    device = _device_type(snap, keys)
    figure_keys = _figure_keys(keys, device)
    series = {figure: _across_devices(histories, chosen, total=figure == "power")
              for figure, chosen in figure_keys.items()}
    indices = {(node_of(k), m.group(2)) for k in keys if (m := _device_key(k)) and m.group(1) == device}
    node_ids = sorted({n for k in keys if (n := node_of(k))})
    nodes = {node: {figure: _across_devices(histories, mine, total=figure == "power")
                    for figure, chosen in figure_keys.items() if (mine := [k for k in chosen if node_of(k) == node])}
             for node in node_ids}
    try:
        interval = float(snap.tags.get(SYSTEM_METRICS_INTERVAL_TAG, DEFAULT_INTERVAL_S))
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    return RunUtilisation(device, len(indices), interval, series, nodes)


def _figure_keys(keys: Sequence[str], device: str | None) -> dict[str, list[str]]:
    """Figure → the keys (of every node) it is computed from."""
    chosen: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        if (m := _device_key(key)) and m.group(1) == device:
            figure = next((f for f, name in metric_names(device).items() if name == m.group(3)), None)
            if figure:
                chosen[figure].append(key)
        elif m := HOST_KEY.match(key):
            chosen[HOST_FIGURES[m.group(2)]].append(key)
    return dict(chosen)


@dataclass
class UtilisationRow:
    """One §6.4 line: a figure's mean or peak in both runs."""

    figure: str
    label: str
    stat: str  # "mean" | "peak"
    baseline: float | None
    candidate: float | None

    @property
    def ratio(self) -> float | None:
        """candidate / baseline, None when either is missing or baseline is 0."""
        return candidate_over_baseline(self.baseline, self.candidate)


def utilisation_rows(baseline: RunUtilisation, candidate: RunUtilisation) -> list[UtilisationRow]:
    """Mean and peak of every figure either run has, in :data:`FIGURES` order."""
    rows = []
    for figure, label in FIGURES:
        b, c = baseline.series.get(figure), candidate.series.get(figure)
        if b is None and c is None:
            continue
        for stat in ("mean", "peak"):
            rows.append(UtilisationRow(figure, label, stat, getattr(b, stat) if b else None,
                                       getattr(c, stat) if c else None))
    return rows


def _fmt(value: float | None) -> str:
    return MISSING if value is None else f"{value:,.1f}"


def render_section(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    used: tuple[RunUtilisation | None, RunUtilisation | None],
    rows: Sequence[UtilisationRow],
    image: str | None = None,
) -> str:
    """§6.4 as Markdown: the table (and its curves) when both runs have system metrics, else why not."""
    out = ["## 6.4 Utilisation", ""]
    missing = [snap.role for snap, u in zip((baseline, candidate), used, strict=True) if u is None]
    if missing:
        out += [f"Not shown: the {' and the '.join(missing)} run logged no system metrics "
                "(`system/*`; a run from before they were recorded, or `verlflow.system_metrics_interval=0`).", ""]
        return "\n".join(out)
    b, c = used
    out += [
        f"From the runs' `system/*` metrics (sampled every {b.interval_s:g} s / {c.interval_s:g} s on the machine "
        "verlflow ran on, or on every node of a run whose nodes were sampled). Utilisation and memory: mean over "
        "devices per sample, then over the run; peak: the highest single device sample. Power: sum over devices "
        "per sample.",
        "",
        table(
            ["figure", "", f"baseline ({b.describe()})", f"candidate ({c.describe()})", "candidate / baseline"],
            [(r.label, r.stat, _fmt(r.baseline), _fmt(r.candidate),
              MISSING if r.ratio is None else f"{r.ratio:.2f}×") for r in rows],
        ),
        "",
    ]
    out += per_node_section(baseline, candidate, used)
    if image:
        out += [f"![utilisation]({image})", ""]
    return "\n".join(out)


def per_node_section(baseline: RunSnapshot, candidate: RunSnapshot,
                     used: tuple[RunUtilisation, RunUtilisation]) -> list[str]:
    """Markdown lines: each sampled node's mean of every figure, for the runs whose nodes were sampled."""
    sampled = [(snap.role, node, mine) for snap, u in zip((baseline, candidate), used, strict=True)
               for node, mine in u.nodes.items()]
    figures = [(f, label) for f, label in FIGURES if any(f in mine for _, _, mine in sampled)]
    if not sampled:
        return []
    rows = [(role, node, *(_fmt(mine[f].mean) if f in mine else MISSING for f, _ in figures))
            for role, node, mine in sampled]
    return ["Per node (mean over the run; the node ids are the samplers' `system/<node>/…`):", "",
            table(["run", "node", *(label for _, label in figures)], rows), ""]


def plot_utilisation(
    baseline: RunSnapshot,
    candidate: RunSnapshot,
    used: tuple[RunUtilisation, RunUtilisation],
    path: Path,
) -> Path:
    """``utilisation.png``: every §6.4 figure of both runs over minutes since their first sample."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from verlflow.compare.plots import STYLES

    figures = [(f, label) for f, label in FIGURES if any(f in u.series for u in used)]
    cols = 2
    rows = (len(figures) + cols - 1) // cols
    fig = Figure(figsize=(6.5 * cols, 3.6 * rows), layout="constrained")
    fig.suptitle(f"{candidate.name} vs {baseline.name}: utilisation over time", fontsize=13)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (figure, label) in zip(axes, figures, strict=False):
        for snap, u, style in zip((baseline, candidate), used, STYLES, strict=True):
            series = u.series.get(figure)
            if series:
                first = min(series.points)
                xs = [(s - first) * u.interval_s / 60 for s in series.points]
                ax.plot(xs, list(series.points.values()), label=f"{snap.label} [{u.describe()}]", linewidth=1.4,
                        **style)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("minutes since the first sample")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[len(figures):]:
        ax.set_visible(False)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path
