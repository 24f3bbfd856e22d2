"""No shell from user text: every field that reaches the verl launch script arrives unchanged and runs nothing.

Each field a recipe, profile, override or run name can set — profile source files, preload libraries,
environment values and names, the output folder, the experiment and run names, override values (plain and
secret), the launch module's path, the Ray job's entrypoint and address — is given a value holding ``'``,
``"``, ``$()``, backticks, ``;``, newlines and globs that would each create a ``PWNED_*`` file if a shell ran
them. The generated script is run for real with bash (the launch module is a printer standing in for verl);
no such file may appear, and verl's argv and environment must hold the values exactly.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from verlflow import config
from verlflow.backends.verl.command import build_plan
from verlflow.backends.verl.launch import launch_env, ray_job_spec, ray_submit_command
from verlflow.errors import VerlflowError
from verlflow.secrets import mask_env

# The issue's own case: a source file whose name closes the echo line's quotes (ran 26 s after launch).
ISSUE_PAYLOAD = "/nonexist'$(touch PWNED_issue)'"
RUN_ID = "feedfacefeedfacefeedfacefeedface"
PRINTER = """import json, os, sys
print("ARGV_JSON=" + json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}))
"""


def evil(tag: str) -> str:
    """A value every shell splice would execute: quote breaks, substitutions, separators, a newline, globs."""
    return (f"{tag}'\"$(touch PWNED_{tag}_dollar)`touch PWNED_{tag}_tick`;touch PWNED_{tag}_semi\n"
            f"touch PWNED_{tag}_newline\n' ; touch PWNED_{tag}_quote ; echo '* ? [a] ~ \\ ! ${{HOME}}")


def _plan(tmp_path: Path):
    """A real composed plan with every user-settable field holding a payload (folders for paths made first)."""
    out_root = tmp_path / evil("dir").replace("/", "_")
    printer_dir = tmp_path / evil("mod").replace("/", "_")
    printer_dir.mkdir(parents=True)
    (printer_dir / "printer.py").write_text(PRINTER)
    cfg = config.compose("tiny", "h20", "trainer.n_gpus_per_node=1")
    cfg = replace(cfg, verlflow=replace(cfg.verlflow, output_dir=str(out_root),
                                        launch_module=str(printer_dir / "printer.py")),
                  overrides={**cfg.overrides, "+trainer.user_note": evil("override"),
                             "+trainer.wandb_password": evil("secretvalue")},
                  profile=replace(cfg.profile, env={"SAFE_VALUE": evil("envval")},
                                  source_files=[ISSUE_PAYLOAD, evil("src")], preload=[evil("lib")]))
    plan = build_plan(cfg, run_id=RUN_ID, experiment_name=evil("experiment"), run_name=evil("runname"),
                      tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return plan


def _printed(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("ARGV_JSON="))
    return json.loads(line.removeprefix("ARGV_JSON="))


def _as_hydra_reads(words: list[str]) -> dict:
    """Each ``key=value`` word as verl's Hydra parses it (the value verl's config gets)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(words)}
    # OmegaConf reads Hydra's escaped ``\${…}`` back as the literal text.
    return {k: OmegaConf.create({"v": v}).v if isinstance(v, str) and "${oc.env" not in v else v
            for k, v in parsed.items()}


def _pwned(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("PWNED_*"))


def test_every_field_reaches_the_local_launch_unchanged_and_runs_nothing(tmp_path):
    plan = _plan(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(["bash", "-c", plan.script()], env=launch_env(plan), cwd=work, capture_output=True,
                          text=True, timeout=120)
    assert _pwned(tmp_path) == [], done.stderr
    assert done.returncode == 0, done.stderr
    got = _printed(done.stdout)
    assert got["argv"] == plan.argv()[2:]  # python, printer.py, then every Hydra override word as composed
    hydra = _as_hydra_reads(got["argv"][1:])
    assert hydra["trainer.experiment_name"] == evil("runname") and hydra["trainer.project_name"] == evil("experiment")
    assert hydra["trainer.user_note"] == evil("override")
    assert got["env"]["SAFE_VALUE"] == evil("envval")
    # The secret reaches verl through the environment only: its argv names the variable.
    assert evil("secretvalue") not in " ".join(got["argv"]) and evil("secretvalue") not in plan.script()
    assert "+trainer.wandb_password=${oc.env:VERLFLOW_SECRET_0}" in got["argv"]
    assert got["env"]["VERLFLOW_SECRET_0"] == evil("secretvalue")
    assert f"verlflow: {evil('src')} not found, not sourced" in done.stderr
    assert f"verlflow: {evil('lib')} not found, not preloaded" in done.stderr


def test_the_ray_entrypoint_and_submit_line_carry_every_field_unchanged(tmp_path):
    plan = _plan(tmp_path)
    spec = ray_job_spec(replace(plan, python=sys.executable), run_id=RUN_ID)
    # Ray runs the entrypoint with a shell, in its own working directory, with runtime_env's variables.
    work = tmp_path / "ray-work"
    work.mkdir()
    env = {**os.environ, **spec["runtime_env"]["env_vars"]}
    done = subprocess.run(spec["entrypoint"], shell=True, env=env, cwd=work, capture_output=True, text=True,
                          timeout=120)
    assert _pwned(tmp_path) == [], done.stderr
    assert done.returncode == 0, done.stderr
    got = _printed(done.stdout)
    assert got["argv"][1:] == plan.argv()[3:]  # python3 is the cluster's; the words after it are ours
    assert got["env"]["SAFE_VALUE"] == evil("envval") and got["env"]["VERLFLOW_SECRET_0"] == evil("secretvalue")
    assert Path(os.getcwd()) != plan.run_dir and plan.run_dir.is_dir()  # the entrypoint made and entered it
    address = "http://head:8265/" + evil("address")
    words = shlex.split(ray_submit_command(spec, address, mask=mask_env))
    assert words[words.index("--address") + 1] == address
    assert words[words.index("--") + 1:] == shlex.split(spec["entrypoint"])
    assert evil("secretvalue") not in " ".join(words)


def test_a_profile_env_name_bash_cannot_export_is_one_line(tmp_path):
    cfg = config.compose("tiny", "h20", f"verlflow.output_dir={tmp_path}")
    cfg = replace(cfg, profile=replace(cfg.profile, env={"OK": "1", "X;touch PWNED_name;Y": "1"}))
    with pytest.raises(VerlflowError, match=r"profile.env name 'X;touch PWNED_name;Y' is not an environment "
                                            r"variable name"):
        build_plan(cfg, run_id=RUN_ID, experiment_name="e", run_name="r", tracking_uri="sqlite:///mlflow.db")
