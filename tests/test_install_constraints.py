"""The README's set-up installs without pip backtracking: a current pip, and every version pinned by constraints.txt.

constraints.txt is `uv pip compile`'s resolution of pyproject.toml's dependencies and dev extras with the CPU
torch pin (constraints.in). It is for the CPU dev install only: the cluster install (`pip install -e .` into the
image's environment) takes no constraints, so the images' torch, torch_npu, vllm and verl never move
(tests/test_cluster_install.py resolves verlflow into them without it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)")
# What PyPI's (CUDA) torch build adds over the CPU wheel the dev install uses.
CUDA_TORCH_EXTRAS = re.compile(r"^(nvidia-|cuda-|triton$)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        if match := PIN.match(line.strip()):
            pins[_norm(match.group(1))] = match.group(2)
    return pins


def _readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    after = text.split(f"<!-- {marker} -->", 1)[1]
    return after.split("```", 2)[1].removeprefix("bash").strip()


def _project_requirements() -> list[Requirement]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


@pytest.mark.parametrize("marker", ["ci:main", "ci:test"])
def test_the_readme_set_up_upgrades_pip_then_installs_against_the_constraints(marker):
    parts = _readme_block(marker).split(" && ")
    assert parts[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"], parts
    assert parts[2] == "python -m pip install -U pip", parts
    assert parts[3] == 'pip install torch==2.13.0 -e ".[dev]" -c constraints.txt', parts


def test_the_constraints_pin_every_dependency_and_leave_torch_to_the_install_command():
    pins = _pins((REPO / "constraints.txt").read_text())
    missing = [r.name for r in _project_requirements() if _norm(r.name) not in pins and _norm(r.name) != "torch"]
    assert missing == [], f"constraints.txt lacks {missing}: regenerate it (command in its header)"
    for requirement in _project_requirements():
        if _norm(requirement.name) in pins:
            assert requirement.specifier.contains(pins[_norm(requirement.name)], prereleases=True), requirement
    # torch is pinned by the install command (the CPU wheel); no CUDA build's packages are pinned here.
    ours = {_norm(r.name) for r in _project_requirements()}  # nvidia-ml-py is verlflow's own (GPU monitor)
    assert not [name for name in pins if name == "torch" or (CUDA_TORCH_EXTRAS.match(name) and name not in ours)]


def test_ci_also_runs_the_fast_tests_at_the_lowest_mlflow_pyproject_admits():
    """pyproject.toml's lower bound is the MLflow the second venv installs, and the README's test command runs it."""
    (mlflow_requirement,) = [r for r in _project_requirements() if _norm(r.name) == "mlflow"]
    (floor,) = [spec.version for spec in mlflow_requirement.specifier if spec.operator == ">="]
    lowest = _pins((REPO / "constraints-mlflow-lowest.txt").read_text())
    assert lowest["mlflow"] == lowest["mlflow-skinny"] == floor, "regenerate constraints-mlflow-lowest.txt"
    newest = _pins((REPO / "constraints.txt").read_text())["mlflow"]
    assert newest != floor and mlflow_requirement.specifier.contains(newest)
    assert _readme_block("ci:test").endswith(" && bash scripts/test_lowest_mlflow.sh")
    assert " && python -m pytest -n 2 " in _readme_block("ci:test")  # the main suite first, on both cores
    script = (REPO / "scripts/test_lowest_mlflow.sh").read_text()
    assert "set -euo pipefail" in script
    assert "scripts/pins_that_differ.py constraints.txt constraints-mlflow-lowest.txt" in script
    # What that venv installs over the main one: MLflow at the floor, and nothing the lowest pins leave equal.
    changed = subprocess.run([sys.executable, "scripts/pins_that_differ.py", "constraints.txt",
                              "constraints-mlflow-lowest.txt"], cwd=REPO, capture_output=True, text=True, check=True)
    installed = dict(line.split("==") for line in changed.stdout.split())
    assert installed["mlflow"] == installed["mlflow-skinny"] == floor
    assert all(newest_pin != installed.get(name) for name, newest_pin in _pins(
        (REPO / "constraints.txt").read_text()).items())


def test_the_cluster_install_takes_no_constraints():
    readme = (REPO / "README.md").read_text()
    cluster = readme.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    installs = [line for line in cluster.splitlines() if line.startswith("pip install")]
    assert installs and all("constraints" not in line and "torch==" not in line for line in installs), installs


@pytest.mark.slow
def test_the_constraints_resolve_with_the_project():
    """uv resolves pyproject.toml + the torch pin under constraints.txt to exactly its versions (index metadata)."""
    header = (REPO / "constraints.txt").read_text().splitlines()[1]
    python = re.search(r"--python-version (\S+)", header).group(1)
    platform = re.search(r"--python-platform (\S+)", header).group(1)
    done = subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", "pyproject.toml", "constraints.in", "--extra", "dev",
         "--constraint", "constraints.txt", "--python-version", python, "--python-platform", platform,
         "--no-header", "--no-annotate", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = _pins(done.stdout)
    pinned = _pins((REPO / "constraints.txt").read_text())
    moved = {k: (v, resolved.get(k)) for k, v in pinned.items() if resolved.get(k) != v}
    assert moved == {}, moved
    # Beyond the pins: only torch itself and, from the index's CUDA build, its CUDA packages.
    extra = [k for k in resolved if k not in pinned and k != "torch" and not CUDA_TORCH_EXTRAS.match(k)]
    assert extra == [], extra
