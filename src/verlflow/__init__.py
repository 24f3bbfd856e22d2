"""verlflow: GRPO training with verl on Ascend A3 and NVIDIA H20, tracked as one MLflow project."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("verlflow")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
