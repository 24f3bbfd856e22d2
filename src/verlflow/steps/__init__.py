"""The steps: one module per entry point, and the table of steps that the command line and MLproject share.

    python -c "from verlflow.steps import steps_markdown; print(steps_markdown())"

Each step is a thin function that takes its typed request (:mod:`verlflow.step_requests`) and calls the
domain packages (``config``, ``data``, ``device``, ``backends``, ``models``, ``runs``, ``search``,
``compare``); nothing below this package imports it. ``MLproject`` declares the same entry points and
parameters (tests/test_project_contract.py keeps the two equal), the entry-point table of
docs/entry-points.md is :func:`steps_markdown`, and :mod:`verlflow.cli` builds its parser from :data:`STEPS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verlflow.step_requests import (
    CompareRequest,
    DoctorRequest,
    EvaluateRequest,
    MainRequest,
    Param,
    PreprocessRequest,
    PromoteRequest,
    RegisterRequest,
    SearchRequest,
    TrainRequest,
    params_of,
)
from verlflow.steps.compare import run_compare
from verlflow.steps.doctor import run_doctor
from verlflow.steps.evaluate import run_evaluate
from verlflow.steps.main import run_main
from verlflow.steps.preprocess import run_preprocess
from verlflow.steps.promote import run_promote
from verlflow.steps.register import run_register
from verlflow.steps.search import run_search
from verlflow.steps.train import run_train


@dataclass(frozen=True)
class Step:
    """A step: the function that runs it, what it does, and its request type (its parameters)."""

    name: str
    run: Callable[[Any], Any]
    help: str
    request: type
    # Whether it uses the tracking store: one that does not (doctor) neither names, opens nor creates one.
    tracks: bool = True

    @property
    def params(self) -> tuple[Param, ...]:
        """The step's parameters in ``MLproject`` order."""
        return params_of(self.request)


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step("main", run_main, "preprocess → evaluate the starting model → train → register → evaluate → promote",
             MainRequest),
        Step("preprocess", run_preprocess, "GSM8K → verl parquet, logged as dataset inputs", PreprocessRequest),
        Step("train", run_train, "GRPO training through verl (npu/gpu) or the local trainer", TrainRequest),
        Step("evaluate", run_evaluate, "GSM8K accuracy of a model", EvaluateRequest),
        Step("register", run_register, "register a train run's final checkpoint", RegisterRequest),
        Step("promote", run_promote, "move an alias to the best version", PromoteRequest),
        Step("search", run_search, "Optuna search over lr, KL coefficient and group size", SearchRequest),
        Step("compare", run_compare, "A3-vs-H20 report from two runs (the guide's §6)", CompareRequest),
        Step("doctor", run_doctor, "can verl launch here? this machine against the guide's stack", DoctorRequest,
             tracks=False),
    )
}


def steps_markdown() -> str:
    """The entry-point table of docs/entry-points.md: every step and parameter with its default."""
    lines = ["| entry point | parameter | default | meaning |", "| --- | --- | --- | --- |"]
    for step in STEPS.values():
        for i, p in enumerate(step.params):
            name = f"`{step.name}`" if i == 0 else ""
            default = "*required*" if p.default is None else f"`{p.default}`" if p.default else '`""`'
            lines.append(f"| {name} | `{p.name}` | {default} | {p.help.replace('|', '/')} |")
    return "\n".join(lines)
