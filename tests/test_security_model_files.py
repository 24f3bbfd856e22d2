"""A model folder whose weight file is a pickle is refused in one line, and the pickle's code never runs.

transformers loads ``pytorch_model.bin`` with torch's weights-only unpickler, which refuses a pickle that calls a
function; evaluate then printed that refusal as a 35-line ``UnpicklingError`` traceback. Planted: a tiny Qwen3
folder whose safetensors are replaced by a pickle that would write a file when loaded.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import cli_in_process


class _WritesAFile:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def pickled_model(tmp_path, tiny_workdir) -> tuple[Path, Path]:
    from verlflow.models.model_path import TINY_SENTINEL, resolve_model_path

    folder = tmp_path / "pickled-qwen"
    shutil.copytree(resolve_model_path(TINY_SENTINEL, tiny_workdir / "cache"), folder)
    for weights in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        weights.unlink()
    marker = tmp_path / "the-pickle-ran"
    with open(folder / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _WritesAFile(marker)}, handle)
    return folder, marker


def test_evaluate_refuses_a_pickled_weight_file_in_one_line(tracking_uri, tmp_path, pickled_model, fixtures_dir):
    folder, marker = pickled_model
    done = cli_in_process(["evaluate", "--model_uri", str(folder), "--data_dir", str(fixtures_dir / "gsm8k"),
                           "--limit", "2"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"verlflow evaluate: error: model '{folder}': a weight file is a pickle"), last
    assert not marker.exists()
