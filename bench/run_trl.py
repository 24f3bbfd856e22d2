"""One TRL GRPOTrainer run for the benchmark, in its own process (TRL is imported nowhere else).

    python bench/run_trl.py MODEL_DIR DATA_DIR STEPS [TRL_SITE]

TRL may live outside the environment (``TRL_SITE``, a ``pip install --target`` folder): verl 0.9.1
crashes at start-up whenever ``trl`` >= 1 is importable, so the benchmark keeps it off the shared path.
Prints one line ``BENCH_RESULT <json>`` with the per-step wall times and generated tokens.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import bench_setup as setup


def main(model_dir: str, data_dir: str, steps: int) -> dict:
    """Train ``steps`` GRPO steps with TRL on the benchmark settings; per-step seconds and tokens."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from verl.utils.reward_score import default_compute_score

    from verlflow.data.gsm8k import read_split

    torch.set_num_threads(setup.THREADS)
    torch.manual_seed(0)
    frame = read_split(data_dir, "train")
    dataset = Dataset.from_dict({"prompt": list(frame["prompt"]),
                                 "ground_truth": [r["ground_truth"] for r in frame["reward_model"]]})
    tokens: list[int] = []

    def gsm8k_reward(completions, ground_truth, completion_ids, **_):
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [float(default_compute_score("openai/gsm8k", c[0]["content"], g)) for c, g in
                zip(completions, ground_truth, strict=True)]

    ends: list[float] = []
    cpu: list[float] = []  # process CPU seconds (all threads): steadier than wall time on a shared machine

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
            per_device_train_batch_size=setup.PROMPTS_PER_STEP * setup.GENERATIONS,
            num_generations=setup.GENERATIONS, max_completion_length=setup.COMPLETION_TOKENS,
            learning_rate=setup.LEARNING_RATE, lr_scheduler_type="constant", beta=setup.KL_COEF,
            temperature=setup.TEMPERATURE, top_p=1.0, max_steps=steps, logging_steps=1, shuffle_dataset=False,
            num_iterations=1, steps_per_generation=1, dataloader_num_workers=0, disable_tqdm=True, seed=0,
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=gsm8k_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[StepClock()])
        trainer.train()
    return {"step_s": [b - a for a, b in zip(ends, ends[1:], strict=False)], "tokens": tokens,
            "cpu_s": [b - a for a, b in zip(cpu, cpu[1:], strict=False)]}


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[4]:
        sys.path.insert(0, sys.argv[4])
    print("BENCH_RESULT " + json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))), flush=True)
