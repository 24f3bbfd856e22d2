"""The verl backend: the guide's recipe launched through verl itself, inside verlflow's MLflow run.

Read :mod:`.backend` (``train_verl``) top to bottom: :mod:`.command` turns the composed config into the exact
launch (overrides, environment, bash script); :mod:`.preflight` lists every reason it cannot work here;
:mod:`.launch` runs it (locally or as a Ray job); :mod:`.merge` turns the last checkpoint into a Hugging Face
folder; :mod:`.traces` links verl's rollout traces to the run; :mod:`.ray_cluster` checks a Ray cluster before
a launch goes to it. :mod:`.cpu`, :mod:`.cpu_plugin` and
:mod:`.cpu_rollout` let verl's own trainer run on a CPU (tests, ``-P backend=verl -P device=cpu``).
"""
