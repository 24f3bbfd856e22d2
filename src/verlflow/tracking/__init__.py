"""MLflow runs as the steps see them: opening and ending them, naming, experiments, reuse, resume, lookups.

- :mod:`.tracking`: open and end a tracked run (a stop ends it KILLED), params and metrics as verl logs them,
  device tags, lookups of runs; :mod:`.run_logger`: the interface a backend's runs log through.
- :mod:`.naming`: descriptive train run names and compare links; :mod:`.ui_links`: the MLflow UI pages a step prints.
- :mod:`.experiments`: which experiment a training step logs into; :mod:`.reuse`: the pipeline's child runs, reused.
- :mod:`.resume`: continue a train run in place from its last checkpoint (its lease: :mod:`verlflow.process.lease`).
- :mod:`.profiling`: profiled steps' traces and summary tables (:mod:`.ascend_profile`: torch_npu's databases).
- :mod:`.lookups` / :mod:`.writes`: what other packages read from / write into the store, each a named function,
  so that only the store's own packages import MLflow (tests/test_mlflow_imports.py);
  :mod:`.system_metrics`: the bridge to MLflow's system-metrics monitor.

Below it: :mod:`verlflow.outage` (what keeps tracking going while the server is away) and
:mod:`verlflow.process` (which process owns a run); neither imports this package.
"""
