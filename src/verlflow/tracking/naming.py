"""Runs that read well side by side in the MLflow UI: descriptive train run names, compare-runs links.

    python -c "from verlflow.tracking.naming import train_run_name; print(train_run_name('qwen3-4b-gsm8k-grpo', 'a3'))"

A train run is named ``<overrides, short> · <recipe> · <profile>`` (``seed=2 lr=1e-05 · smoke · cpu``: each
override's last key segment, more segments where two would read alike), or ``<recipe> · <profile>``
(``qwen3-4b-gsm8k-grpo · a3``) when it has no overrides: what tells two runs apart comes first, where the
runs table's narrow name column still shows it, and a long list of overrides is cut, never the recipe and
profile. The start time is the table's own column. Its description (``mlflow.note.content``) lists the
overrides in full. That is, unless someone named it: ``mlflow run --run-name`` (MLflow sets the
name tag itself, before or after the step starts — either way a real name is kept) or a caller such as a
search trial. Only the names
MLflow makes up (``bold-cat-123``) and the pipeline's bare step name ``train`` are replaced.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence

from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from verlflow.compat import mlflow as compat_mlflow
from verlflow.outage.store_retry import LockRetryingClient
from verlflow.secrets import mask_text

log = logging.getLogger(__name__)

SEPARATOR = " · "
# The name the main pipeline gives its train child run (verlflow.steps.main creates it with the step name).
STEP_PLACEHOLDERS = {"train"}


# Longer names are cut (with "…"): the full list is in the run's description.
MAX_NAME_CHARS = 160


# First in a dry run's name: it launched nothing, and must not read as the real run of its recipe and profile.
DRY_RUN_PREFIX = "dry run"


def train_run_name(recipe: str, profile: str, overrides: str = "", *, dry_run: bool = False) -> str:
    """``<short overrides> · <recipe> · <profile>``, or ``<recipe> · <profile>`` without overrides.

    Recipe/profile paths are shortened to their stem; only the overrides are cut (with "…") to fit.
    A dry run's name starts with ``dry run · ``.
    """
    if dry_run:
        return f"{DRY_RUN_PREFIX}{SEPARATOR}{train_run_name(recipe, profile, overrides)}"
    tail = SEPARATOR.join((_stem(recipe), _stem(profile)))
    short = " ".join(short_overrides(mask_text(overrides)))
    if not short:
        return tail
    room = MAX_NAME_CHARS - len(SEPARATOR) - len(tail)
    head = short if len(short) <= room else short[:max(room - 1, 0)] + "…"
    return f"{head}{SEPARATOR}{tail}"


def override_tokens(overrides: str) -> list[str]:
    """The ``key=value`` overrides as given (shell-split, as the train step parses them)."""
    try:
        return shlex.split(overrides or "")
    except ValueError:
        return (overrides or "").split()


def short_overrides(overrides: str) -> list[str]:
    """Each override with its key cut to the last segment(s) that still tell it apart (``data.seed=2`` → ``seed=2``)."""
    parsed = []
    for token in override_tokens(overrides):
        key, eq, value = token.partition("=")
        prefix = key[:len(key) - len(key.lstrip("+~"))]
        parsed.append((prefix, key[len(prefix):].split("."), eq + value))
    depth = {i: 1 for i in range(len(parsed))}
    for _ in range(8):  # lengthen the keys that still collide, a segment at a time
        shown = {i: ".".join(parsed[i][1][-depth[i]:]) for i in depth}
        clashing = [i for i in depth if list(shown.values()).count(shown[i]) > 1
                    and depth[i] < len(parsed[i][1])]
        if not clashing:
            break
        for i in clashing:
            depth[i] += 1
    return [f"{prefix}{'.'.join(segments[-depth[i]:])}{rest}" for i, (prefix, segments, rest) in enumerate(parsed)]


def train_run_description(recipe: str, profile: str, overrides: str, *, dry_run: bool = False) -> str:
    """The run's description (Markdown): the recipe, the profile and every override in full."""
    what = "Dry run (the verl command composed and checked, nothing trained): recipe" if dry_run else "Recipe"
    lines = [f"{what} `{_stem(recipe)}` on device profile `{_stem(profile)}`"]
    tokens = override_tokens(mask_text(overrides))
    if not tokens:
        return lines[0] + ", no overrides."
    return "\n".join([lines[0] + ", with overrides:", "", *(f"- `{token}`" for token in tokens)])


def _stem(name: str) -> str:
    tail = name.replace("\\", "/").rsplit("/", 1)[-1]
    return tail.rsplit(".", 1)[0] if tail.endswith((".yaml", ".yml")) else tail


def is_generated_name(name: str | None) -> bool:
    """Whether ``name`` is one MLflow made up for an unnamed run (``<predicate>-<noun>-<number>``)."""
    if not name:
        return True
    parts = name.split("-")
    if len(parts) != 3 or not parts[2].isdigit():
        return False
    words = compat_mlflow.generated_name_words()
    if words is None:
        return parts[0].isalpha() and parts[1].isalpha()
    return parts[0] in words[0] and parts[1] in words[1]


def name_train_run(run_id: str, recipe: str, profile: str, overrides: str = "", *, dry_run: bool = False) -> str:
    """Give a train run its descriptive name (unless it has a real one) and description; return its name."""
    client = LockRetryingClient()
    run = client.get_run(run_id)
    if not run.data.tags.get(MLFLOW_RUN_NOTE):  # a description someone wrote is kept
        client.set_tag(run_id, MLFLOW_RUN_NOTE, train_run_description(recipe, profile, overrides, dry_run=dry_run))
    current = run.info.run_name
    if not (is_generated_name(current) or current in STEP_PLACEHOLDERS):
        return current
    name = train_run_name(recipe, profile, overrides, dry_run=dry_run)
    client.update_run(run_id, name=name)
    return name


def name_train_run_or_warn(run_id: str, recipe: str, profile: str, overrides: str = "", *, tries: int = 3,
                           pause_s: float = 1.0, dry_run: bool = False) -> str | None:
    """:func:`name_train_run`, tried again after a server error, then a warning: a name is not worth a run.

    A flaky server's 500s on the naming calls (three in a row outlast a training's short request retries)
    failed the whole train run, which kept its random name.
    """
    from mlflow.exceptions import MlflowException

    for attempt in range(tries):
        try:
            return name_train_run(run_id, recipe, profile, overrides, dry_run=dry_run)
        except MlflowException as exc:
            if attempt + 1 == tries:
                log.warning("could not name train run %s (%s): it keeps its generated name", run_id,
                            str(exc).splitlines()[0][:200])
                return None
            time.sleep(pause_s * (attempt + 1))
    return None


def model_ref(model_uri: str) -> str:
    """A model reference short enough for a name column: ``@challenger``, ``v3``, ``run 5d1e0a2b``, a folder's name."""
    uri = model_uri.strip().rstrip("/")
    if uri.startswith("models:/"):
        rest = uri.removeprefix("models:/")
        if "@" in rest:
            return "@" + rest.rsplit("@", 1)[1]
        name, _, version = rest.rpartition("/")
        return f"v{version}" if name and version.isdigit() else rest
    if uri.startswith("runs:/"):
        return f"run {uri.removeprefix('runs:/').split('/', 1)[0][:8]}"
    return _stem(uri) or uri


def evaluate_run_name(model_uri: str, problems: int) -> str:
    """A standalone evaluation's name: ``evaluate · @challenger · 200`` (what, then on how many problems)."""
    return SEPARATOR.join(("evaluate", model_ref(model_uri), str(problems)))


def main_run_name(model_name: str, started: float | None = None) -> str:
    """The pipeline's name: ``main · <model> · <local time>`` (two mains differ at a glance by model and time)."""
    return SEPARATOR.join(("main", model_name, time.strftime("%m-%d %H:%M", time.localtime(started))))


def register_run_name(model_name: str, version: str | int | None = None) -> str:
    """A standalone register's name: ``register · <model> v<N>`` once the version is known."""
    return SEPARATOR.join(("register", f"{model_name} v{version}" if version else model_name))


def promote_run_name(model_name: str, alias: str) -> str:
    """A standalone promote's name: ``promote · <model> @<alias>``."""
    return SEPARATOR.join(("promote", f"{model_name} @{alias}"))


REFUSED_REASON_CHARS = 60


def refused_run_name(step: str, reason: str, verdict: str = "refused") -> str:
    """``<step> · refused: <what was wrong>``: a run ``mlflow run`` opened for a step that refused its input;
    ``verdict`` "failed" for a step that failed on good input (out of memory): ``<step> · failed: <what>``."""
    what = reason.split(": ", 1)[0].strip()
    what = what if len(what) <= REFUSED_REASON_CHARS else what[:REFUSED_REASON_CHARS - 1] + "…"
    return SEPARATOR.join((step, f"{verdict}: {what}"))


def name_refused_run(step: str, reason: str, verdict: str = "refused", run_id: str | None = None) -> None:
    """Under ``mlflow run`` a step that refused its input leaves the run MLflow made (``skittish-sow-161``, ended
    FAILED): name it for the step and the reason, tag the reason. ``verdict``: "failed" when the input was good and
    the work failed (out of memory, a full disk), not a refusal. ``run_id``: the run to name (default
    ``MLFLOW_RUN_ID``; MLflow unsets the variable when a step's run ends, so the command line passes what it read
    at start, and a step names the unnamed run it opened and failed).

    One short try (the store may be why it refused); a run with a real name is left as it is.
    """
    import os

    from verlflow.names import ERROR_TAG
    from verlflow.outage.metric_buffer import WRITER_HTTP_KNOBS, bounded_http

    run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    try:
        with bounded_http(WRITER_HTTP_KNOBS):
            client = LockRetryingClient()
            run = client.get_run(run_id)
            if not is_generated_name(run.info.run_name):
                return
            client.update_run(run_id, name=refused_run_name(step, reason, verdict))
            if not run.data.tags.get(ERROR_TAG):
                client.set_tag(run_id, ERROR_TAG, mask_text(reason)[:5000])
    except Exception as exc:  # a name is not worth a second error line
        log.debug("could not name the refused run %s: %s", run_id, exc)


def compare_runs_link(tracking_uri: str, experiment_ids: Sequence[str], run_ids: Sequence[str]) -> str:
    """Where MLflow's compare-runs page for ``run_ids`` is, for a reader of the report.

    An http(s) tracking server: the page's URL, on the server's own address. Any other store (SQLite
    file, folder): the ``mlflow ui --backend-store-uri …`` command to start, then the page's path to open
    on the address it prints (its port is whatever ``mlflow ui`` chose, so none is assumed).
    """
    from verlflow.tracking.ui_links import compare_route

    page = f"#{compare_route(experiment_ids, run_ids)}"  # in the Model-training view, as every printed link
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page}"
    return f"mlflow ui --backend-store-uri '{tracking_uri}', then open /{page} on the address it prints"
