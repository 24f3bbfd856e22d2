"""Reaching a tracking server that may be slow, locked, refusing or away, and keeping what a run logs meanwhile.

- :mod:`.probe`: fail fast on an unreachable server; :mod:`.deadline`: short requests and a total deadline on
  every wait on it; :mod:`.store_retry`: writes ride out another writer's SQLite lock; :mod:`.auth_errors`: a
  401/403 as one line.
- :mod:`.metric_buffer`: per-step metrics through a background writer process that survives an outage
  (:mod:`.writer_handle`: the trainer's side; :mod:`.metric_writer`: the writer's side); :mod:`.spill`: what an
  outage left on disk, and its upload.
- What the writer (or a spill file's upload) writes besides points, so it lives here too: :mod:`.summaries`
  (end-of-run timing figures from the timings the writer saw), :mod:`.rollout_traces` (a step's traces) and
  :mod:`.logged_models` (a run's checkpoints as LoggedModels: a queued final model and a step's model link are
  replayed from a spill file). Keeping them here is what lets :mod:`verlflow.tracking` import this package
  and never the other way round.
"""
