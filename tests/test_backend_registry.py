"""The trainers sit behind one interface, registered by name (as verl registers its estimators).

The shipped ``local`` and ``verl`` backends are found by name and by device; a backend of one's own registers
the same way and is chosen by ``backend=<its name>`` with no change to the train step.
"""

from __future__ import annotations

import pytest

from verlflow.backends.registry import (
    TrainBackend,
    TrainLaunch,
    backend_names,
    default_backend,
    get_backend,
    register_backend,
)
from verlflow.backends.train_setup import choose_train_setup
from verlflow.errors import VerlflowError
from verlflow.platforms import Device


def test_the_shipped_backends_register_under_their_names_and_devices():
    assert {"local", "verl"} <= set(backend_names())
    assert default_backend(Device.CPU).name == "local"
    assert default_backend(Device.NPU).name == default_backend(Device.GPU).name == "verl"
    assert choose_train_setup("auto", "cpu", "auto", "auto") == ("smoke", Device.CPU, "cpu", "local")
    assert choose_train_setup("auto", "cpu", "auto", "verl") == ("smoke", Device.CPU, "cpu-verl", "verl")
    assert choose_train_setup("auto", "npu", "auto", "auto") == ("qwen3-4b-gsm8k-grpo", Device.NPU, "a3", "verl")
    assert get_backend("local").checks_up_front and not get_backend("verl").checks_up_front


def test_an_unknown_backend_is_one_line_naming_the_registered_ones():
    with pytest.raises(VerlflowError, match=r"^unknown backend 'trl': use one of auto, .*local.*verl"):
        choose_train_setup("auto", "cpu", "auto", "trl")


def test_the_local_backend_refuses_what_only_a_verl_launch_has():
    with pytest.raises(VerlflowError, match="dry_run and ray_address apply to backend=verl only"):
        get_backend("local").prepare(None, TrainLaunch(data_dir="d", dry_run=True), None)


def test_a_backend_of_ones_own_registers_and_is_chosen_by_name():
    @register_backend("test-echo")
    class EchoBackend(TrainBackend):
        """Trains nothing: hands back what the step gave it."""

        def train(self, cfg, launch, *, run_id, started_at, prepared):
            return (cfg, launch, run_id)

    assert get_backend("test-echo").name == "test-echo" and "test-echo" in backend_names()
    assert choose_train_setup("smoke", "cpu", "cpu", "test-echo") == ("smoke", Device.CPU, "cpu", "test-echo")
    with pytest.raises(ValueError, match="backend 'test-echo' is already registered"):
        register_backend("test-echo")(type("Other", (TrainBackend,), {}))
