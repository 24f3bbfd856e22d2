"""MLproject, the console script, the entry-point files and the README all describe the same steps."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from verlflow.steps import STEPS, steps_markdown

ROOT = Path(__file__).resolve().parents[1]


def _mlproject() -> dict:
    return yaml.safe_load((ROOT / "MLproject").read_text())


def test_mlproject_declares_every_step_with_the_cli_parameters():
    entry_points = _mlproject()["entry_points"]
    assert list(entry_points) == list(STEPS)
    for name, step in STEPS.items():
        declared = entry_points[name]["parameters"]
        assert list(declared) == [p.name for p in step.params], name
        for p in step.params:
            default = declared[p.name].get("default")
            assert (None if default is None else str(default)) == p.default, f"{name}.{p.name}"
        command = entry_points[name]["command"]
        assert command.startswith(f"python entry_points/{name}.py ")
        assert all(f"--{p.name} {{{p.name}}}" in command for p in step.params), name


def test_entry_point_files_forward_to_their_step():
    for name in STEPS:
        text = (ROOT / "entry_points" / f"{name}.py").read_text()
        assert f'main(["{name}", *sys.argv[1:]])' in text


def test_entry_point_files_run_nothing_when_a_spawned_process_reimports_them(tracking_uri, capsys):
    # multiprocessing's spawn re-imports the parent's main script as __mp_main__ (the metric writer is such
    # a process); a step that ran again there would start a second run (or fail on pytest's own argv).
    for name in STEPS:
        namespace = runpy.run_path(str(ROOT / "entry_points" / f"{name}.py"), run_name="__mp_main__")
        assert callable(namespace["main"]), name  # the file was read, its step not run
    assert capsys.readouterr() == ("", "")
    client = MlflowClient()
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_the_entry_points_page_shows_the_generated_table_and_the_readme_links_it():
    assert steps_markdown() in (ROOT / "docs" / "entry-points.md").read_text()
    assert "(docs/entry-points.md)" in (ROOT / "README.md").read_text()


def test_every_mlflow_run_command_in_the_docs_uses_the_local_environment_and_names_its_experiment():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        run_lines = [line for line in page.read_text().splitlines()
                     if "mlflow run ." in line and "`mlflow run .`" not in line]
        assert all("--env-manager local" in line for line in run_lines), page
        assert all("--experiment-name" in line for line in run_lines), [line for line in run_lines
                                                                        if "--experiment-name" not in line]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_step_names_a_function_that_exists():
    for name, step in STEPS.items():
        assert callable(step.run) and step.run.__module__ == f"verlflow.steps.{name}", name


@pytest.mark.slow
def test_bad_cli_input_is_one_line_and_exit_2(tracking_uri):
    result = subprocess.run(
        [sys.executable, "-m", "verlflow.cli", "train", "--device", "tpu"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("verlflow train: error:") and "'tpu'" in lines[0] and "cpu" in lines[0]


@pytest.mark.parametrize("step", [*STEPS, "runs"])
def test_every_step_help_works(step, capsys):
    from verlflow import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main([step, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    params = [p.name for p in STEPS[step].params] if step in STEPS else ["reap"]
    assert all(f"--{name}" in out for name in params), out
