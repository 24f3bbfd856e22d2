"""verlflow installs into every shipped stack (the guide's own A3 and H20 images) without moving any of their versions.

``uv pip compile`` resolves, for each image's platform (linux aarch64 / x86_64) and Python 3.10, the §6.1
pins (config/stacks/*.yaml) together with this checkout of verlflow, from the package index (metadata only).
It needs the index: when it is unreachable the test fails with uv's message, it never skips.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import slow_setup
from packaging.requirements import Requirement

from verlflow.device.stacks import Resolution, list_stacks, load_stack, resolve_into

REPO = Path(__file__).resolve().parents[1]


def _verlflow_requirements() -> dict[str, Requirement]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d) for d in deps}


def test_verlflow_admits_the_guides_source_built_verl_and_every_pinned_version():
    reqs = _verlflow_requirements()
    assert reqs["verl"].specifier.contains("0.5.0.dev0") and reqs["verl"].specifier.contains("0.9.1")
    for name in list_stacks():
        stack = load_stack(name)
        for package, version in stack.pins().items():
            if package in reqs:
                assert reqs[package].specifier.contains(version, prereleases=True), (name, package, version)


# The conflict shown by test_a_conflicting_pin_fails_with_a_clear_message: a transformers older than verlflow's floor.
CONFLICT = ("h20", (("transformers", "4.40.0"),))


@pytest.fixture(scope="module")
@slow_setup
def resolutions() -> dict[tuple[str, tuple], Resolution]:
    """Every resolution this module checks, ``(stack, replaced pins) -> Resolution``, made at the same time: each is
    a ``uv pip compile`` that waits on the package index for most of its seconds, so together they take the
    longest one's time instead of the sum."""
    asked = [(stack, ()) for stack in list_stacks()] + [CONFLICT]
    with ThreadPoolExecutor(len(asked)) as pool:
        results = pool.map(lambda key: resolve_into(key[0], REPO, replace=dict(key[1])), asked)
        return dict(zip(asked, results, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("stack", list_stacks())
def test_each_stack_resolves_with_verlflow_and_keeps_its_pins(stack, resolutions):
    result = resolutions[(stack, ())]
    assert result.ok, result.summary()
    assert result.changed == {}, result.summary()
    assert result.resolved["verlflow"] == "local"
    assert result.resolved["mlflow"].startswith("3.17.")  # mlflow's own dependencies resolve on 3.10 too
    # An image override (torch on H20) is named, and verlflow's own bound admits it (checked above).
    assert result.overrides == load_stack(stack).overrides()


@pytest.mark.slow
def test_a_conflicting_pin_fails_with_a_clear_message(resolutions):
    result = resolutions[CONFLICT]
    assert not result.ok
    assert re.search(r"verlflow.* depends on transformers>=4\.51\.0", result.message), result.message
    assert result.summary().startswith("verlflow does not install into the h20 stack: ")
