"""Whether a rehearsal step failed because of this machine, not the config: a package the cluster image has.

A dry run on a laptop or a CPU CI runner lacks vLLM, torch_npu, sglang. verl imports them in the middle of
its checks (``verl/third_party/vllm`` raises ``vllm version None not supported`` when LoRA is checked), so a
failure there says nothing about the config. :func:`missing_package` finds the package an exception is
about; :func:`image_has` asks the profile's stack (``config/stacks/<name>.yaml``) whether the cluster has it.
"""

from __future__ import annotations

import importlib.util
import re

from verlflow.backends.verl.dryrun.rehearsal.raise_sites import frames

# verl's own messages for a missing engine package (verl/third_party/vllm/__init__.py).
MISSING_MESSAGES = (
    (re.compile(r"vllm version None not supported"), "vllm"),
    (re.compile(r"No module named '([\w.]+)'"), None),
)
# Import names whose distribution (as a stack lists it) is spelled differently.
DISTRIBUTIONS = {"torch_npu": "torch-npu", "vllm_ascend": "vllm-ascend", "megatron": "megatron-core",
                 "sglang": "sglang", "vllm": "vllm"}


def missing_package(exc: BaseException) -> str | None:
    """The import name of a package that ``exc`` (or its chain) says is not installed here, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name:
            return current.name.split(".")[0]
        text = str(current)
        for pattern, package in MISSING_MESSAGES:
            match = pattern.search(text)
            if match:
                return package or match.group(1).split(".")[0]
        for frame, _ in frames(current):
            if frame.f_code.co_filename.replace("\\", "/").endswith("verl/third_party/vllm/__init__.py"):
                return "vllm"
        current = current.__cause__ or current.__context__
    return None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def image_has(package: str, stack_packages: frozenset[str]) -> bool:
    """Whether the profile's cluster image lists ``package`` (an import name)."""
    distribution = DISTRIBUTIONS.get(package, package).lower().replace("_", "-")
    return distribution in {name.lower().replace("_", "-") for name in stack_packages}
