"""One rehearsal's state: the config it rehearses, what its stages built and found, and how a stage's exception
becomes one line (a problem of the config, or a warning about this machine).

Shared by every stage (:mod:`.stages`, :mod:`.checkpoint`); :func:`quiet` keeps verl's own output out of the
dry run's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ACTOR, MODEL
from verlflow.backends.verl.dryrun.rehearsal import machine
from verlflow.backends.verl.dryrun.rehearsal.empty_data import empty_data_problem
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import to_problem
from verlflow.errors import Problem

# Keys named when a stage fails with no better key.
NEAREST = {
    "model": (f"{MODEL}.path",),
    "start-up": ("data.train_files", "data.val_files", "data.prompt_key", "data.max_prompt_length",
                 f"{MODEL}.path"),
    "reward": ("reward.custom_reward_function.path", "reward.reward_kwargs", "data.reward_fn_key"),
    "algorithm.adv_estimator": ("algorithm.adv_estimator",),
    f"{ACTOR}.policy_loss.loss_mode": (f"{ACTOR}.policy_loss.loss_mode",),
}


@dataclass
class Findings:
    """What a rehearsal found: errors, warnings (the machine, not the config) and stages not rehearsed."""

    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@dataclass
class Rehearsal:
    """One rehearsal's state: its own copy of the resolved config and what the stages built."""

    cfg: DictConfig
    stack: str
    stack_packages: frozenset[str]
    findings: Findings = field(default_factory=Findings)
    # The model's folder on this machine (None: the stages that need files are not rehearsed), and whether
    # the config's files are this machine's to read (not a Ray job's).
    folder: str | None = None
    check_files: bool = True
    # The registered stages (verlflow.backends.verl.dryrun.checks) that passed so far.
    passed: set[str] = field(default_factory=set)
    tokenizer: Any = None
    trainer: Any = None
    # The last failed attempt failed only for a package this machine lacks (a warning, not the config's fault).
    machine_only: bool = False
    # The environment verl's processes start with (the profile's env over this one's): the user's modules.
    launch_env: dict[str, str] = field(default_factory=dict)

    def attempt(self, stage: str, action: Callable[[], Any], *, section: str | None = None,
                renamed: dict[str, str] | None = None) -> tuple[bool, Any]:
        """Run ``action`` quietly; an exception becomes a problem (or a warning about this machine)."""
        try:
            with quiet():
                return True, action()
        except Reached as reached:
            return True, reached.trainer
        except Exception as exc:  # verl raises AssertionError, ValueError, TypeError, … from its checks
            self.machine_only = self.record(exc, stage, section=section, renamed=renamed)
            return False, None

    def add(self, problems: list[Problem], warnings: list[str] | tuple[str, ...] = ()) -> None:
        """Record what a stage found."""
        self.findings.problems += problems
        self.findings.warnings += warnings

    def image_may_have(self, package: str) -> bool:
        """Whether the cluster image has ``package``, or no image is named to tell (then a warning, not an error)."""
        return not self.stack_packages or machine.image_has(package, self.stack_packages)

    def image_says(self, package: str) -> str:
        """Whether the profile's cluster image has ``package``, in words."""
        return _image_words(self.stack, self.stack_packages, package)

    def record(self, exc: BaseException, stage: str, *, section: str | None = None,
               renamed: dict[str, str] | None = None) -> bool:
        """Add ``exc`` as a problem, or as a warning when a package this machine lacks caused it (then True)."""
        package = machine.missing_package(exc)
        if package and not machine.installed(package):
            if self.image_may_have(package):
                self.findings.warnings.append(
                    f"{stage}: not rehearsed here: {package} is not installed on this machine "
                    f"({self.image_says(package)}), and verl needs it for this check")
                return True
            blamed = to_problem(exc, self.cfg, stage=stage, section=section, nearest=NEAREST.get(stage, ()))
            self.findings.problems.append(Problem(blamed.key, blamed.value, (
                f"needs {package}, which is not installed here and not in the {self.stack or 'profile'} image: "
                "install it on the nodes or choose what the image has")))
            return False
        explained = empty_data_problem(exc, self.cfg) if stage == "start-up" else None
        self.findings.problems.append(explained or to_problem(exc, self.cfg, stage=stage, section=section,
                                                              nearest=NEAREST.get(stage, ()), renamed=renamed))
        return False


def _image_words(stack: str, packages: frozenset[str], package: str) -> str:
    if not packages:
        return "no cluster image is named to tell whether it has it"
    return f"the {stack} image has it" if machine.image_has(package, packages) else f"the {stack} image lacks it"


class Reached(Exception):
    """verl's trainer is built: the next thing verl does is start Ray workers."""

    def __init__(self, trainer: Any):
        super().__init__("reached init_workers")
        self.trainer = trainer


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep verl's prints, progress bars, warnings and log lines out of the dry run's output."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
