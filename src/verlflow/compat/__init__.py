"""Other libraries' private names, each behind one accessor: the one place an upgrade of verl or MLflow is checked.

- :mod:`.verl`: verl's MLflow param flattening and metric-key sanitizer (no public equivalents).
- :mod:`.mlflow`: the client MLflow's system-metrics monitor writes through.

Every accessor says the versions it was checked on and what happens where the name is gone. (The rest of the
code base's private-name uses move here in later steps.)
"""
