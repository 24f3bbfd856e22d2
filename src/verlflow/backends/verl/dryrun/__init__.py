"""verl's dry run: will verl start, and what will it say? Every check in one place, run before a launch.

- :mod:`.checks`: the registry: each check by the name docs/preflight.md gives it, its group and what it
  needs (config, verl, files, devices, cluster);
- :mod:`.rehearsal`: verl's own start-up built with the installed verl's code (its stages: the
  ``rehearsal`` group): the names verl resolves, validation and dataclasses, the first step on a dummy batch,
  the rollout side, the engine on the meta device, the datasets, reward and resume branch;
- :mod:`.preflight`: the ``launch`` group, run by :func:`.preflight.launch_problems`: the rehearsal first,
  then the rules for what it cannot reach (one line per key, the first check's): :mod:`.startup_checks`
  (batch arithmetic for the profile's world size, the vLLM engine's bounds, loss names) and
  :mod:`.startup_loads` (what verl imports or asks Ray for on the nodes: strategy packages, devices, the
  reward file, the warnings);
- :mod:`.keys`: verl's config sections and the one key reader.
"""
