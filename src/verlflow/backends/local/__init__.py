"""The local GRPO trainer: verl's GRPO math on one device (CPU by default), logged like a verl run.

Read :mod:`.trainer` top to bottom (setup → train → save → cleanup); :mod:`.step` runs one GRPO step and a
validation pass, :mod:`.run_record` writes the run's description, samples and final model. Per step it calls:
:mod:`.rollout` (prompts → sampled responses → rewards; :mod:`.sampling` draws tokens, :mod:`.decode` runs
Llama-family models fast while sampling), :mod:`.loss` (verl's advantages and PPO-clip loss, on
:mod:`.forward`'s group-packed forward passes), :mod:`.metrics` (verl's metric names). What it reads from
the composed config is :mod:`.settings`; models and optimizer :mod:`.models`; checkpoints :mod:`.checkpoint`.
"""
