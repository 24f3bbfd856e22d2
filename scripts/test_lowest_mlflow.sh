#!/usr/bin/env bash
# The fast tests that reach MLflow's API, again at the lowest MLflow verlflow supports (CI runs it after the main
# suite):
#     bash scripts/test_lowest_mlflow.sh [pytest args]
#
# A second venv, .venv-mlflow-lowest, that holds only what the lowest MLflow's pin changes: every package whose
# version in constraints-mlflow-lowest.txt differs from constraints.txt (MLflow, and what its pin forces: pandas,
# pyarrow, sqlalchemy, protobuf, ...), installed without dependencies. Everything else (torch, verl, ray, the
# editable verlflow) is the README's .venv, put after the venv's own site-packages by a .pth file, so a package
# installed here wins over the main venv's and nothing is installed twice. The packages are installed before that
# .pth exists, so pip never sees (nor tries to uninstall) the main venv's versions.
#
# The tests are chosen by what they use (`mlflow_api`, applied by tests/conftest.py: the test's module or body
# imports mlflow, or one of its fixtures opens a tracking store), and only the fast ones: the slow ones exercise
# verl and training, not more of MLflow's API. On both cores, as the main suite. Its exit status is pytest's,
# so a failure here fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
main_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
venv=.venv-mlflow-lowest
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -U pip
changed=$(.venv/bin/python scripts/pins_that_differ.py constraints.txt constraints-mlflow-lowest.txt)
# shellcheck disable=SC2086  # one requirement per word
"$venv/bin/python" -m pip install -q --no-deps $changed
lowest_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf 'import site; site.addsitedir(%s)\n' "'$main_site'" > "$lowest_site/zz_main_venv.pth"
"$venv/bin/python" -c "import mlflow, verlflow, torch; print('lowest MLflow:', mlflow.__version__, 'beside torch', torch.__version__)"
exec "$venv/bin/python" -m pytest -n 2 --dist loadfile -m "mlflow_api and not slow" "$@"
