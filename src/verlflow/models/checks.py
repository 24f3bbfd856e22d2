"""Checks of the model inputs a step is given: a readable model folder, a checkpoint that trained.

    python -c "from verlflow.models.checks import check_model_folder; check_model_folder('/tmp')"

Each raises :class:`~verlflow.errors.VerlflowError` with one line, before a run is opened.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from verlflow.errors import VerlflowError
from verlflow.util import first_line

_STEP = re.compile(r"global_step_(\d+)")
# Files from which transformers' AutoTokenizer can load a tokenizer (one is enough).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(path: str | os.PathLike[str]) -> None:
    """A local Hugging Face folder whose config and weight files can be opened (headers only: cheap)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return  # a hub id or the tiny model: resolved elsewhere
    config = folder / "config.json"
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise VerlflowError(f"model folder '{path}': {config.name} is missing or not JSON ({exc.__class__.__name__})"
                            ": give a Hugging Face model folder") from None
    from safetensors import safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors raises its own error types and OSError for short files
            first = first_line(exc, 120)
            raise VerlflowError(f"model weights '{weights}' are unreadable ({first}): the file is corrupt or "
                                "truncated; copy the model folder again") from None


def check_tokenizer_folder(path: str | os.PathLike[str], other: str = "") -> None:
    """Refuse a local folder holding none of :data:`TOKENIZER_FILES`: transformers then builds a tokenizer without
    a vocabulary or chat template and fails later in other words ("set a chat template"). ``other``: a setting
    that could name another tokenizer folder, offered in the fix."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES):
        return  # a hub id or the tiny model: resolved elsewhere
    instead = f", or name a folder that has them in {other}" if other else ""
    raise VerlflowError(f"model folder '{path}' has no tokenizer files ({' or '.join(TOKENIZER_FILES)}): copy them "
                        "from the model it was trained from (AutoTokenizer.from_pretrained(<base>).save_pretrained("
                        f"<this folder>)){instead}")


def check_trained_checkpoint(*paths: str) -> None:
    """Refuse a checkpoint written at global step 0: a run that trained nothing has nothing to register."""
    for path in paths:
        for part in Path(path).parts:
            match = _STEP.fullmatch(part)
            if match and int(match.group(1)) == 0:
                raise VerlflowError(f"checkpoint {path} is from step 0: the run trained nothing; register a run "
                                    "with trainer.total_training_steps >= 1")


def unsafe_pickle(folder: str | os.PathLike[str]) -> VerlflowError:
    """The one line for a model whose weight file is a pickle torch refused to load (it could run code on load):
    raised from ``pickle.UnpicklingError`` instead of its page of traceback."""
    return VerlflowError(f"model '{folder}': a weight file is a pickle that torch refuses to load safely (loading it "
                         "could run code); use the model's safetensors files (save_pretrained(..., "
                         "safe_serialization=True) converts it) or a model you trust")
