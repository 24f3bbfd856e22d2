"""Preprocessing inside a tracked run: GSM8K (hub, local files or synthetic) → verl's parquet, its folder tagged.

    mlflow run . --env-manager local -e preprocess -P source=synthetic     # → data/synthetic
"""

from __future__ import annotations

from pathlib import Path

from verlflow.data.gsm8k import check_text_source, default_output_dir, preprocess
from verlflow.errors import VerlflowError
from verlflow.names import DATA_DIR_TAG, STEP_TAG
from verlflow.tracking import tracking, writes
from verlflow.util import check_output_dir


def preprocess_in_run(source: str, output_dir: str, limit: int, *, own_run: bool = False,
                      parent_run_id: str | None = None, run_id: str | None = None):
    """Preprocess GSM8K into verl's parquet format inside a tracked run (what step ``preprocess`` does).

    ``output_dir=""`` is the source's default folder, ``data/<source>``, where ``main`` puts it and the
    other steps look for it (``verlflow.data.recipe_data``). ``own_run``: a step preparing its own
    data opens a new run (a child of ``parent_run_id`` when given) and logs these parameters itself, as
    ``mlflow run`` would have. ``run_id``: the run to log into, already created (by ``main``).
    """
    if limit < 0:
        raise VerlflowError(f"limit must be 0 (all rows) or a positive row count, got {limit}")
    output_dir = output_dir or str(default_output_dir(source))
    check_output_dir(output_dir, "output_dir")
    check_text_source(source)
    with tracking.tracked_run(run_name="preprocess" if own_run else None, parent_run_id=parent_run_id,
                              run_id=run_id, tags={STEP_TAG: "preprocess"}):
        if own_run:
            writes.log_params({"source": source, "output_dir": output_dir, "limit": limit})
        result = preprocess(source, output_dir, limit)
        writes.set_tag(DATA_DIR_TAG, str(Path(result.output_dir).resolve()))
    print(f"preprocess: {result.num_train} train / {result.num_test} test rows → {result.output_dir}")
    return result
