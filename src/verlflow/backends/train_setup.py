"""What a training runs on: recipe, profile and backend chosen from the device, and the composed, checked config.

    python -c "import verlflow.backends.train_setup as t; print(t.choose_train_setup('auto', 'cpu', 'auto', 'auto'))"

``train``, ``search`` and ``main`` resolve ``auto`` the same way:

| device | recipe                | profile | backend |
| ------ | --------------------- | ------- | ------- |
| npu    | qwen3-4b-gsm8k-grpo   | a3      | verl    |
| gpu    | qwen3-4b-gsm8k-grpo   | h20     | verl    |
| cpu    | smoke                 | cpu     | local   |
| cpu    | smoke (backend=verl)  | cpu-verl| verl    |
"""

from __future__ import annotations

from pathlib import Path

from verlflow import config
from verlflow.backends.registry import AUTO, default_backend, get_backend
from verlflow.config import PROFILE_FOR_DEVICE, Device, check_config_counts, default_recipe
from verlflow.device.detect import detect_device
from verlflow.errors import VerlflowError


def choose_train_setup(recipe: str, device_name: str, profile: str, backend: str) -> tuple[str, Device, str, str]:
    """Resolve ``auto`` recipe / device / profile / backend into concrete names (see the module table).

    The backend is a registered one (:mod:`verlflow.backends.registry`): its ``default_for`` devices pick it
    for ``auto``, its ``profile_for`` the profile it needs instead of the device's default (verl on the CPU).
    The device chosen here only picks the profile; the run then drives the profile's ``device``.
    """
    chosen = None if backend == AUTO else get_backend(backend)  # an unknown name fails before detection
    dev = detect_device(device_name)
    if recipe == AUTO:
        recipe = default_recipe(dev)
    chosen = chosen or default_backend(dev)
    if profile == AUTO:
        profile = chosen.profile_for.get(dev, PROFILE_FOR_DEVICE[dev])
    return recipe, dev, profile, chosen.name


def compose_train_config(recipe: str, profile: str, data_dir: str, model: str, overrides: str, *,
                         check_counts: bool = True):
    """Compose the training config with the data files and model the step parameters point at.

    ``check_counts=False`` leaves the count checks to the verl preflight, which lists them with the rest.
    """
    extra = {
        "data.train_files": str(Path(data_dir) / "train.parquet"),
        "data.val_files": str(Path(data_dir) / "test.parquet"),
    }
    if model:
        extra["actor_rollout_ref.model.path"] = model
    cfg = config.compose(recipe, profile, overrides, extra=extra)
    if check_counts:
        check_config_counts(cfg.resolved)
    return cfg


def check_train_inputs(cfg: config.ComposedConfig, data_dir: str, *, require_splits: bool = True) -> None:
    """The data splits and a local model folder are readable, before a run is opened (seconds, not minutes).

    ``require_splits=False`` (verl launches) leaves a missing split to the verl preflight, which lists it
    with every other launch mistake.
    """
    from verlflow.config import VerlflowBlock
    from verlflow.data.checks import check_parquet_split, parquet_columns
    from verlflow.data.recipe_data import preprocess_command
    from verlflow.models.checks import check_model_folder
    from verlflow.util import check_no_symlink_loop

    check_no_symlink_loop(data_dir, "data_dir")
    for split in ("train", "test"):
        path = Path(data_dir) / f"{split}.parquet"
        if path.exists():
            prompt_key, columns = str(cfg.resolved.data.prompt_key), parquet_columns(path)
            if columns and prompt_key not in columns:
                raise VerlflowError(f"data.prompt_key={prompt_key}: {path} has no such column (it has "
                                    f"{', '.join(columns)}): name the column that holds the chat "
                                    "messages (prompt, as preprocess writes it)")
            check_parquet_split(path, required=("reward_model",))
        elif require_splits:
            command = preprocess_command(cfg.verlflow.data_source or VerlflowBlock.data_source, data_dir)
            raise VerlflowError(f"data_dir '{data_dir}' has no {split}.parquet: run `{command}` first")
    check_model_folder(str(cfg.resolved.actor_rollout_ref.model.path))
