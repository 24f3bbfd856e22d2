"""Optuna searches over learning rate, KL coefficient and group size; each trial a nested MLflow run.

    mlflow run . --env-manager local -e search -P n_trials=4

- :mod:`.step`: the ``search`` step — opens the parent run, runs trials, registers the best.
- :mod:`.space`: the search config (objective, direction, sampler, pruner, space), typed and checked.
- :mod:`.study`: the Optuna side — storage (journal file or RDB), seeded sampler, pruners, the study.
- :mod:`.trial`: one trial — a child run that runs the real train step and reports to the pruner.
"""
