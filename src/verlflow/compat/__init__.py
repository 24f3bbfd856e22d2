"""Other libraries' private names and the patches of their namespaces, each behind one accessor: the one place
an upgrade of verl, MLflow, Optuna, Ray, OmegaConf or transformers is checked (tests/test_private_names.py
fails on a private name of theirs used anywhere else).

- :mod:`.verl`: param flattening and key sanitizer; the rehearsal's task runner, trainer swap, resume branch,
  registries and raise sites; the CPU plugin's and the secret guard's ``patch_*`` / ``register_*``;
- :mod:`.mlflow`: the system-metrics monitor's client, a run's latest metric steps, alias-name rules, the
  words of made-up run names;
- :mod:`.optuna`: the heartbeat base class of the search's journal storage;
- :mod:`.verl_traces`: prompt, response, reward and step on the root span of verl's rollout traces;
- :mod:`.ray`: the class behind a ``@ray.remote`` actor, the logger of its token-auth notice;
- :mod:`.omegaconf`: a config node's full key and unresolved children;
- :mod:`.transformers`: a loaded model's attention kernel.

Every accessor says the versions it was checked on and what happens where the name is gone.
"""
