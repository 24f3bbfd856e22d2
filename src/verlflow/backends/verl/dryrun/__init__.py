"""verl's dry run: will verl start, and what will it say? Every check in one place, run before a launch.

- :mod:`.checks`: the registry: each check by the name docs/preflight.md gives it, its group and what it
  needs (config, verl, files, devices, cluster);
- :mod:`.rehearsal`: verl's own start-up built with the installed verl's code (registered first: the
  ``rehearsal`` group), the first step on a dummy batch, the rollout side, the engine on the meta device;
- :mod:`.preflight`: the ``launch`` group, run by :func:`.preflight.launch_problems` (the rehearsal among
  them), with the rules for what the rehearsal cannot build here: :mod:`.startup_checks` (batch arithmetic
  for the profile's world size, the vLLM engine's bounds, loss names) and :mod:`.startup_loads` (what verl
  imports or asks Ray for on the nodes: strategy packages, devices, the reward file, the warnings);
- :mod:`.keys`: verl's config sections and the one key reader.
"""
