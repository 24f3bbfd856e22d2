"""The local trainer's GRPO pieces give the hand-computed values on small tensors, and an update trains.

The functions under test route to verl's core_algos; these tests pin what the local trainer feeds
them (groups, masks, clip ratios from verl's ActorConfig, mini-batch normalisers) by arithmetic done
by hand in the comments.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verlflow.backends.local.loss import actor_loss, compute_advantages, response_log_probs, update_actor
from verlflow.backends.local.settings import _actor_config
from verlflow.models.tinymodel import build_tiny_model


def actor(**values):
    """verl's ActorConfig as the local trainer builds it, from a few actor keys over verl's defaults."""
    node = {"strategy": "fsdp", "rollout_n": 4, "ppo_mini_batch_size": 2, "clip_ratio": 0.2,
            "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl",
            "ppo_epochs": 1, "policy_loss": {"loss_mode": "vanilla"},
            "optim": {"_target_": "verl.workers.config.FSDPOptimizerConfig", "lr": 1e-2},
            "_target_": "verl.workers.config.FSDPActorConfig"}
    node.update(values)
    return _actor_config(OmegaConf.create(node), micro=4)


def test_grpo_advantages_are_normalised_within_each_prompt_group():
    # Group 0 scores 1,0,0,1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 → ±0.86603.
    # Group 1 scores 1,1,1,0: mean 0.75, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 → 0.5 and -1.5.
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    mask = torch.ones(8, 3)
    mask[1, 2] = 0  # a shorter response: its padding gets no advantage
    rewards = torch.zeros(8, 3)
    rewards[torch.arange(8), mask.sum(-1).long() - 1] = scores
    index = np.repeat(np.arange(2), 4)
    advantages, returns = compute_advantages("grpo", rewards, mask, index)
    expected = torch.tensor([0.86603, -0.86603, -0.86603, 0.86603, 0.5, 0.5, 0.5, -1.5])
    assert torch.allclose(advantages[:, 0], expected, atol=1e-4)
    assert torch.allclose(advantages, expected[:, None] * mask, atol=1e-4)  # one value per response
    assert advantages[1, 2] == 0
    unscaled, _ = compute_advantages("grpo", rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(unscaled[:, 0], scores - torch.tensor([0.5] * 4 + [0.75] * 4))


def test_policy_loss_clips_the_ratio_at_the_configured_bounds():
    # Token 1: A=+1, ratio 1.5 → clipped to 1 + 0.2: loss -1.2 (clipped).
    # Token 2: A=-1, ratio 0.5 → max(0.5, 0.8) = 0.8 (clipped at 1 - 0.2).
    # Token 3: A=+1, ratio 1.0 → -1.0 (not clipped). token-mean: (-1.2 + 0.8 - 1.0) / 3.
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, metrics = actor_loss(actor(), log_prob=new, old_log_prob=old, advantages=adv, response_mask=mask,
                               ref_log_prob=None, entropy=None, batch_num_tokens=3, global_batch_size=1)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.0) / 3, abs=1e-6)
    assert metrics["mean:actor/pg_clipfrac"] == pytest.approx(2 / 3)
    # A wider upper bound (DAPO's clip-higher) leaves token 1 unclipped: -1.5 instead of -1.2.
    loose, _ = actor_loss(actor(clip_ratio_high=0.6), log_prob=new, old_log_prob=old, advantages=adv,
                          response_mask=mask, ref_log_prob=None, entropy=None, batch_num_tokens=3,
                          global_batch_size=1)
    assert loose.item() == pytest.approx((-1.5 + 0.8 - 1.0) / 3, abs=1e-6)


def test_low_var_kl_and_entropy_terms_enter_the_loss_with_their_coefficients():
    # low_var_kl (k3) with logp = log 0.5, ref = log 0.25: kl = ref - logp = -log 2,
    # exp(kl) - kl - 1 = 0.5 + log 2 - 1 = 0.19315. Ratio 1 and A = 0: the policy term is 0.
    logp = torch.log(torch.full((1, 2), 0.5))
    ref = torch.log(torch.full((1, 2), 0.25))
    entropy = torch.full((1, 2), math.log(8))  # the entropy of a uniform choice among 8 tokens
    loss, metrics = actor_loss(
        actor(use_kl_loss=True, kl_loss_coef=0.5, entropy_coeff=0.1), log_prob=logp, old_log_prob=logp,
        advantages=torch.zeros(1, 2), response_mask=torch.ones(1, 2), ref_log_prob=ref, entropy=entropy,
        batch_num_tokens=2, global_batch_size=1)
    k3 = 0.5 + math.log(2) - 1
    assert metrics["sum:actor/kl_loss"] == pytest.approx(k3, abs=1e-6)
    assert metrics["sum:actor/entropy_loss"] == pytest.approx(math.log(8), abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * k3 - 0.1 * math.log(8), abs=1e-6)


def test_loss_aggregation_modes_weigh_tokens_or_sequences():
    # Response 1 has 1 token of loss 2.0, response 2 has 3 tokens of loss 1.0 (A=-1, ratio 1 → loss = A·-1).
    adv = -torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    zero = torch.zeros(2, 3)

    def loss(mode):
        value, _ = actor_loss(actor(loss_agg_mode=mode), log_prob=zero, old_log_prob=zero, advantages=adv,
                              response_mask=mask, ref_log_prob=None, entropy=None, batch_num_tokens=4,
                              global_batch_size=2)
        return value.item()

    assert loss("token-mean") == pytest.approx((2 + 3) / 4)  # every token counts once
    assert loss("seq-mean-token-mean") == pytest.approx((2 + 1) / 2)  # every response counts once
    assert loss("seq-mean-token-sum") == pytest.approx((2 + 3) / 2)


def test_entropy_of_uniform_logits_is_log_vocab(tiny_model):
    model, vocab = tiny_model
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # every logit 0: a uniform next-token distribution
    ids = torch.randint(vocab, (2, 6))
    logp, entropy = response_log_probs(model, ids, torch.ones_like(ids), 3, 1.0, with_entropy=True)
    assert torch.allclose(entropy, torch.full((2, 3), math.log(vocab)), atol=1e-4)
    assert torch.allclose(logp, torch.full((2, 3), -math.log(vocab)), atol=1e-4)


@pytest.fixture
def tiny_model(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "tiny", corpus=["Ava has 3 apples. #### 3"] * 50, vocab_size=300, seed=0)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, model.config.vocab_size


def _update_batch(model, vocab):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(vocab, (8, 10), generator=generator)
    attention = torch.ones_like(ids)
    mask = torch.ones(8, 4)
    mask[:2, 1:] = 0  # uneven token counts per micro-batch: the normaliser must be the mini-batch's
    attention[:, -4:] = mask.long()
    old, _ = response_log_probs(model, ids, attention, 4, 1.0, with_entropy=False)
    adv = torch.tensor([1.0, -1.0] * 4)[:, None] * mask
    return {"input_ids": ids, "attention_mask": attention, "response_mask": mask,
            "old_log_probs": old.detach(), "advantages": adv, "ref_log_prob": old.detach()}


def test_one_update_changes_the_weights_and_reports_verl_metrics(tiny_model):
    model, vocab = tiny_model
    batch = _update_batch(model, vocab)
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = update_actor(model, optimizer, batch, actor=actor(use_kl_loss=True, entropy_coeff=0.01),
                           mini_batch=8, micro_batch=4, grad_clip=1.0, temperature=1.0)
    changed = [name for name, value in model.state_dict().items() if not torch.equal(value, before[name])]
    assert changed, "no parameter moved"
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert math.isfinite(metrics[name]), name
    assert metrics["actor/grad_norm"] > 0


def test_micro_batches_accumulate_to_the_full_mini_batch_step(tiny_model):
    model, vocab = tiny_model
    batch = _update_batch(model, vocab)
    results = []
    for micro in (8, 2):
        copy_ = copy.deepcopy(model)
        optimizer = torch.optim.SGD(copy_.parameters(), lr=0.1)
        metrics = update_actor(copy_, optimizer, batch, actor=actor(), mini_batch=8, micro_batch=micro,
                               grad_clip=100.0, temperature=1.0)
        results.append((copy_.state_dict(), metrics))
    (full, full_metrics), (accumulated, accumulated_metrics) = results
    assert full_metrics["actor/pg_loss"] == pytest.approx(accumulated_metrics["actor/pg_loss"], abs=1e-6)
    for name, value in full.items():
        assert torch.allclose(value, accumulated[name], atol=1e-6), name
