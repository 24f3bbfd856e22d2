"""Shared set-up of the GRPO benchmarks: the two models, the GSM8K prompts and the common settings.

    python bench/grpo_vs_trl.py          # builds what it needs through these functions

Both trainers read exactly these settings (fp32, 2 threads, 4 prompts x 4 generations = 16
responses of <= 64 tokens per step, lr 5e-7, KL coefficient 0.001, no entropy bonus, temperature 1,
no prompt shuffling, so step k sees the same 4 prompts in both).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THREADS = 2
PROMPTS_PER_STEP = 4
GENERATIONS = 4
COMPLETION_TOKENS = 64
LEARNING_RATE = 5e-7
KL_COEF = 0.001
TEMPERATURE = 1.0
MAX_PROMPT_TOKENS = 512
# Train rows preprocessed: enough for 12+ steps of 4 prompts without wrapping an epoch.
TRAIN_ROWS = 256
# A 3.5 M-parameter Qwen3 on the tiny tokenizer: 2048 x 256 embedding (tied) + 4 x 786 k per layer.
MEDIUM_SIZE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 32, "intermediate_size": 768}
MODELS = ("tiny", "3.5m")
# Tracking's cost: logging switched on and off every `block` steps for `blocks` blocks (an even number: pairs);
# the first `settle` steps of each block (>= the metric writer's 2 s gathering, plus warm-up) are left out.
ALTERNATE = {"tiny": (24, 12, 10), "3.5m": (8, 3, 6)}


def build_models(cache: Path) -> dict[str, Path]:
    """{'tiny': verlflow's tiny Qwen3, '3.5m': the 3.5 M Qwen3}, each built once (offline) under ``cache``."""
    from verlflow.models.model_path import resolve_model_path
    from verlflow.models.tinymodel import build_tiny_model

    tiny = Path(resolve_model_path("tiny-qwen3", cache))
    medium = cache / "bench-qwen3-3.5m"
    if not (medium / "config.json").is_file():
        build_tiny_model(medium, **MEDIUM_SIZE)
    return {"tiny": tiny, "3.5m": medium}


def prepare_data(source: Path, out: Path) -> Path:
    """verl-format parquet of the first GSM8K rows of ``source`` (a folder of train/test jsonl) in ``out``."""
    from verlflow.data import gsm8k

    if not (out / "train.parquet").is_file():
        gsm8k.preprocess(str(source), out, TRAIN_ROWS, log_to_mlflow=False)
    return out


def parameter_count(model_dir: Path) -> int:
    """Parameters of the model in ``model_dir`` (tied embeddings counted once)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return sum(p.numel() for p in model.parameters())
