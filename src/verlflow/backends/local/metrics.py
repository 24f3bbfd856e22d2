"""verl's per-step and validation metrics for the local trainer, computed by verl's own metric_utils.

    pytest tests/test_local_trainer_run.py -k verl_names

``compute_data_metrics`` / ``compute_timing_metrics`` / ``compute_throughout_metrics`` take a verl
``DataProto``; this module builds one from a local rollout, so the local trainer's ``critic/*``,
``response_length/*``, ``prompt_length/*``, ``timing_s/*`` and ``perf/*`` values are verl's by
construction. Validation names follow verl's ``_val_metrics_update`` (``val-core`` / ``val-aux``).
"""

from __future__ import annotations

from typing import Any

import torch


def verl_batch_metrics(rollout: Any, scores: torch.Tensor, advantages: torch.Tensor,
                       returns: torch.Tensor, timing: dict[str, float], *, max_prompt_length: int,
                       max_response_length: int) -> dict[str, float]:
    """verl's ``compute_data_metrics`` / ``compute_timing_metrics`` / ``compute_throughout_metrics``."""
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
    )

    size = len(scores)
    prompt_length = rollout.prompt_mask.sum(-1).float().cpu()
    response_length = rollout.response_mask.sum(-1).float().cpu()
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": scores.cpu(), "token_level_rewards": scores.cpu(),
            "advantages": advantages.cpu(), "returns": returns.cpu(), "response_mask": rollout.response_mask.cpu(),
            "prompt_length": prompt_length, "response_length": response_length,
            # verl reads the configured maximum lengths off these shapes (for the clip ratios).
            "prompts": torch.zeros(size, max_prompt_length, dtype=torch.int8),
            "responses": torch.zeros(size, max_response_length, dtype=torch.int8),
        },
        meta_info={"global_token_num": (prompt_length + response_length).long().tolist()},
    )
    return {
        **compute_data_metrics(batch, use_critic=False),
        **compute_timing_metrics(batch, timing),
        **compute_throughout_metrics(batch, timing, n_gpus=1),
    }


def val_metric_names(per_source: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """verl's validation names: ``val-core`` for the mean/best/maj at the largest N, ``val-aux`` else."""
    metrics = {}
    for source, per_var in per_source.items():
        for var, per_metric in per_var.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in per_metric)
            for name, value in per_metric.items():
                core = var == "reward" and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                metrics[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = float(value)
    return metrics
