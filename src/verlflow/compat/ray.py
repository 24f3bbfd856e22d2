"""Ray's private names verlflow relies on (checked on Ray 2.60.0, the installed one).

    python -c "from verlflow.compat.ray import actor_class; help(actor_class)"
"""

from __future__ import annotations

from typing import Any


def actor_class(remote: Any) -> Any:
    """The plain class behind a ``@ray.remote`` class, to build it in this process without Ray.

    ``__ray_actor_class__`` (set by ``ray/actor.py``'s ``_modify_class``; verl 0.5.0 reads it too), else
    ``__ray_metadata__.modified_class``. Checked on Ray 2.60.0. Fallback: none (AttributeError: the rehearsal
    reports its start-up stage failing).
    """
    return getattr(remote, "__ray_actor_class__", None) or remote.__ray_metadata__.modified_class


# The logger of Ray's "Token authentication is enabled" notice (``ray/_private/authentication/
# authentication_token_setup.py``), filtered by name in verl's processes. Checked on Ray 2.60.0. Fallback: where
# Ray moves it, the filter matches nothing and the one line is printed again.
TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
