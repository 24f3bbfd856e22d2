"""The digest of a Hugging Face checkpoint's weights: what makes two registered versions the same model.

    python -m verlflow.models.weights_digest <checkpoint folder>

Two train runs that end with bit-identical weights (one recipe, data and seed trained twice, or a run filed in
another experiment) are one model; ``register`` tags each version with this digest (``weights.digest``) and
returns the existing version instead of adding a copy. Only the weight files count (``*.safetensors``,
``*.bin``, ``*.pt``), by name and content, so a rewritten ``config.json`` or tokenizer file does not.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

# The version tag holding the digest.
WEIGHTS_DIGEST_TAG = "weights.digest"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
_CHUNK = 1 << 22


def weights_digest(checkpoint: str | Path) -> str | None:
    """sha256 (first 32 hex digits) over the checkpoint's weight files, by relative name and bytes; None
    when the folder holds no weight file."""
    root = Path(checkpoint)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:32]


if __name__ == "__main__":
    print(weights_digest(sys.argv[1]) or "no weight files")
