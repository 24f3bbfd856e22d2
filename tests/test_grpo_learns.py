"""GRPO learns here: after a short warm start, the local trainer raises the mean reward clearly.

The task is GSM8K's answer format under a 32-token budget. A tiny Qwen3 warm-started for a few dozen
supervised steps on worked synthetic answers writes long derivations that the budget usually cuts
before the ``#### <number>`` line, so verl's GSM8K scorer (with ``format_score``: 0.5 for a well-formed
but wrong answer, 1 for a right one) rarely pays. GRPO has to discover that short answers ending in
``#### N`` earn reward; the mean reward of the last steps must clearly beat the first steps'.
"""

from __future__ import annotations

import mlflow
import pytest
import torch

from verlflow import config
from verlflow.backends.local.trainer import train_local
from verlflow.data import gsm8k
from verlflow.data.synthetic import synthetic_examples
from verlflow.models.tinymodel import build_tiny_model
from verlflow.tracking import tracking

REWARD_FILE = '''
from verl.utils.reward_score import gsm8k


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return gsm8k.compute_score(solution_str, ground_truth, format_score=0.5)
'''


def warm_start(model_dir, out_dir, steps: int = 80, seed: int = 0):
    """A few supervised steps on synthetic worked answers (prompt masked out), saved to ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    pairs = []
    for example in synthetic_examples(256, seed=seed, split="train"):
        messages = [{"role": "user", "content": f"{example['question']} {gsm8k.PROMPT_SUFFIX}"}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        pairs.append((tokenizer(prompt, add_special_tokens=False)["input_ids"],
                      tokenizer(example["answer"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch = [pairs[i] for i in torch.randint(len(pairs), (16,), generator=generator).tolist()]
        width = max(len(p) + len(a) for p, a in batch)
        ids = torch.tensor([p + a + [tokenizer.pad_token_id] * (width - len(p) - len(a)) for p, a in batch])
        labels = torch.tensor([[-100] * len(p) + a + [-100] * (width - len(p) - len(a)) for p, a in batch])
        mask = torch.tensor([[1] * (len(p) + len(a)) + [0] * (width - len(p) - len(a)) for p, a in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.mark.slow
def test_mean_reward_rises_over_grpo_steps(tmp_path, tracking_uri):
    torch.manual_seed(0)
    model = warm_start(build_tiny_model(tmp_path / "tiny", seed=0), tmp_path / "warm")
    gsm8k.preprocess("synthetic", tmp_path / "data", 0, log_to_mlflow=False)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    steps = 24
    cfg = config.compose("tiny", "cpu", [
        f"actor_rollout_ref.model.path={model}",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}/ckpt",
        f"reward.custom_reward_function.path={tmp_path}/reward.py",
        "reward.custom_reward_function.name=compute_score",
    ])
    with tracking.tracked_run() as run:
        result = train_local(cfg, data_dir=tmp_path / "data", run_id=run.info.run_id)
    assert result.steps == steps
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "critic/score/mean")
    rewards = [m.value for m in sorted(history, key=lambda m: m.step)]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-6:]) / 6
    print(f"mean reward, first 3 steps {first:.3f} → last 6 steps {last:.3f}: {[round(r, 2) for r in rewards]}")
    # 0.5 is a well-formed answer: most responses must have learned to end in '#### <number>'.
    assert last > first + 0.15 and last > 0.4, rewards
