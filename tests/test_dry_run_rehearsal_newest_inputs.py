"""The dry run's table on the installed (newest) verl, rows about what verl reads and builds: the model folder,
the data, the reward, the first step, the rollout side, the actor's engine on the meta device, the resume branch,
LoRA, the cluster's verl version.

The table, its folders and its shares are in tests/rehearsal_rows.py: one file a share of the row kinds, so the
suite's workers split the table (the other shares: the other test_dry_run_rehearsal_newest_*.py files);
tests/test_dry_run_rehearsal_guide.py runs rows on verl 0.5.0. A share's rows run in one subprocess (one
``cli.main`` each, a real SQLite store), computed once for the module.
"""

from __future__ import annotations

from rehearsal_checks import newest_share_tests

results, test_row = newest_share_tests("inputs")
