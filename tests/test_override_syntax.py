"""Override syntax mistakes are one line, and MLflow names reach verl exactly, whatever they hold.

    pytest tests/test_override_syntax.py

The names are checked on the launch script itself: bash runs it, the arguments verl would get are read back,
parsed by Hydra's own override parser and composed into verl's own ``ppo_trainer`` config.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import cli_in_process, every_experiment
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from verlflow import config
from verlflow.backends.verl.command import STDOUT_MARKER, build_plan
from verlflow.config import verl_config_dir
from verlflow.errors import EXIT_BAD_INPUT, VerlflowError

NAME_KEYS = ("trainer.project_name", "trainer.experiment_name")


@pytest.mark.parametrize(("overrides", "expected"), [
    ("trainer.experiment_name='my run", r"have an unbalanced quote: close every ' and \""),
    ('trainer.experiment_name="my run', r"have an unbalanced quote"),
    ("trainer.total_epochs=2 data.seed=1\\", r"end in a lone \\: write it as \\\\"),
    ("trainer.logger=[console,mlflow", r"\[console,mlflow is not a valid list: close its brackets"),
    ("actor_rollout_ref.model.override_config={a:1", r"is not a valid mapping"),
])
def test_an_override_syntax_error_is_one_line_naming_it(overrides, expected):
    with pytest.raises(VerlflowError, match=expected) as err:
        config.compose("smoke", "cpu", overrides)
    assert "\n" not in str(err.value)


def test_the_cli_refuses_an_unbalanced_quote_in_one_line_with_no_run(tmp_path, tracking_uri):
    done = cli_in_process(["train", "--device", "cpu", "--backend", "local", "--data_dir", str(tmp_path / "data"),
                           "--overrides", "trainer.experiment_name='my run"], cwd=tmp_path)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("verlflow train: error: overrides \"trainer.experiment_name='my run\" have an "
                               "unbalanced quote"), lines[0]
    assert MlflowClient().search_runs(every_experiment()) == []


NAMES = [
    "a3 run\\",                 # a trailing backslash (it used to escape Hydra's closing quote)
    "it's \"quoted\"",          # both quotes
    "lr=5e-7,n=5",              # = and , (Hydra's key/value and sweep separators)
    "cost $5 ${oc.env:HOME}",   # $ and an interpolation that must stay text
    "${trainer.nnodes}",        # nothing but an interpolation
    "back\\'slash \\${x}",      # backslashes before a quote and before ${
    "123",                      # a number as a name stays a string
    "Qwen3 GRPO/A3 对比",
]


def _launched_arguments(plan) -> list[str]:
    """The arguments verl's main_ppo would receive: the real launch script, run by bash, with python printing them."""
    argv = plan.argv()
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    printer = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *argv[3:]]
    done = subprocess.run(["bash", "-c", plan.script(printer, stdout_marker=True)], capture_output=True, text=True,
                          check=True, env={"PATH": "/usr/bin:/bin"})
    return json.loads(done.stdout.rpartition(STDOUT_MARKER + "\n")[2])


def test_experiment_and_run_names_reach_verl_exactly_whatever_they_hold(tmp_path):
    cfg = config.compose("qwen3-4b-gsm8k-grpo", "h20", f"verlflow.output_dir={tmp_path}")
    parser = OverridesParser.create()
    pairs = list(zip(NAMES, NAMES[1:] + NAMES[:1], strict=True))  # every name once as each of the two
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        for project, run_name in pairs:
            plan = build_plan(cfg, run_id="0" * 32, experiment_name=project, run_name=run_name,
                              tracking_uri="sqlite:///mlflow.db")
            items = [a for a in _launched_arguments(plan) if a.split("=", 1)[0] in NAME_KEYS]
            assert len(items) == 2, items
            parsed = {o.key_or_group: OmegaConf.create({"v": o.value()}).v for o in parser.parse_overrides(items)}
            assert parsed == {"trainer.project_name": project, "trainer.experiment_name": run_name}, items
            verl_cfg = hydra_compose(config_name="ppo_trainer", overrides=items)
            assert (verl_cfg.trainer.project_name, verl_cfg.trainer.experiment_name) == (project, run_name), items
    GlobalHydra.instance().clear()
