"""A typo in verlflow's own keys fails at once, in one line naming the key and the nearest valid key.

Recipe ``verlflow:`` blocks (file or ``verlflow.<key>=…`` override), profiles and search configs at any
depth all go through one typed reader (:func:`verlflow.config.typed_build.build`), so a misspelt key is never
silently ignored and a value gets its declared type or one clear line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process

from verlflow.config import SEARCH_DIR, VerlflowBlock, compose, list_recipes, load_recipe
from verlflow.errors import EXIT_BAD_INPUT, VerlflowError
from verlflow.search.search_config import load_search_config

REPO = Path(__file__).resolve().parents[1]


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


def test_a_recipe_key_typo_in_an_override_names_the_nearest_key():
    with pytest.raises(VerlflowError) as exc_info:
        compose("smoke", "cpu", "verlflow.rollout_trace=0")
    message = _one_line(exc_info)
    assert message.startswith("unknown recipe key 'verlflow.rollout_trace': did you mean "
                              "'verlflow.rollout_traces'? valid: verlflow.{model_name, "), message


def test_a_recipe_key_typo_in_a_recipe_file_names_the_file_and_the_nearest_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("verlflow:\n  model_name: mine\n  val_limt: 8\ndata: {train_batch_size: 8}\n")
    with pytest.raises(VerlflowError) as exc_info:
        load_recipe(str(path))
    message = _one_line(exc_info)
    assert str(path) in message
    assert "unknown recipe key 'verlflow.val_limt': did you mean 'verlflow.val_limit'?" in message


@pytest.mark.parametrize("block", ["[]", "", "{}"])
def test_an_empty_verlflow_block_names_the_file(tmp_path, block):
    path = tmp_path / "mine.yaml"
    path.write_text(f"verlflow: {block}\ndata: {{train_batch_size: 8}}\n")
    with pytest.raises(VerlflowError) as exc_info:  # before: accepted silently, every key at its default
        load_recipe(str(path))
    message = _one_line(exc_info)
    assert str(path) in message and "'verlflow:' block is empty" in message, message


def test_a_profile_key_typo_names_the_nearest_key(tmp_path):
    path = tmp_path / "box.yaml"
    path.write_text("device: cpu\ndescripton: my box\n")
    with pytest.raises(VerlflowError) as exc_info:
        compose("smoke", str(path))
    assert "unknown profile key 'descripton': did you mean 'description'?" in _one_line(exc_info)
    with pytest.raises(VerlflowError) as exc_info:
        compose("smoke", "cpu", "profile.evn.OMP_NUM_THREADS=1")
    assert "unknown profile key 'profile.evn': did you mean 'profile.env'?" in _one_line(exc_info)


def test_recipe_values_get_their_declared_types():
    own = compose("smoke", "cpu", ["verlflow.skip_preflight=true", "verlflow.val_limit=8",
                                   "verlflow.system_metrics_interval=1", "verlflow.model_name=123"]).verlflow
    assert own.skip_preflight is True and own.val_limit == 8 and own.model_name == "123"
    assert isinstance(own.system_metrics_interval, float) and own.system_metrics_interval == 1.0
    assert compose("smoke", "cpu", "verlflow.skip_preflight=false").verlflow.skip_preflight is False
    # Unset keys keep their declared defaults; the mapping view serves helpers that also take a plain dict.
    assert own.rollout_traces == 2 and own.get("rollout_traces", 5) == 2 and own["data_source"] == "synthetic-easy"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("verlflow.val_limit=many", "recipe key 'verlflow.val_limit' expects an integer, got 'many'"),
        ("verlflow.skip_preflight=maybe", "recipe key 'verlflow.skip_preflight' expects true or false, got 'maybe'"),
        ("verlflow.system_metrics_interval=often",
         "recipe key 'verlflow.system_metrics_interval' expects a number, got 'often'"),
    ],
)
def test_a_recipe_value_of_the_wrong_type_is_one_line(override, expected):
    with pytest.raises(VerlflowError) as exc_info:
        compose("smoke", "cpu", override)
    assert _one_line(exc_info) == expected


def test_shipped_recipes_use_only_declared_keys():
    for name in list_recipes():
        _, own, _ = load_recipe(name)
        assert isinstance(own, VerlflowBlock) and own.model_name, name


def test_every_recipe_key_verlflow_reads_is_declared():
    from verlflow.device import system_metrics

    assert system_metrics.INTERVAL_KEY in VerlflowBlock().keys()


def _search_config(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((SEARCH_DIR / "default.yaml").read_text())
    edit(data)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


LR = "actor_rollout_ref.actor.optim.lr"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(samplr=d.pop("sampler")), "unknown key 'samplr': did you mean 'sampler'?"),
        (lambda d: d["storage"].update(max_retries=3), "unknown key 'storage.max_retries': did you mean "
                                                       "'storage.max_retry'?"),
        (lambda d: d["pruner"]["median"].update(n_warmup_step=2),
         "unknown key 'pruner.median.n_warmup_step': did you mean 'pruner.median.n_warmup_steps'?"),
        (lambda d: d["space"][LR].update(relativ=[0.5, 2.0]),
         f"unknown key 'space.{LR}.relativ': did you mean 'space.{LR}.relative'?"),
    ],
    ids=["top-level", "section", "nested-block", "space-entry"],
)
def test_a_search_config_typo_names_the_nearest_key(tmp_path, edit, expected):
    path = _search_config(tmp_path, edit)
    with pytest.raises(VerlflowError) as exc_info:
        load_search_config(str(path))
    message = _one_line(exc_info)
    assert message.startswith(f"search config {path}: ") and expected in message, message


def test_a_search_config_value_of_the_wrong_type_is_one_line(tmp_path):
    path = _search_config(tmp_path, lambda d: d["sampler"].update(seed="forty-two"))
    with pytest.raises(VerlflowError) as exc_info:
        load_search_config(str(path))
    assert _one_line(exc_info).endswith("'sampler.seed' expects an integer, got 'forty-two'")


@pytest.mark.parametrize("where", ["override", "recipe-file"])
def test_the_cli_prints_the_typo_in_one_line_and_exits_2(tmp_path, tracking_uri, where):
    args = ["--device", "cpu", "--backend", "local", "--data_dir", str(tmp_path / "data")]
    if where == "override":
        args += ["--overrides", "verlflow.skip_prefligth=true"]
    else:
        recipe = tmp_path / "typo.yaml"
        recipe.write_text(yaml.safe_dump({**yaml.safe_load((REPO / "src/verlflow/config/recipes/tiny.yaml")
                                                           .read_text()),
                                          "verlflow": {"model_name": "x", "skip_prefligth": True}}))
        args += ["--recipe", str(recipe)]
    result = cli_in_process(["train", *args], cwd=tmp_path)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("verlflow train: error: ")
    assert "'verlflow.skip_prefligth': did you mean 'verlflow.skip_preflight'?" in lines[0], lines[0]
