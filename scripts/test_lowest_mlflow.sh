#!/usr/bin/env bash
# The fast tests that reach MLflow's API, again at the lowest MLflow verlflow supports (CI runs it after the main
# suite):
#     bash scripts/test_lowest_mlflow.sh [pytest args]
#
# A second venv, .venv-mlflow-lowest, installed like the README's .venv (a current pip, the CPU torch wheel)
# but against constraints-mlflow-lowest.txt: the same dev install with MLflow at pyproject.toml's lower bound.
# The tests are chosen by what they use (`mlflow_api`, applied by tests/conftest.py: the test's module or body
# imports mlflow, or one of its fixtures opens a tracking store), and only the fast ones: the slow ones exercise
# verl and training, not more of MLflow's API. On both cores, as the main suite. Its exit status is pytest's,
# so a failure here fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-mlflow-lowest
.venv-mlflow-lowest/bin/python -m pip install -q -U pip
.venv-mlflow-lowest/bin/python -m pip install -q torch==2.13.0 -e ".[dev]" -c constraints-mlflow-lowest.txt
.venv-mlflow-lowest/bin/python -c "import mlflow; print('lowest MLflow:', mlflow.__version__)"
exec .venv-mlflow-lowest/bin/python -m pytest -n 2 --dist loadfile -m "mlflow_api and not slow" "$@"
