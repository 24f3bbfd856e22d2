"""The preprocess command an error line prints, complete enough to paste: project, environment, experiment, folder.

    python -c "from verlflow.data.fix_commands import preprocess_command as p; print(p('synthetic', 'data/x'))"

A fix command without ``--experiment-name`` files its run in ``Default`` (MLflow cannot move it afterwards), and
one without ``-P output_dir`` writes where the failing step does not read: so every such line names both.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

# Where a fix's run is filed when the failing step's experiment is not known (the README's data experiment).
DATA_EXPERIMENT = "verlflow/data"
DEFAULT_SOURCE = "openai/gsm8k"


def fix_experiment() -> str:
    """The experiment a fix command names: the one the failing step runs in, else :data:`DATA_EXPERIMENT`."""
    if name := os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip():
        return name
    if (experiment_id := os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip()) and os.environ.get("MLFLOW_TRACKING_URI"):
        try:
            from verlflow.tracking.lookups import experiment_name

            return experiment_name(experiment_id)
        except Exception:  # a fix line must never fail on its way out
            pass
    return DATA_EXPERIMENT


def preprocess_command(source: str, output_dir: str | Path, experiment: str = "") -> str:
    """The complete command that writes ``source``'s splits into ``output_dir``."""
    return (f"mlflow run . --env-manager local --experiment-name {shlex.quote(experiment or fix_experiment())} "
            f"-e preprocess -P source={shlex.quote(source or DEFAULT_SOURCE)} "
            f"-P output_dir={shlex.quote(str(output_dir))}")
