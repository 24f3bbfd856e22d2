"""Run reuse: a pipeline's steps as child runs of one parent, a FINISHED run with the same inputs reused.

    python -c "from verlflow.tracking.reuse import code_version; print(code_version())"

The engine behind ``verlflow main`` (the MLflow multistep example's ``_already_ran``, grown up): a step run is
reused only when its params (compared as strings, as MLflow's example does), its code version (tag
``verlflow.code_version``: the git commit of the package plus a hash of uncommitted edits, else the package
version) and the tags the caller matches on (``data.digest``) agree, and its output still exists
(:func:`data_present`, :func:`checkpoint_current`). The match is looked for in every active experiment of
the store, not only the parent's: the same inputs and code give the same output whichever experiment the
first run was filed in (a plain ``mlflow run`` files it in Default, a rerun with ``--experiment-name`` in
the recipe's), so following the advice to name the experiment redoes nothing. In another experiment only the
runs of the chain's own user count. A step it runs gets a child run created the way ``mlflow run`` creates
one, and that run is never left RUNNING.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Param, Run, ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_USER

from verlflow import __version__
from verlflow.names import (
    CHECKPOINT_DIR_TAG,
    CODE_VERSION_TAG,
    DATA_DIR_TAG,
    ERROR_TAG,
    REUSED_TAG_PREFIX,
    STEP_RUN_TAG_PREFIX,
    STEP_TAG,
)
from verlflow.secrets import mask_text
from verlflow.step_requests import as_params, as_text
from verlflow.tracking import tracking
from verlflow.util import filter_quote


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The code a step ran with: git commit of the package (+ hash of uncommitted edits), else its version."""
    package_dir = Path(__file__).resolve().parents[1]  # the verlflow package, whichever module asks
    try:
        head = subprocess.run(["git", "-C", str(package_dir), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=20)
        if head.returncode != 0:
            return f"verlflow-{__version__}"
        diff = subprocess.run(["git", "-C", str(package_dir), "diff", "HEAD", "--", "."],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return f"verlflow-{__version__}"
    commit = head.stdout.strip()
    if diff.returncode == 0 and diff.stdout:
        return f"{commit}+{hashlib.sha256(diff.stdout.encode()).hexdigest()[:12]}"
    return commit


class StepRunner:
    """Runs steps as child runs of one parent, reusing a matching FINISHED run where allowed."""

    def __init__(self, client: MlflowClient, parent: Run, phases: Mapping[str, str] | None = None):
        """``phases``: what each named step does, printed as it starts (``train`` → ``training``)."""
        self.client = client
        self.phases = dict(phases or {})
        self.parent_id = parent.info.run_id
        self.experiment_id = parent.info.experiment_id
        self.user = parent.info.user_id
        self.code = code_version()
        self.runs: dict[str, str] = {}
        self.reused: dict[str, str] = {}

    def find_reusable(self, step: str, params: dict[str, str], match_tags: dict[str, str],
                      still_valid: Callable[[Run], bool]) -> Run | None:
        """The newest FINISHED run of ``step`` with these params (as strings), code version and tags; one from
        another experiment only when its user is this chain's (a run planted in another experiment, its checkpoint
        on a shared disk, must not become this user's registered model)."""
        query = (f"tags.`{STEP_TAG}` = '{step}' and attributes.status = 'FINISHED' "
                 f"and tags.`{CODE_VERSION_TAG}` = '{self.code}'")
        candidates = self.client.search_runs(store_experiment_ids(self.client, first=self.experiment_id), query,
                                             order_by=["attributes.start_time DESC"], max_results=200)
        for run in candidates:
            if run.info.run_id == self.parent_id:
                continue
            if run.info.experiment_id != self.experiment_id and run.info.user_id != self.user:
                continue
            same_params = all(run.data.params.get(k) == v for k, v in params.items())
            same_tags = all(run.data.tags.get(k) == v for k, v in match_tags.items())
            if same_params and same_tags and still_valid(run):
                return run
        return None

    def run(self, step: str, request: Any, call: Callable[..., Any], *, reusable: bool = False,
            match_tags: dict[str, str] | None = None, still_valid: Callable[[Run], bool] = lambda run: True,
            tags: dict[str, str] | None = None, name: str = "", run_name: str = "",
            extra_params: dict[str, Any] | None = None) -> tuple[Run, Any]:
        """Reuse or run one step; returns its (ended) run and, when it ran, what the step returned.

        The child run logs the request's parameters (plus ``extra_params``) as ``mlflow run`` would, and
        ``call(request, run_id=<child>)`` runs the step in it. ``name`` tells apart two runs of one step in
        the chain (parent tags, log; default ``step``); ``run_name`` is what the MLflow UI shows (default ``name``).
        """
        params = {**as_params(request), **{k: as_text(v) for k, v in (extra_params or {}).items()}}
        match_tags = match_tags or {}
        name = name or step
        if reusable and (found := self.find_reusable(step, params, match_tags, still_valid)):
            run_id = found.info.run_id
            print(f"main: {name}: reusing FINISHED run {run_id} (same parameters and code version)")
            self.client.set_tag(self.parent_id, f"{REUSED_TAG_PREFIX}{name}", run_id)
            self.client.set_tag(self.parent_id, f"{STEP_RUN_TAG_PREFIX}{name}", run_id)
            self.runs[name], self.reused[name] = run_id, run_id
            return found, None
        child = self.client.create_run(self.experiment_id, run_name=run_name or name, tags={
            MLFLOW_PARENT_RUN_ID: self.parent_id, MLFLOW_USER: self.user, STEP_TAG: step, CODE_VERSION_TAG: self.code,
            **match_tags, **(tags or {}),
        })
        run_id = child.info.run_id
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        self.client.set_tag(self.parent_id, f"{STEP_RUN_TAG_PREFIX}{name}", run_id)
        self.runs[name] = run_id
        print(f"main: {name}: run {run_id}: {self.phases.get(name, step)} …", flush=True)
        with _ended(self.client, run_id):
            value = call(request, run_id=run_id)
        return self.client.get_run(run_id), value


@contextlib.contextmanager
def _ended(client: MlflowClient, run_id: str) -> Iterator[None]:
    """Never leave the step's run RUNNING: a step that failed before it opened the run did not end it."""
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        with contextlib.suppress(MlflowException):
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, tracking.end_status(error))
                if error is not None:
                    client.set_tag(run_id, ERROR_TAG, mask_text(f"{type(error).__name__}: {error}")[:500])


def data_present(run: Run) -> bool:
    """A preprocess run's data folder still holds both splits."""
    folder = run.data.tags.get(DATA_DIR_TAG)
    return bool(folder) and all((Path(folder) / f"{s}.parquet").is_file() for s in ("train", "test"))


def store_experiment_ids(client: MlflowClient, first: str = "") -> list[str]:
    """The ids of every active experiment of the store (``first``, when given, leads), where reuse looks."""
    ids, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        ids.extend(e.experiment_id for e in page)
        token = page.token
        if not token:
            break
    return list(dict.fromkeys([first, *ids] if first else ids))


def checkpoint_current(client: MlflowClient, experiment_id: str = "") -> Callable[[Run], bool]:
    """A train run's checkpoint is still its own: present, and no later run (in any experiment) wrote the
    same folder."""

    def check(run: Run) -> bool:
        folder = run.data.tags.get(CHECKPOINT_DIR_TAG)
        if not folder or not (Path(folder) / "config.json").is_file():
            return False
        escaped = filter_quote(folder)
        newest = client.search_runs(store_experiment_ids(client, first=experiment_id),
                                    f"tags.`{CHECKPOINT_DIR_TAG}` = '{escaped}'",
                                    order_by=["attributes.start_time DESC"], max_results=1)
        return bool(newest) and newest[0].info.run_id == run.info.run_id

    return check
