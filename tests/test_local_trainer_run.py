"""The tiny recipe trains on the CPU and is tracked like a verl run; bad input is one clear line.

Real MLflow (SQLite store in tmp_path), real verl config composition, the real tiny Qwen3.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from verlflow import config
from verlflow.backends.local.settings import read_settings
from verlflow.backends.local.trainer import train_local
from verlflow.errors import VerlflowError
from verlflow.models.weights_digest import weights_digest
from verlflow.names import CHECKPOINT_DIR_TAG, IGNORED_KEYS_TAG
from verlflow.platforms import Device
from verlflow.tracking import tracking

PER_STEP = [
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
    "timing_s/update_actor", "timing_s/step", "perf/throughput", "perf/time_per_step", "perf/total_num_tokens",
    "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac",
    "actor/ppo_kl", "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min", "response_length/mean",
    "response_length/max", "response_length/min", "response_length/clip_ratio", "prompt_length/mean",
]
VALIDATION = ["val-core/openai/gsm8k/reward/mean_at_1", "timing_s/testing"]


@pytest.fixture(scope="module")
def workdir(tiny_workdir) -> Path:
    """conftest's tiny-model cache and synthetic GSM8K parquet, the cache set for this module's runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERLFLOW_CACHE", str(tiny_workdir / "cache"))
        yield tiny_workdir


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch, tracking_uri):
    """A fresh SQLite store per test, and run folders (outputs/local/<run_id>, relative to the working
    directory) in tmp_path."""
    monkeypatch.chdir(tmp_path)


def _train(workdir: Path, tmp_path: Path, overrides=(), data_dir=None):
    cfg = config.compose("tiny", "cpu", overrides)
    with tracking.tracked_run(tags=tracking.standard_tags(backend="local", recipe="tiny", profile="cpu")) as run:
        return train_local(cfg, data_dir=data_dir or workdir / "data", run_id=run.info.run_id), cfg


@pytest.mark.slow
def test_smoke_run_finishes_tracked_with_verl_names_and_a_loadable_checkpoint(workdir, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="verlflow.backends.local.run_record"):
        result, cfg = _train(workdir, tmp_path)
    ignored = [r.getMessage() for r in caplog.records if "local trainer ignores" in r.getMessage()]
    assert {r.levelname for r in caplog.records if "local trainer ignores" in r.getMessage()} == {"INFO"}
    assert ignored == ["local trainer ignores actor_rollout_ref.rollout.name=vllm "
                       "(transformers generates locally, not vLLM/SGLang)"]
    client = MlflowClient()
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert result.steps == 4

    # Params: the resolved config flattened exactly as verl's own MLflow logger flattens it, with the
    # checkpoint folder the run actually used (its own, so that no later run resumes from it).
    folder = tmp_path / "outputs" / "local" / result.run_id / "checkpoints"
    flat = tracking.flatten_params({**cfg.to_container()})
    flat["trainer/default_local_dir"] = str(folder)
    # ... and the final checkpoint's weights digest, which register and reuse check the folder against.
    flat["verlflow.checkpoint_sha256"] = weights_digest(result.final_checkpoint)
    assert run.data.params == {k: str("None" if v is None else v) for k, v in flat.items()}
    assert run.data.params["actor_rollout_ref/actor/optim/lr"] == "0.001"

    tags = run.data.tags
    assert tags["device.type"] == "cpu" and tags["verlflow.backend"] == "local"
    assert "actor_rollout_ref.rollout.name" in tags[IGNORED_KEYS_TAG].split(",")  # the tiny recipe names vllm
    assert tags[CHECKPOINT_DIR_TAG] == str(result.final_checkpoint)

    for name in PER_STEP:
        assert [m.step for m in client.get_metric_history(run.info.run_id, name)] == [1, 2, 3, 4], name
    for name in VALIDATION:  # test_freq 2
        assert [m.step for m in client.get_metric_history(run.info.run_id, name)] == [2, 4], name
    assert run.data.metrics["timing_s/e2e"] > run.data.metrics["timing_s_mean/step"] > 0
    assert "timing_s_mean/gen" in run.data.metrics

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config", "device_profile.json", "samples"} <= artifacts
    samples = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert samples == {"samples/step_2.json", "samples/step_4.json"}
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "samples/step_4.json", str(tmp_path)))
                       .read_text())
    assert {"prompt", "response", "reward"} <= set(table["columns"]) and len(table["data"]) == 16

    final = result.final_checkpoint
    assert final == folder / "global_step_4" / "actor" / "huggingface"
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}],
                                           add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


BAD_INPUT = [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], None, "must be a multiple of"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"], None, "must divide"),
    (["actor_rollout_ref.model.path=/no/such/model"], None, "does not exist"),
    # A hub id that does not exist: a clear line whether or not this machine reaches the hub.
    (["actor_rollout_ref.model.path=verlflow-tests/no-such-model"], None, "no-such-model"),
    (["algorithm.adv_estimator=gae"], None, "needs a critic"),
    ([], "no-such-folder", "no-such-folder does not exist"),
]


@pytest.mark.parametrize(("overrides", "data_dir", "message"), BAD_INPUT)
def test_bad_input_is_one_line_and_the_run_ends_failed(workdir, tmp_path, overrides, data_dir, message):
    with pytest.raises(VerlflowError, match=message) as error:
        _train(workdir, tmp_path, overrides, data_dir=tmp_path / data_dir if data_dir else None)
    assert "\n" not in str(error.value)
    client = MlflowClient()
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_an_absent_accelerator_is_refused_before_any_work(workdir, tmp_path):
    with pytest.raises(VerlflowError, match="sees no CUDA GPU"):
        _train(workdir, tmp_path, ["trainer.device=cuda"])
    assert not (tmp_path / "outputs").exists()


def test_guide_recipe_keys_the_local_trainer_cannot_honour_are_named(workdir):
    settings = read_settings(config.compose("qwen3-4b-gsm8k-grpo", "h20"))
    assert {"actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.rollout.gpu_memory_utilization", "trainer.n_gpus_per_node"} <= set(settings.ignored)
    honoured = ("optim.lr", "ppo_mini_batch_size", "kl_loss_coef", ".n", "use_dynamic_bsz")
    assert not any(key.endswith(honoured) for key in settings.ignored)
    # Dynamic batching (3000 tokens per device, 1024 + 1024-token sequences) becomes fixed micro-batches.
    micro = (settings.ppo_micro_batch_size, settings.log_prob_micro_batch, settings.ref_log_prob_micro_batch)
    assert micro == (1, 2, 4)
    assert settings.device == Device.GPU and settings.n == 5
