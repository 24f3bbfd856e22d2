"""Pure parsers for what device tools print: ``npu-smi``, ``nvidia-smi`` and CANN version files.

Each function takes the text a command printed (or a file held) and returns plain data; nothing
here runs a command or touches the machine, so every parser is tested on recorded real outputs
(``tests/fixtures/device``, each with its source in that folder's README). The parsers skip lines they do not
understand (prompts, comments, elisions) instead of failing: a profile with one field missing
beats a training run that refuses to start because a tool changed its banner.

    pytest tests/test_device_profile.py
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------
# npu-smi info (the table)
# ----------------------------------------------------------------------------------------------


@dataclass
class NpuChip:
    """One chip row pair of ``npu-smi info``: A2 has one chip per NPU, A3 two (Phy-ID 0-15)."""

    npu_id: int
    chip_id: int
    name: str  # as printed: "910B3" on A2, "Ascend910" on A3
    health: str
    phy_id: int | None = None  # A3 only
    bus_id: str | None = None
    power_w: float | None = None  # "-" on the second A3 chip
    temp_c: float | None = None
    aicore_pct: float | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_USED_TOTAL = re.compile(r"(\d+)\s*/\s*(\d+)")  # "3419 / 65536" and "31877/ 65536"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_npu_smi_info(text: str) -> list[NpuChip]:
    """Chips listed by ``npu-smi info``, in print order; [] when the text holds no chip table.

    Handles the 98-character (driver <= 25.x) and 116-character (26.x) layouts, A2 (one chip row
    per NPU) and A3 (two chips per NPU with a Phy-ID column), fragments, and 5-digit used
    memory that swallows the space before ``/``. The process table that follows is ignored.
    """
    chips: list[NpuChip] = []
    head: list[str] | None = None  # cells of the "<npu> <name> | <health> | <power> <temp> ..." row
    for line in text.splitlines():
        if line.startswith("|") and ("Process id" in line or "Process name" in line):
            break  # the process table below reuses the "<npu> <chip>" shape
        cells = _cells(line) if line.startswith("|") else []
        if len(cells) < 3:
            head = None  # a border, banner, comment or gap: a chip's two rows are adjacent
            continue
        first = cells[0].split()
        if head is None:
            if len(first) >= 2 and first[0].isdigit() and not first[1].isdigit() and cells[1]:
                head = cells
            continue
        if not (1 <= len(first) <= 2 and all(t.isdigit() for t in first) and _BUS_ID.match(cells[1])):
            head = None
            continue
        npu_id, name = head[0].split(maxsplit=1)
        top = head[2].split()
        bottom = cells[2].split()
        hbm = _USED_TOTAL.findall(cells[2])  # [(mem used, total), (hbm used, total)]
        chips.append(
            NpuChip(
                npu_id=int(npu_id),
                chip_id=int(first[0]),
                phy_id=int(first[1]) if len(first) == 2 else None,
                name=name,
                health=head[1],
                bus_id=cells[1],
                power_w=_number(top[0]) if top else None,
                temp_c=_number(top[1]) if len(top) > 1 else None,
                aicore_pct=_number(bottom[0]) if bottom else None,
                hbm_used_mb=int(hbm[-1][0]) if hbm else None,
                hbm_total_mb=int(hbm[-1][1]) if hbm else None,
            )
        )
        head = None
    return chips


def parse_npu_smi_version(text: str) -> dict[str, str]:
    """Versions from ``npu-smi -v`` or the banner of ``npu-smi info``.

    ``npu-smi version: X`` and ``npu-smi Version: X`` give ``{"npu_smi": X}``; the table banner
    ``npu-smi 24.1.rc3.7   Version: 24.1.rc3.7`` also gives ``driver`` (the banner's
    ``Version`` is the installed driver, which ships npu-smi). {} when neither is present.
    """
    banner = re.search(r"npu-smi\s+(?!version\b)(\S+)\s+Version:\s*(\S+)", text, re.IGNORECASE)
    if banner:
        return {"npu_smi": banner.group(1), "driver": banner.group(2)}
    plain = re.search(r"npu-smi\s+version:\s*(\S+)", text, re.IGNORECASE)
    return {"npu_smi": plain.group(1)} if plain else {}


def parse_key_values(text: str) -> dict[str, str]:
    """``key=value``, ``key : value`` and ``key: value`` lines as a dict (first occurrence wins).

    The common shape of ``npu-smi info -t board|usages|...`` (8-space indented ``Key  : value``),
    ``ascend_toolkit_install.info``, ``version.cfg`` and ``driver|firmware/version.info`` (``k=v``)
    and nnal ``atb/.../version.info`` (indented ``k : v``). Blank, ``#`` and prompt lines are
    skipped; keys keep their spelling (``Version`` in driver files, ``version`` in CANN's).
    """
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cuts = [i for i in (line.find("="), line.find(":")) if i > 0]
        if not cuts:
            continue
        cut = min(cuts)
        key = line[:cut].strip()
        if key:
            out.setdefault(key, line[cut + 1 :].strip())
    return out


def parse_ascend_version_file(text: str) -> dict[str, str]:
    """Any Ascend version file as a dict, plus ``version`` = the one version a person would quote.

    ``ascend_toolkit_install.info`` → its ``version`` (``8.2.RC1``); ``version.cfg`` → the CANN
    part of ``[<inner build>:<CANN version>]`` (``8.2.RC2``); ``driver`` / ``firmware``
    ``version.info`` → ``Version`` (``24.1.rc1``, ``7.1.0.11.220``); nnal ``atb`` →
    ``Ascend-cann-atb`` (``8.2.RC2``). ``version`` is absent when the text holds none of these.
    """
    info = parse_key_values(text)
    found = info.get("version") or info.get("Version") or info.get("Ascend-cann-atb")
    if not found:
        for key in ("toolkit_running_version", "runtime_running_version", "toolkit_installed_version"):
            bracket = re.fullmatch(r"\[(?:[^:\]]*:)?([^\]]+)\]", info.get(key, ""))
            if bracket:
                found = bracket.group(1)
                break
    if found:
        info["version"] = found
    return info


def soc_name(board: dict[str, str]) -> str | None:
    """The SoC name torch_npu reports, from ``npu-smi info -t board -i N -c C``.

    A3: ``{Chip Name}_{NPU Name}`` (``Ascend910_9392``); A2: ``{Chip Type}{Chip Name}``
    (``Ascend910B4``). None when the board text has no chip name.
    """
    chip = board.get("Chip Name", "").strip()
    if not chip:
        return None
    npu_name = board.get("NPU Name", "").strip()
    if npu_name and npu_name.upper() != "NA":
        return f"{chip}_{npu_name}"
    chip_type = board.get("Chip Type", "").strip()
    return chip if chip.startswith(chip_type) else f"{chip_type}{chip}"


def npu_generation(name_or_soc_version: str | int) -> str | None:
    """``A2`` / ``A3`` from a SoC name (``Ascend910B3``, ``910B2C``, ``Ascend910_9392``) or from
    ``torch_npu.npu.get_soc_version()`` (220-225 → A2, 250-255 → A3); None when unknown."""
    if isinstance(name_or_soc_version, int):
        if 220 <= name_or_soc_version <= 225:
            return "A2"
        return "A3" if 250 <= name_or_soc_version <= 255 else None
    name = name_or_soc_version.strip()
    if re.match(r"^(Ascend)?910B\d", name):
        return "A2"
    return "A3" if re.match(r"^Ascend910_93\d\d", name) else None


# Lines a failing npu-smi prints before its real error (the driver's console log level, every time).
_TOOL_NOISE = re.compile(r"^DrvMngGetConsoleLogLevel failed")


def first_error_line(text: str) -> str | None:
    """The line a person needs from a failing ``npu-smi`` / ``nvidia-smi``: its first non-blank line, less the
    driver noise npu-smi prints first (``DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)``); None if silent.

    ``dcmi model initialized failed, because the device is used. ret is -8020`` says what "no NPU" hides.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if not _TOOL_NOISE.match(ln)), lines[0] if lines else None)


# ----------------------------------------------------------------------------------------------
# nvidia-smi
# ----------------------------------------------------------------------------------------------


@dataclass
class GpuInfo:
    """One GPU from ``nvidia-smi``; memory in MiB as nvidia-smi prints it."""

    name: str
    index: int | None = None
    memory_total_mb: float | None = None
    memory_used_mb: float | None = None
    driver_version: str | None = None
    fields: dict[str, str] = field(default_factory=dict)  # every queried column, units stripped
    # The plain table's "MIG M." cell: "Enabled" when the GPU is split into MIG slices; None where not printed.
    mig_mode: str | None = None


_HEADER_CELL = re.compile(r"^([a-z][a-z0-9_.]*)(?:\s*\[[^\]]*\])?$")
_MISSING = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"}
# header name in nvidia-smi's csv → GpuInfo attribute
_ATTRS = {"memory.total": "memory_total_mb",
          "memory.used": "memory_used_mb", "driver_version": "driver_version"}


def _strip_unit(value: str) -> str:
    number = re.fullmatch(r"([-+]?\d+(?:\.\d+)?)\s*(?:MiB|MHz|W|%|C)", value.strip())
    return number.group(1) if number else value.strip()


def parse_nvidia_smi_query(csv_text: str, columns: list[str] | None = None) -> list[GpuInfo]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    A header row (``name, memory.total [MiB], ...``) names the columns and may appear again
    (several queries pasted together). Without a header pass ``columns`` (the query's field
    names, in order). Rows with another number of cells (elisions, prompts) are skipped; units
    (``97871 MiB``) and ``[N/A]`` are stripped to numbers / None.
    """
    header = list(columns) if columns else None
    gpus: list[GpuInfo] = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2 or line.lstrip().startswith(("#", "$")):
            continue
        names = [_HEADER_CELL.match(c) for c in cells]
        keys = [m.group(1) for m in names if m]
        if len(keys) == len(cells) and ("name" in keys or "index" in keys):
            header = keys
            continue
        if header is None or len(cells) != len(header):
            continue
        row = {k: _strip_unit(v) for k, v in zip(header, cells, strict=True)}
        if "name" not in row:
            continue
        gpu = GpuInfo(name=row["name"], fields=row)
        if row.get("index", "").isdigit():
            gpu.index = int(row["index"])
        for key, attr in _ATTRS.items():
            value = row.get(key, "")
            if value in _MISSING:
                continue
            setattr(gpu, attr, value if attr == "driver_version" else _number(value))
        gpus.append(gpu)
    return gpus


def parse_nvidia_smi_table(text: str) -> dict:
    """Plain ``nvidia-smi``: ``{"driver": str|None, "cuda": str|None, "gpus": [GpuInfo]}``.

    ``cuda`` is the banner's ``CUDA Version`` — the newest CUDA the *driver* supports, not the
    CUDA that torch was built with. Works for the 535 and the wider >= 550 layouts. Each GPU's ``mig_mode`` is
    its "MIG M." cell (``Enabled``: the GPU is split into MIG slices); the "MIG devices" table is not GPUs.
    """
    driver = re.search(r"Driver Version:\s*(\S+)", text)
    cuda = re.search(r"CUDA Version:\s*(\S+)", text)
    gpus: list[GpuInfo] = []
    gpus_done = False  # past the GPU table: the MIG devices' and processes' rows reuse its shapes
    row = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s*[0-9A-Fa-f]{4,8}:")
    memory = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
    mig_cell = re.compile(r"^\|[\s|]*\|\s*(Enabled|Disabled)\s*\|\s*$")  # a GPU's third row, "MIG M." column
    for line in text.splitlines():
        if line.startswith("| MIG devices:") or line.startswith("| Processes:"):
            gpus_done = True
        found = row.match(line)
        if found and not gpus_done:
            gpus.append(GpuInfo(name=found.group(2), index=int(found.group(1))))
            continue
        mig = mig_cell.match(line)
        if mig and gpus and gpus[-1].mig_mode is None and not gpus_done:
            gpus[-1].mig_mode = mig.group(1)
            continue
        used_total = memory.search(line)
        if used_total and gpus and gpus[-1].memory_total_mb is None and not gpus_done:
            gpus[-1].memory_used_mb = float(used_total.group(1))
            gpus[-1].memory_total_mb = float(used_total.group(2))
    for gpu in gpus:
        gpu.driver_version = driver.group(1) if driver else None
    return {"driver": driver.group(1) if driver else None, "cuda": cuda.group(1) if cuda else None,
            "gpus": gpus}


def parse_nvidia_smi_q_versions(text: str) -> dict:
    """``nvidia-smi -q`` header: ``{"driver", "cuda", "attached_gpus", "products"}``.

    ``cuda`` is, again, the driver's maximum CUDA. Missing keys are None / [].
    """

    def first(label: str) -> str | None:
        found = re.search(rf"^\s*{label}\s*:\s*(.+?)\s*$", text, re.MULTILINE)
        return found.group(1) if found else None

    attached = first("Attached GPUs")
    products = re.findall(r"^\s*Product Name\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    return {
        "driver": first("Driver Version"),
        "cuda": first("CUDA Version"),
        "attached_gpus": int(attached) if attached and attached.isdigit() else None,
        "products": products,
    }


# ----------------------------------------------------------------------------------------------
# host
# ----------------------------------------------------------------------------------------------


def parse_cpu_model(text: str) -> str | None:
    """CPU model from ``/proc/cpuinfo`` (``model name``) or ``lscpu`` (``Model name``).

    aarch64 ``/proc/cpuinfo`` has no model line (Kunpeng shows only ``CPU part``), so the caller
    tries ``lscpu`` next. None when neither line is present.
    """
    found = re.search(r"^\s*model name\s*:\s*(.+?)\s*$", text, re.MULTILINE | re.IGNORECASE)
    return found.group(1) if found and found.group(1) not in ("-", "") else None
