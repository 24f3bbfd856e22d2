"""Models: the tiny offline ones, where a model path or URI points, evaluation, the registry.

- :mod:`.tinymodel`, :mod:`.tinymodel_sft`: a tiny Qwen3 + tokenizer built offline, untrained or warm-started.
- :mod:`.model_path`: a recipe's model path → a folder or hub id (builds the tiny ones on demand, cached).
- :mod:`.model_uri`: ``models:/…`` / ``runs:/…`` / folder → what to load and the train run behind it.
- :mod:`.evaluate`: the ``evaluate`` step — GSM8K accuracy with verl's scorer, logged as a run.
- :mod:`.registry`: the ``register`` and ``promote`` steps — versions, lineage tags, the ``champion`` alias.
"""
