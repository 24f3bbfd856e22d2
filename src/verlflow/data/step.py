"""The preprocess step: GSM8K (hub, local files or synthetic) → verl's parquet, inside a tracked run.

    mlflow run . --env-manager local -e preprocess -P source=synthetic
"""

from __future__ import annotations

from pathlib import Path

import mlflow

from verlflow import tracking
from verlflow.data.gsm8k import check_text_source, preprocess
from verlflow.errors import VerlflowError
from verlflow.input_checks import check_output_dir
from verlflow.names import DATA_DIR_TAG, STEP_TAG


def run_preprocess(source: str, output_dir: str, limit: int):
    """Preprocess GSM8K into verl's parquet format inside a tracked run (step ``preprocess``)."""
    if limit < 0:
        raise VerlflowError(f"limit must be 0 (all rows) or a positive row count, got {limit}")
    check_output_dir(output_dir, "output_dir")
    check_text_source(source)
    with tracking.tracked_run(tags={STEP_TAG: "preprocess"}):
        result = preprocess(source, output_dir, limit)
        mlflow.set_tag(DATA_DIR_TAG, str(Path(result.output_dir).resolve()))
    print(f"preprocess: {result.num_train} train / {result.num_test} test rows → {result.output_dir}")
    return result
