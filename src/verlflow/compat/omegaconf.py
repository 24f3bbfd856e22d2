"""OmegaConf's private names verlflow relies on (checked on OmegaConf 2.3.1; verl pins 2.3).

    python -c "from verlflow.compat.omegaconf import full_key; help(full_key)"
"""

from __future__ import annotations

from typing import Any


def full_key(node: Any) -> str | None:
    """The dotted key of a config node within its root (``actor_rollout_ref.actor``), or None for a detached
    node. ``Node._get_full_key(None)``: checked on OmegaConf 2.3. Fallback: None (the key is looked up another
    way: in verl's message, or by value)."""
    try:
        return node._get_full_key(None)
    except Exception:  # a detached node has no key; an OmegaConf without the method: no key either
        return None


def child_node(node: Any, key: str) -> Any:
    """The child node at ``key`` of a ``DictConfig``, unresolved (an interpolation stays a node, never raises).

    ``DictConfig._get_node(key)``: checked on OmegaConf 2.3. Fallback: where it is gone, the child's value
    read with interpolations left as they are (``OmegaConf.to_container(resolve=False)``).
    """
    get_node = getattr(node, "_get_node", None)
    if get_node is not None:
        return get_node(key)
    from omegaconf import OmegaConf

    return OmegaConf.create(OmegaConf.to_container(node, resolve=False)).get(key)
