"""Why verl has no training batch, named by its cause (the start-up's "Train dataloader is empty" and friends)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import MODEL
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import frames, value_of
from verlflow.errors import Problem

# What verl says when no training row is left (the trainer's dataloader; the sampler before it).
EMPTY_DATA = ("Train dataloader is empty", "num_samples should be a positive integer")


def _dataset_in(exc: BaseException) -> Any:
    """verl's RLHFDataset from the frames ``exc`` passed through (the one being turned into batches)."""
    for frame, _ in reversed(frames(exc)):
        for name in ("train_dataset", "dataset", "self"):
            candidate = frame.f_locals.get(name)
            candidate = getattr(candidate, "train_dataset", candidate)
            if hasattr(candidate, "dataframe") and hasattr(candidate, "tokenizer"):
                return candidate
    return None


def _rows_in(files: Any) -> int | None:
    import pyarrow.parquet as pq

    paths = [files] if isinstance(files, str) else list(files or [])
    try:
        return sum(pq.read_metadata(str(path)).num_rows for path in paths)
    except Exception:  # not parquet (json) or unreadable: verl's own error is reported instead
        return None


def empty_data_problem(exc: BaseException, cfg: DictConfig) -> Problem | None:
    """Why verl has no training batch, named by its cause: the template, the prompt key, the length, the rows."""
    if not any(text in str(exc) for text in EMPTY_DATA):
        return None
    dataset = _dataset_in(exc)
    files = value_of(cfg, "data.train_files")
    in_files, kept = _rows_in(files), (len(dataset) if dataset is not None else None)
    batch = value_of(cfg, "data.train_batch_size")
    prompt_key = str(value_of(cfg, "data.prompt_key"))
    if in_files and kept == 0:
        import pyarrow.parquet as pq

        paths = [files] if isinstance(files, str) else list(files)
        if prompt_key not in pq.read_schema(str(paths[0])).names:
            return Problem("data.prompt_key", prompt_key, (
                f"{paths[0]} has no column '{prompt_key}', so verl keeps none of its {in_files} rows: use the column "
                f"that holds the chat messages (prompt, as preprocess writes it)"))
        if getattr(dataset.tokenizer, "chat_template", None) is None:
            return Problem(f"{MODEL}.path", value_of(cfg, f"{MODEL}.path"), (
                f"its tokenizer has no chat template, so verl's dataset cannot build any of the {in_files} prompts: "
                "use the model's instruct tokenizer or add a chat_template to tokenizer_config.json"))
        return Problem("data.max_prompt_length", value_of(cfg, "data.max_prompt_length"), (
            f"every one of the {in_files} prompts is longer than this many tokens, so verl's overlong-prompt "
            "filter drops them all: raise it (the guide uses 1024)"))
    limit = value_of(cfg, "data.train_max_samples")  # verl keeps the first N rows (-1: all; 0.5.0 has no key)
    if isinstance(limit, int) and 0 < limit < (in_files or limit + 1) and isinstance(batch, int) and \
            kept is not None and kept <= limit < batch:
        return Problem("data.train_max_samples", limit, (
            f"verl keeps only the first {limit} training rows, fewer than one batch of {batch} (verl drops the "
            f"partial one): raise it to >= {batch}, or -1 for every row"))
    if kept is not None and in_files and isinstance(batch, int) and kept < min(batch, in_files):
        return Problem("data.max_prompt_length", value_of(cfg, "data.max_prompt_length"), (
            f"verl's overlong-prompt filter keeps only {kept} of the {in_files} training rows, fewer than one batch "
            f"of {batch}: raise max_prompt_length (the guide uses 1024) or lower data.train_batch_size"))
    if kept is not None and isinstance(batch, int) and kept < batch:
        held = f"{kept} of the {in_files} rows" if in_files is not None and in_files != kept else f"{kept} rows"
        return Problem("data.train_batch_size", batch, (
            f"only {held} of {files} are left after verl's filter, fewer than one batch (verl drops the partial "
            f"one): use a train_batch_size <= {kept} or more rows"))
    return None
