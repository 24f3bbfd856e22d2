"""A YAML file whose aliases nest into millions of values is refused by name and line before it is expanded.

A 1 KB recipe of seven levels of nine aliases holds 9**7 values: loading it cost 27 CPU-s, and each level more
nine times that. Aliases that stay small are still read as YAML means them.
"""

from __future__ import annotations

from pathlib import Path

from conftest import cli_in_process

from verlflow.config.loading import load_named_yaml


def _nested_aliases(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_recipe_of_nested_aliases_is_refused_in_one_line_naming_its_line(tracking_uri, tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_nested_aliases(7) + "verlflow: {}\n")
    done = cli_in_process(["train", "--recipe", str(recipe)], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"verlflow train: error: recipe file {recipe}:6: its aliases expand to "), line


def test_aliases_that_stay_small_load_as_yaml_means_them(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(_nested_aliases(2))
    data = load_named_yaml("recipe", str(small), Path(tmp_path)).data
    assert data["a2"] == [[["x"] * 9] * 9] * 9 and data["a2"][0] is data["a1"]
