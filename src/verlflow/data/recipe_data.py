"""Where a recipe's data lives, and getting it there before a step opens its run.

    python -c "from verlflow.data.recipe_data import default_data_dir; print(default_data_dir('synthetic-easy'))"

``main`` preprocesses the recipe's ``data_source`` into ``data/<source>`` (``data/synthetic-easy`` for the
smoke recipe, ``data/openai-gsm8k`` for the guide's), and so does ``preprocess`` with its default
``output_dir``. ``train``, ``search`` and ``evaluate`` with no ``data_dir`` look in that same folder, so any
step run after ``main`` finds its data. When the folder lacks a split:

- the recipe's source can be made here (``synthetic*``, or a local folder): the step preprocesses it
  first, as ``main`` would, in a ``preprocess`` run of its own (a FINISHED one of the same source whose data
  is still on disk is reused instead);
- otherwise (the hub): the step stops before any run is opened, with the command that prepares it.
"""

from __future__ import annotations

from pathlib import Path

from verlflow.data.fix_commands import preprocess_command
from verlflow.data.gsm8k import default_output_dir
from verlflow.errors import VerlflowError
from verlflow.names import DATA_DIR_TAG, STEP_TAG

SPLITS = ("train", "test")


def default_data_dir(source: str) -> Path:
    """``data/<source>``: where ``main`` and ``preprocess`` put a source's splits (``/`` and the like → ``-``)."""
    return default_output_dir(source)


def recipe_block(recipe: str, overrides: str = ""):
    """The recipe's ``verlflow:`` block after ``verlflow.*`` overrides, without composing verl's config."""
    from verlflow.config import OWN_PREFIX, load_recipe, parse_overrides, with_overrides

    _, block, _ = load_recipe(recipe)
    own = {k.removeprefix(OWN_PREFIX): v for k, v in parse_overrides(overrides).items() if k.startswith(OWN_PREFIX)}
    return with_overrides(block, own, what="recipe", prefix=OWN_PREFIX)


def recipe_source(recipe: str, overrides: str = "") -> str:
    """The recipe's ``verlflow.data_source`` after ``verlflow.*`` overrides, without composing verl's config."""
    from verlflow.config import VerlflowBlock

    # An empty data_source in a recipe means the default, as an absent one does (as in ``main``).
    return recipe_block(recipe, overrides).data_source or VerlflowBlock.data_source


def missing_splits(data_dir: str | Path, splits: tuple[str, ...] = SPLITS) -> list[str]:
    """The splits of ``splits`` that ``data_dir`` has no ``<split>.parquet`` for."""
    return [s for s in splits if not (Path(data_dir) / f"{s}.parquet").is_file()]


def can_prepare(source: str) -> bool:
    """Whether this machine can make the source's splits itself: synthetic data or an existing local folder."""
    from verlflow.data.gsm8k import SYNTHETIC

    return source.startswith(SYNTHETIC) or Path(source).expanduser().is_dir()


def step_data_dir(data_dir: str, source: str, *, splits: tuple[str, ...] = SPLITS) -> str:
    """The data folder a step uses: ``data_dir``, or the recipe's (prepared here when it can be).

    An explicit ``data_dir`` is used as given; when it lacks a split the error names the command that
    fills it. With ``data_dir=""`` the recipe's folder (:func:`default_data_dir` of ``source``) is
    returned as an absolute path, after preprocessing it when it is missing and ``source`` allows;
    a hub source that is missing stops here, before the step opens a run.
    """
    if data_dir:
        if missing := missing_splits(data_dir, splits):
            raise VerlflowError(f"data_dir '{data_dir}' has no {missing[0]}.parquet: run "
                                f"`{preprocess_command(source, data_dir)}` first")
        return data_dir
    folder = default_data_dir(source)
    if not (missing := missing_splits(folder, splits)):
        return str(folder.resolve())
    if not can_prepare(source):
        raise VerlflowError(f"no {missing[0]}.parquet in {folder} (the recipe's data_source '{source}' is not "
                            f"prepared here): run `{preprocess_command(source, folder)}` first, or pass "
                            "-P data_dir=<folder with train.parquet and test.parquet>")
    if reused := find_prepared(source, splits):
        print(f"data: using {reused} (FINISHED preprocess run of source '{source}')")
        return reused
    print(f"data: {folder} has no {missing[0]}.parquet: preparing the recipe's data (source '{source}') there")
    return prepare(source, folder)


def find_prepared(source: str, splits: tuple[str, ...] = SPLITS) -> str | None:
    """The folder of the newest FINISHED full ``preprocess`` run of ``source`` in this experiment, if still on disk.

    Any such run's splits are that source's data; a train run still tells data apart by its digest.
    """
    from verlflow.tracking.lookups import newest_runs
    from verlflow.util import filter_quote

    query = (f"tags.`{STEP_TAG}` = 'preprocess' and attributes.status = 'FINISHED' "
             f"and params.source = '{filter_quote(source)}' and params.limit = '0'")
    for run in newest_runs(query, max_results=50):
        folder = run.data.tags.get(DATA_DIR_TAG, "")
        if folder and not missing_splits(folder, splits):
            return folder
    return None


def prepare(source: str, folder: Path) -> str:
    """Preprocess ``source`` into ``folder`` in a ``preprocess`` run of its own; the folder, absolute.

    Under ``mlflow run -e <step>`` the step's run already exists (``MLFLOW_RUN_ID``): the preprocess run
    becomes its child instead of attaching to it.
    """
    from verlflow.data.preprocess_run import preprocess_in_run
    from verlflow.tracking import lookups

    step_run = lookups.launched_run_id()  # the step's own run under mlflow run: the new run's parent
    result = preprocess_in_run(source=source, output_dir=str(folder), limit=0, own_run=True, parent_run_id=step_run)
    if step_run:
        # MLflow's end_run (of the preprocess run) unsets MLFLOW_RUN_ID; without it the step itself would open a
        # new run instead of attaching to the one `mlflow run` made for it.
        lookups.keep_launched_run(step_run)
    return str(Path(result.output_dir).resolve())
