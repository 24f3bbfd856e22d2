"""transformers' private names verlflow relies on (checked on transformers 4.52.4 / 4.53.0, the guide's images,
and 5.10.4, the installed one).

    python -c "from verlflow.compat.transformers import attention_implementation; help(attention_implementation)"
"""

from __future__ import annotations

from typing import Any


def attention_implementation(model: Any) -> str | None:
    """The attention kernel a loaded model runs (``sdpa``, ``eager``, ``flash_attention_2``…).

    ``model.config._attn_implementation`` (no public getter: the public ``attn_implementation`` is only a
    ``from_pretrained`` argument): checked on transformers 4.52, 4.53 and 5.10. Fallback: None, which the
    local trainer treats as "cannot take a custom mask" (it then runs the plain, unpacked forward).
    """
    return getattr(getattr(model, "config", None), "_attn_implementation", None)
