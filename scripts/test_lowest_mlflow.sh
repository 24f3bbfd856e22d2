#!/usr/bin/env bash
# The suite's fast tests again at the lowest MLflow verlflow supports (CI runs it after the main suite):
#     bash scripts/test_lowest_mlflow.sh [pytest args]
#
# A second venv, .venv-mlflow-lowest, installed like the README's .venv (a current pip, the CPU torch wheel)
# but against constraints-mlflow-lowest.txt: the same dev install with MLflow at pyproject.toml's lower bound.
# Only the fast tests (`-m "not slow"`): the slow ones exercise verl and training, not more of MLflow's API.
# Its exit status is pytest's, so a failure here fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-mlflow-lowest
.venv-mlflow-lowest/bin/python -m pip install -q -U pip
.venv-mlflow-lowest/bin/python -m pip install -q torch==2.13.0 -e ".[dev]" -c constraints-mlflow-lowest.txt
.venv-mlflow-lowest/bin/python -c "import mlflow; print('lowest MLflow:', mlflow.__version__)"
exec .venv-mlflow-lowest/bin/python -m pytest -m "not slow" "$@"
