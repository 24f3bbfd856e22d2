"""Device kinds are platform objects: a new kind is one module plus its YAML, and nothing else changes.

The made-up kind ``fakeaccel`` exists only in tests/fixtures/hardware (``fakeaccel.py``: its platform and the
collector of its lister's output; ``made-up-fakeaccel.yaml``: a node of it; ``fakeaccel-smi.txt``: what its
lister prints). Registered by the test, it goes through the profile, detection, identity, backend choice and
compare's utilisation paths as npu and gpu do; the shipped kinds keep their names and fields.
"""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import pytest

from verlflow.backends.registry import default_backend
from verlflow.compare.snapshot import RunSnapshot
from verlflow.compare.utilisation import run_utilisation
from verlflow.config import PROFILE_FOR_DEVICE, default_recipe, load_profile
from verlflow.device import identity
from verlflow.device.detect import Probe, collect_device_profile, count_visible, detect_device, identify_node
from verlflow.errors import VerlflowError
from verlflow.platforms import Device, platform_of, unregister

HARDWARE = Path(__file__).parent / "fixtures" / "hardware"
LISTING = (HARDWARE / "fakeaccel-smi.txt").read_text()


@pytest.fixture
def fakeaccel(monkeypatch):
    """The made-up kind, registered from the fixtures folder for one test, then forgotten."""
    monkeypatch.syspath_prepend(str(HARDWARE))
    sys.modules.pop("fakeaccel", None)
    importlib.import_module("fakeaccel")  # registers the kind (its module calls register)
    yield Device("fakeaccel")
    unregister("fakeaccel")
    sys.modules.pop("fakeaccel", None)


def _machine(**kw) -> Probe:
    return Probe.recorded({"fakeaccel-smi": LISTING}, modules=["torch_fakeaccel"], **kw)


def test_the_shipped_kinds_keep_their_names_and_fields():
    assert tuple(Device) == ("npu", "gpu", "cpu") and Device("gpu") is Device.GPU == "gpu"
    assert pickle.loads(pickle.dumps(Device.NPU)) is Device.NPU
    fields = [(p.torch_type, p.visible_devices_var, p.ray_resource, p.collective_backend, p.profiler_tool,
               p.lister, p.default_profile) for p in map(platform_of, Device)]
    assert fields == [("npu", "ASCEND_RT_VISIBLE_DEVICES", "NPU", "hccl", "npu", ("npu-smi", "info"), "a3"),
                      ("cuda", "CUDA_VISIBLE_DEVICES", "GPU", "nccl", "torch", ("nvidia-smi",), "h20"),
                      ("cpu", None, None, "gloo", "torch", (), "cpu")]
    with pytest.raises(ValueError, match="'fakeaccel' is not a valid Device: use one of npu, gpu, cpu"):
        Device("fakeaccel")


def test_a_made_up_kind_is_a_device_with_its_profile_defaults_and_backend(fakeaccel):
    profile = load_profile(str(HARDWARE / "made-up-fakeaccel.yaml"))
    assert profile.device is fakeaccel and profile.accelerator.name == "FX1-BOX"
    assert tuple(Device)[-1] is fakeaccel and Device.of_torch("fakeaccel") is fakeaccel
    assert PROFILE_FOR_DEVICE[fakeaccel] == "made-up-fakeaccel" and default_recipe(fakeaccel) != default_recipe("cpu")
    assert default_backend(fakeaccel).name == "verl"  # an accelerator: verl's trainer, as on npu and gpu


def test_a_made_up_kind_is_detected_counted_and_identified(fakeaccel):
    assert detect_device(probe=_machine()) is fakeaccel  # no npu-smi or nvidia-smi here: the made-up one lists 4
    assert count_visible("fakeaccel", probe=_machine(), environ={"FAKEACCEL_VISIBLE_DEVICES": "0,1"}) == 2
    profile = load_profile(str(HARDWARE / "made-up-fakeaccel.yaml"))
    found = collect_device_profile("fakeaccel", probe=_machine(), environ={}, profile=profile)
    tags = found.to_tags()
    assert {k: tags[k] for k in ("device.type", "device.name", "device.count", "device.memory_gb", "device.driver",
                                 "device.model", "device.record_fits")} == {
        "device.type": "fakeaccel", "device.name": "FakeAccelX1", "device.count": "4", "device.memory_gb": "64",
        "device.driver": "9.1.0", "device.model": "FakeAccel X1 64GB (test record)", "device.record_fits": "true"}
    node = identify_node("fakeaccel", probe=_machine(), environ={})
    assert (node.device, node.count, node.listed) == (fakeaccel, 4, "FakeAccelX1")
    identity.check_fits(profile, node, accepted=False)  # the record fits what the lister names: no refusal
    assert identity.accelerator_key(tags) == "fakeaccel: FakeAccelX1"


def test_compare_reads_a_made_up_kinds_system_metrics(fakeaccel):
    histories = {f"system/fakeaccel_{i}_{name}": [(0, value), (1, value)]
                 for i in range(2) for name, value in (("busy_percentage", 50.0 + i * 10), ("power_watts", 100.0))}
    snap = RunSnapshot("baseline", "r1", "run", "FINISHED", {"device.type": "fakeaccel"}, {},
                       {k: v[-1][1] for k, v in histories.items()}, histories)
    found = run_utilisation(snap, histories)
    assert (found.device, found.device_count) == ("fakeaccel", 2)
    assert found.series["util"].points == {0: 55.0, 1: 55.0} and found.series["power"].points == {0: 200.0, 1: 200.0}


def test_a_profile_of_an_unregistered_kind_is_one_line(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text((HARDWARE / "made-up-fakeaccel.yaml").read_text())
    with pytest.raises(VerlflowError, match=r"has device 'fakeaccel': use one of npu, gpu, cpu$"):
        load_profile(str(path))
