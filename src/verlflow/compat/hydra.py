"""Hydra's private names verlflow relies on (checked on hydra-core 1.3.2 and 1.3.8; verl pins hydra-core 1.3).

    python -c "from verlflow.compat.hydra import value_overrides; print(value_overrides(['trainer.nnodes=2']))"

verl's ``ppo_trainer`` composed by Hydra costs about 0.4 CPU-s (its defaults tree, a few hundred YAML files
parsed, merged), and a dry run composes it twice. Most command lines only set values: applied by Hydra's own
override step to a copy of the composed defaults, they give the same config, or the same error, in
milliseconds. A line that picks a config group, a package or a sweep needs the whole composition.
"""

from __future__ import annotations

from typing import Any


def value_overrides(overrides: list[str]) -> list[Any] | None:
    """``overrides`` parsed by Hydra's own parser when every one only sets, adds or deletes a dotted value;
    None when one needs the defaults list (a group choice, ``@package``, a sweep, a ``hydra.`` key) or does not
    parse (the whole composition then says why, in Hydra's words)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except HydraException:
        return None
    for override in parsed:
        key = override.key_or_group
        if (override.is_sweep_override() or override.package is not None or "." not in key or "/" in key
                or key.startswith("hydra.")):
            return None
    return parsed


def apply_value_overrides(parsed: list[Any], cfg: Any) -> bool:
    """Apply overrides from :func:`value_overrides` to ``cfg`` exactly as Hydra's composition does, errors
    included; False, ``cfg`` untouched, where this Hydra has no such step (the caller then composes in full).
    ``ConfigLoaderImpl._apply_overrides_to_config``: checked on hydra-core 1.3."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    apply = getattr(ConfigLoaderImpl, "_apply_overrides_to_config", None)
    if apply is None:
        return False
    apply(parsed, cfg)
    return True
