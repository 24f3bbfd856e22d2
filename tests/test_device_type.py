"""The device is the ``Device`` type from the moment it is decided: no string literal stands for it in code.

Reads every module's syntax tree: outside ``verlflow.platforms`` (where the kinds are defined), no
comparison (``==``, ``!=``, ``in``, ``is``) has ``"npu"`` / ``"gpu"`` / ``"cpu"`` as an operand (alone or in a
literal tuple, list or set), and no dict literal is keyed by one; one detection order (``detect_device``) and
one default-profile table (``PROFILE_FOR_DEVICE``) serve every step.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verlflow
from verlflow.config import PROFILE_FOR_DEVICE
from verlflow.device.detect import Probe, detect_device
from verlflow.errors import VerlflowError
from verlflow.platforms import Device

PACKAGE_DIR = Path(verlflow.__file__).parent
HOME = PACKAGE_DIR / "platforms"
NAMES = {d.value for d in Device}


def _device_literals(node: ast.AST) -> list[str]:
    """The device names a comparison operand spells as a string literal (itself, or inside a literal collection)."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for elt in node.elts for v in _device_literals(elt)]
    return []


def device_literal_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each comparison against a device string literal and each dict literal keyed by one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, f"comparison with '{v}'") for v in _device_literals(operand)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, f"dict keyed by '{k.value}'") for k in node.keys
                      if isinstance(k, ast.Constant) and k.value in NAMES]
    return found


def test_the_finder_sees_every_shape_it_forbids():
    src = 'a = dev == "npu"\nb = "gpu" != x\nc = d in ("npu", "gpu")\ne = {"cpu": 1}\nf = dev is Device.NPU\n'
    assert [line for line, _ in device_literal_uses(src)] == [1, 2, 3, 3, 4]


def test_no_device_is_compared_with_a_string_literal_outside_its_own_module():
    offenders = [f"{path.relative_to(PACKAGE_DIR.parent)}:{line}: {what}"
                 for path in sorted(PACKAGE_DIR.rglob("*.py")) if HOME not in path.parents
                 for line, what in device_literal_uses(path.read_text(encoding="utf-8"))]
    assert offenders == [], "use the Device type (Device.NPU, dev.torch_type, …):\n" + "\n".join(offenders)


def test_one_default_profile_table_and_one_detection_order():
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE_DIR.rglob("*.py")}
    tables = [p.name for p, text in sources.items() if "PROFILE_FOR_DEVICE = " in text]
    assert tables == ["device_defaults.py"]
    assert set(PROFILE_FOR_DEVICE) == set(Device)
    # Both present: the NPU wins (torch_npu installed and npu-smi lists chips), then the GPU, then the CPU.
    npu_smi = (PACKAGE_DIR.parents[1] / "tests" / "fixtures" / "device" / "npu-smi-info-a3-16chip.txt").read_text()
    gpus = (PACKAGE_DIR.parents[1] / "tests" / "fixtures" / "device" / "nvidia-smi-query-h20x8.csv.txt").read_text()
    from verlflow.device.detect import NPU_SMI_INFO, NVIDIA_SMI_QUERY

    both = Probe.recorded({" ".join(NPU_SMI_INFO): npu_smi, " ".join(NVIDIA_SMI_QUERY): gpus}, modules=["torch_npu"])
    assert detect_device(probe=both) is Device.NPU
    assert detect_device(probe=Probe.recorded({" ".join(NVIDIA_SMI_QUERY): gpus})) is Device.GPU
    assert detect_device(probe=Probe.recorded()) is Device.CPU
    assert detect_device("GPU") is Device.GPU


def test_an_unknown_device_is_one_line_naming_the_valid_ones():
    with pytest.raises(VerlflowError, match=r"^unknown device 'tpu': use one of auto, npu, gpu, cpu$"):
        detect_device("tpu")
