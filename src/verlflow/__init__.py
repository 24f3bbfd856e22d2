"""verlflow: GRPO training with verl on Ascend A3 and NVIDIA H20, tracked as one MLflow project."""


def __getattr__(name: str) -> str:
    # ``__version__`` is read on first use, not at import: importing the package imports nothing, so an entry point
    # catches a Ctrl-C from its first line on (verlflow.project_entry).
    if name != "__version__":
        raise AttributeError(f"module 'verlflow' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verlflow")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"
