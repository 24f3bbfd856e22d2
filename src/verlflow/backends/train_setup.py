"""What a training runs on: recipe, profile and backend chosen from the device, and the composed, checked config.

    python -c "import verlflow.backends.train_setup as t; print(t.choose_train_setup('auto', 'cpu', 'auto', 'auto'))"

``train``, ``search`` and ``main`` resolve ``auto`` the same way:

| device | recipe                | profile                                          | backend |
| ------ | --------------------- | ------------------------------------------------ | ------- |
| npu    | qwen3-4b-gsm8k-grpo   | the one npu-smi's chips fit: a3, a2 (a3 if none) | verl    |
| gpu    | qwen3-4b-gsm8k-grpo   | the one nvidia-smi's GPUs fit: h20, h100, h200   | verl    |
| cpu    | smoke                 | cpu                                              | local   |
| cpu    | smoke (backend=verl)  | cpu-verl                                         | verl    |

A profile that is not the listed accelerator's is refused before the run opens (:func:`fit_hardware`), unless
``verlflow.accept_other_hardware=true``; the run's record carries the listed SKU's figures (910B2 → its peak).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from verlflow import config
from verlflow.backends.registry import AUTO, default_backend, get_backend
from verlflow.config import PROFILE_FOR_DEVICE, check_config_counts, default_recipe
from verlflow.device import identity
from verlflow.device.detect import Probe, absence, detect_device, identify_node, lister_error
from verlflow.errors import VerlflowError
from verlflow.platforms import Device


def choose_train_setup(recipe: str, device_name: str, profile: str, backend: str, *,
                       probe: Probe | None = None) -> tuple[str, Device, str, str]:
    """Resolve ``auto`` recipe / device / profile / backend into concrete names (see the module table).

    The backend is a registered one (:mod:`verlflow.backends.registry`): its ``default_for`` devices pick it
    for ``auto``, its ``profile_for`` the profile it needs instead of the device's default (verl on the CPU).
    An ``auto`` profile on an NPU or GPU is the shipped one whose record fits what ``npu-smi`` / ``nvidia-smi``
    list (an H100 node: h100), the device's default when they list nothing (a dry run on a laptop) or nothing
    shipped fits (then :func:`fit_hardware` refuses it). The run then drives the profile's ``device``.
    """
    chosen = None if backend == AUTO else get_backend(backend)  # an unknown name fails before detection
    dev = detect_device(device_name, probe=probe)
    if recipe == AUTO:
        recipe = default_recipe(dev)
    chosen = chosen or default_backend(dev)
    if profile == AUTO:
        profile = chosen.profile_for.get(dev) or auto_profile(dev, probe=probe)
    return recipe, dev, profile, chosen.name


def auto_profile(dev: Device, *, probe: Probe | None = None) -> str:
    """The profile ``auto`` means on ``dev`` here: the shipped record that fits the listed accelerator, else the
    device's default (its platform's ``default_profile``)."""
    node = identify_node(dev, probe=probe) if Device(dev).is_accelerator else None
    return (node.profile if node is not None else None) or PROFILE_FOR_DEVICE[dev]


def node_hint(profile: config.Profile) -> str:
    """Where a launch of ``profile`` belongs, named by its hardware record ("run on an A2 node"), not by its device."""
    record = profile.accelerator
    if record is not None:
        return f"run on an {record.name} node"
    return f"run on a node with {profile.device.word}s" if profile.device.is_accelerator else "use backend=local"


def settle_device(dev: Device, recipe: str, profile: str, overrides: str = "", *, dry_run: bool | None,
                  ray_address: str = "", probe: Probe | None = None) -> None:
    """The first thing a train on the wrong machine hears: that its accelerator is not here, before anything about
    its data (whose fix, a download, is no use on a machine that cannot train).

    A real launch without the device is refused in one line; a dry run is told that this is expected off the node
    and what it still checks, and goes on (``dry_run=None``: a step that has no dry run, main or search). Nothing is
    asked for the CPU or a Ray job (the devices are the cluster's), and nothing is said under the recipe's
    ``verlflow.skip_preflight=true`` (a launcher of one's own, a detection that is wrong on some machine).
    """
    from verlflow.data.recipe_data import recipe_block

    if not dev.is_accelerator or ray_address:
        return
    absent = absence(dev, probe=probe)
    if absent is None or recipe_block(recipe, overrides).skip_preflight:
        return
    if not dry_run:
        instead = " or pass -P dry_run=true" if dry_run is False else ""
        raise VerlflowError(f"device={dev}: {absent}; {node_hint(config.load_profile(profile))}{instead}")
    print(f"verlflow: dry run: {absent}, as expected off the node (a laptop, a CPU runner): it still checks the "
          f"launch against the installed verl (config, batch arithmetic for the profile's {dev.short_word}s, data "
          f"and model files) and launches nothing; `verlflow doctor --device {dev}` on the node checks the node itself",
          flush=True)


def fit_hardware(cfg: config.ComposedConfig, *, probe: Probe | None = None) -> identity.Node | None:
    """Check the profile's record against the listed accelerator and give the run the listed SKU's figures.

    One line (exit 2), before any run opens, when the profile describes another accelerator than ``npu-smi`` /
    ``nvidia-smi`` list, naming both and the profile that fits, unless ``verlflow.accept_other_hardware=true``;
    whatever is accepted, when no one record describes the node (devices of two models, GPUs in MIG mode), when its
    listing tool is installed but fails (its own error: a broken driver is not "nothing listed"), and when it lists
    fewer devices than ``trainer.n_gpus_per_node`` (a missing chip), as doctor refuses them.
    The profile's record becomes the listed SKU's (an a2 profile on 910B2 chips: the 910B2's peak). The node, or
    None when nothing is listed (the CPU, a dry run on a laptop).
    """
    dev = cfg.profile.device
    if not dev.is_accelerator:
        return None
    node = identify_node(dev, probe=probe)
    if node is None:
        failed = lister_error(dev, probe)
        if failed:
            raise VerlflowError(f"{failed}: this {dev.word} node's devices cannot be listed, so profile "
                                f"'{cfg.profile.name}' cannot be checked against them; fix the driver "
                                f"(verlflow doctor --device {dev} shows what blocks)")
        return None
    identity.check_node(node)
    _check_listed_count(cfg, node)
    if cfg.profile.accelerator is None:
        return node
    identity.check_fits(cfg.profile, node, accepted=cfg.verlflow.accept_other_hardware)
    cfg.profile.accelerator = identity.run_record(cfg.profile, node)
    return node


def _check_listed_count(cfg: config.ComposedConfig, node: identity.Node) -> None:
    """Refuse a node that lists fewer devices than ``trainer.n_gpus_per_node`` (7 of an A2's 8: a chip missing)."""
    wanted = int(OmegaConf.select(cfg.resolved, "trainer.n_gpus_per_node", default=0) or 0)
    if node.count >= wanted:
        return
    dev, missing = node.device, wanted - node.count
    raise VerlflowError(
        f"trainer.n_gpus_per_node={wanted} but this node lists {node.describe()} ({dev.platform.lister_name}): "
        f"{missing} {dev.short_word}{'s' if missing > 1 else ''} missing or hidden ({dev.visible_devices_var}); check "
        f"the node (verlflow doctor --device {dev}) or pass -P overrides=\"trainer.n_gpus_per_node={node.count}\" "
        f"to run on {node.count}")


def compose_train_config(recipe: str, profile: str, data_dir: str, model: str, overrides: str, *,
                         check_counts: bool = True, probe: Probe | None = None):
    """Compose the training config with the data files and model the step parameters point at, fitted to the
    accelerator listed here (:func:`fit_hardware`).

    ``check_counts=False`` leaves the count checks to the verl preflight, which lists them with the rest.
    """
    extra = {
        "data.train_files": str(Path(data_dir) / "train.parquet"),
        "data.val_files": str(Path(data_dir) / "test.parquet"),
    }
    if model:
        extra["actor_rollout_ref.model.path"] = model
    cfg = config.compose(recipe, profile, overrides, extra=extra)
    fit_hardware(cfg, probe=probe)
    if check_counts:
        check_config_counts(cfg.resolved)
    return cfg


def check_train_inputs(cfg: config.ComposedConfig, data_dir: str, *, require_splits: bool = True) -> None:
    """The data splits and a local model folder are readable, before a run is opened (seconds, not minutes).

    ``require_splits=False`` (verl launches) leaves a missing split and a model folder without tokenizer files to the
    verl preflight, which lists them with every other launch mistake. A split whose every ground truth verl's GSM8K
    scorer cannot match is refused for both: it would train at reward 0.
    """
    from verlflow.config import VerlflowBlock
    from verlflow.data.checks import check_ground_truths, check_parquet_split, parquet_columns
    from verlflow.data.recipe_data import preprocess_command
    from verlflow.models.checks import check_model_folder, check_tokenizer_folder
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
            if not _custom_reward(cfg):  # verl's own scorer: a split it can score nothing of trains at reward 0
                check_ground_truths(path, str(cfg.resolved.data.get("reward_fn_key") or "data_source"),
                                    "data.train_files" if split == "train" else "data.val_files")
        elif require_splits:
            command = preprocess_command(cfg.verlflow.data_source or VerlflowBlock.data_source, data_dir)
            raise VerlflowError(f"data_dir '{data_dir}' has no {split}.parquet: run `{command}` first")
    model = cfg.resolved.actor_rollout_ref.model
    check_model_folder(str(model.path))
    if require_splits:  # verl's preflight names a folder without tokenizer files among its problems
        check_tokenizer_folder(str(model.get("tokenizer_path") or model.path), "actor_rollout_ref.model.tokenizer_path")


def _custom_reward(cfg: config.ComposedConfig) -> bool:
    """Whether the config names a reward function of its own (verl's key, or its legacy top-level one)."""
    from omegaconf import OmegaConf

    return any(OmegaConf.select(cfg.resolved, key, default=None)
               for key in ("reward.custom_reward_function.path", "custom_reward_function.path"))
