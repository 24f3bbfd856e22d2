"""The ``compare`` step: an A3 run against an H20 run the way the guide's §6 does, from the runs alone.

    mlflow run . --env-manager local -e compare -P baseline=<h20 run> -P candidate=<a3 run>

:mod:`.step` reads both runs once into :class:`~.snapshot.RunSnapshot` objects; everything after that is
computation on snapshots: :mod:`.diff` (which settings differ and why), :mod:`.report` (§6.1 versions, §6.3
time ratios, parity, the Markdown), :mod:`.plots` (§6.2 curves, drawn in :mod:`.plot_worker`'s process),
:mod:`.utilisation` (§6.4 device use).
"""
