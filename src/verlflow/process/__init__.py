"""Which process owns an MLflow run: its heartbeat, a dead owner's reaping, the lease on a resume, the launcher.

- :mod:`.lifecycle`: a run's process (host, pid, heartbeat); dead owners are reaped (``verlflow runs --reap``).
- :mod:`.lease`: one attempt at a time on a run (a param that only one writer can set).
- :mod:`.launcher_status`: an interrupted ``mlflow run``'s run kept KILLED.

:mod:`verlflow.processes` (the ``/proc`` reading) stays a top-level module: :mod:`verlflow.stopping`, which
the outage writer imports, needs it, and it must load without MLflow while a step starts.
"""
