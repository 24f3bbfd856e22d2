"""MLflow runs as processes: who owns one, naming, resuming, reaching the server, buffering metrics.

- :mod:`.lifecycle`: a run's process (host, pid, heartbeat); signals end it KILLED; dead owners are reaped.
- ``verlflow runs`` (:mod:`verlflow.steps.runs`) lists RUNNING runs via :mod:`.lifecycle`; ``--reap`` ends dead ones.
- :mod:`.probe`: fail fast on an unreachable tracking server, before a step opens a run.
- :mod:`.deadline`: short MLflow requests and a total deadline on every wait on the server (a hung server).
- :mod:`.metric_buffer`: per-step metrics through a background writer process that survives a server outage.
- :mod:`.writer_handle`: the trainer's side of that writer process; :mod:`.metric_writer`: the writer's side.
- :mod:`.spill`: what an outage left on disk (or an artifact store refused), and its upload.
- :mod:`.rollout_traces`: the local trainer's rollout traces as writer records (spilled and replayed like metrics).
- :mod:`.summaries`: a run's end-of-run timing figures from the timings its writer saw (or its history).
- :mod:`.naming`: descriptive train run names and compare links.
- :mod:`.resume`: continue a train run in place from its last checkpoint.
- :mod:`.logged_models`: a train run's checkpoints as MLflow LoggedModels, linked to the run at their step.
- :mod:`.launcher_status`: an interrupted ``mlflow run``'s run kept KILLED (the launcher: :mod:`verlflow.processes`).

Opening and closing a tracked run itself is :mod:`verlflow.runs.tracking`.
"""
