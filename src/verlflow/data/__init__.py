"""GSM8K in verl's parquet format: where the rows come from and the step that writes them.

- :mod:`.gsm8k`: load GSM8K (the hub, a local folder of jsonl/parquet, or synthetic problems), turn rows into
  verl's format (prompt, reward_model.ground_truth, extra_info), write the splits, digest their content.
- :mod:`.synthetic`: GSM8K-shaped arithmetic problems generated offline (tests, demos, the smoke recipe).
- :mod:`.step`: the ``preprocess`` step, which runs the above inside a tracked MLflow run.
"""
