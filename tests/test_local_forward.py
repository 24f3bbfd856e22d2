"""The local trainer's fast paths compute what the plain ones compute.

Group-packed forward (each distinct prompt once for its n samples, no padding) against the plain
padded forward, with and without gradient checkpointing and for both mask-taking attentions; the
static-cache decoder's logits against the Hugging Face forward for each Llama-family architecture;
the sampler (both decoders) against ``model.generate``; the on-policy update (old log-probs from
the update's own first forward) against the two-pass update (a separate old-log-prob pass first).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_grpo_loss_pieces import actor  # verl's ActorConfig as the trainer builds it
from verl.trainer.ppo.core_algos import agg_loss

from verlflow.backends.local.loss import batched_log_probs, response_log_probs, update_actor
from verlflow.backends.local.rollout import left_pad
from verlflow.backends.local.sampling import sample_responses
from verlflow.models.tinymodel import build_tiny_model

N = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", corpus=["Ava has 3 apples. #### 3"] * 50,
                            vocab_size=300, seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _grouped_batch(vocab: int):
    """2 prompts (one left-padded) x N samples, 5 response tokens, uneven response lengths."""
    generator = torch.Generator().manual_seed(0)
    prompts, prompt_mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], 0, torch.device("cpu"))
    responses = torch.randint(3, vocab, (2 * N, 5), generator=generator)
    response_mask = torch.ones_like(responses)
    response_mask[1, 2:] = 0
    response_mask[6, 4:] = 0
    input_ids = torch.cat([prompts.repeat_interleave(N, 0), responses], 1)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(N, 0), response_mask], 1)
    return input_ids, attention_mask, response_mask


def _plain_log_probs(model, ids, attention, response_length, temperature):
    """The reference: one padded forward over every row, prompts repeated, as a plain trainer does."""
    from verl.utils.torch_functional import logprobs_from_logits

    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    return logprobs_from_logits(logits[:, -response_length - 1:-1].float() / temperature, ids[:, -response_length:])


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_packed_log_probs_and_gradients_equal_the_plain_forward(model, checkpointing):
    ids, attention, mask = _grouped_batch(model.config.vocab_size)
    policy = copy.deepcopy(model).train()
    if checkpointing:
        policy.gradient_checkpointing_enable()
    results = []
    for group in (None, 1, N):  # None: the plain padded forward, 1: rows packed alone, N: prompts shared
        policy.zero_grad()
        if group is None:
            log_probs = _plain_log_probs(policy, ids, attention, 5, 0.7)
        else:
            log_probs, _ = response_log_probs(policy, ids, attention, 5, 0.7, with_entropy=True, group=group)
        (log_probs * mask).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
        results.append((log_probs.detach() * mask, grads))
    (plain_lp, plain_grad), *packed = results
    for packed_lp, packed_grad in packed:
        assert torch.allclose(plain_lp, packed_lp, atol=1e-5)
        assert torch.allclose(plain_grad, packed_grad, atol=1e-5, rtol=1e-4)


def test_packing_works_with_eager_attention_too(model, tmp_path):
    from transformers import AutoModelForCausalLM

    model.save_pretrained(tmp_path)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, attention, mask = _grouped_batch(model.config.vocab_size)
    with torch.no_grad():
        packed, _ = response_log_probs(eager, ids, attention, 5, 1.0, with_entropy=False, group=N)
        plain = _plain_log_probs(model, ids, attention, 5, 1.0)
    assert torch.allclose(packed * mask, plain * mask, atol=1e-5)


def test_rows_that_do_not_share_a_prompt_take_the_full_forward(model):
    ids, attention, _ = _grouped_batch(model.config.vocab_size)
    ids[1, 5] = 42  # sample 1 of prompt 0 now has another prompt: no sharing, same answer as group=1
    with torch.no_grad():
        grouped, _ = response_log_probs(model, ids, attention, 5, 1.0, with_entropy=False, group=N)
        plain, _ = response_log_probs(model, ids, attention, 5, 1.0, with_entropy=False)
    assert torch.equal(grouped, plain)


def test_a_response_mask_with_a_hole_takes_the_plain_forward(model):
    ids, attention, mask = _grouped_batch(model.config.vocab_size)
    attention[3, -3] = 0  # not padding: packing cannot express it, so the padded forward runs
    with torch.no_grad():
        ours, _ = response_log_probs(model, ids, attention, 5, 1.0, with_entropy=False, group=N)
        plain = _plain_log_probs(model, ids, attention, 5, 1.0)
    assert torch.equal(ours, plain)


def _random_model(kind: str):
    """A two-layer model of another architecture, random weights, built from its config (offline)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    sizes = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
    config = {"qwen2": lambda: Qwen2Config(**sizes),  # biased q/k/v projections, no per-head norms
              "llama": lambda: LlamaConfig(**sizes, rope_scaling={"rope_type": "linear", "factor": 2.0}),
              "gpt2": lambda: GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4)}[kind]()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama"])
def test_decoder_logits_equal_the_model_forward_at_every_step(model, kind):
    from verlflow.backends.local.decode import StaticCacheDecoder, supports

    net = model if kind == "qwen3" else _random_model(kind)
    assert supports(net)
    prompts, prompt_mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], 0, torch.device("cpu"))
    decoder = StaticCacheDecoder(net)
    logits = decoder.prefill(prompts, prompt_mask, 2, 6)
    sequence, mask = prompts.repeat_interleave(2, 0), prompt_mask.repeat_interleave(2, 0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(6):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            expected = net(input_ids=sequence, attention_mask=mask, position_ids=positions).logits[:, -1]
            assert torch.allclose(logits, expected, atol=1e-5), kind
            token = torch.randint(3, net.config.vocab_size, (len(sequence),), generator=generator)
            sequence = torch.cat([sequence, token[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            logits = decoder.step(token)


def test_other_architectures_sample_through_the_model_forward_and_equal_generate():
    from verlflow.backends.local.decode import supports

    net = _random_model("gpt2")
    assert not supports(net)
    prompts, prompt_mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], 0, torch.device("cpu"))
    ours = sample_responses(net, prompts, prompt_mask, n=2, max_new_tokens=6, eos_ids=[299], pad_id=0,
                            sampling={"do_sample": False})
    theirs = net.generate(input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=6, min_new_tokens=6,
                          do_sample=False, pad_token_id=0, eos_token_id=299)[:, prompts.shape[1]:]
    assert torch.equal(ours[::2], theirs) and torch.equal(ours[1::2], theirs)


def test_cached_greedy_sampling_equals_generate_and_stops_at_eos(model):
    prompts, prompt_mask = left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], 0, torch.device("cpu"))
    greedy = {"do_sample": False}
    ours = sample_responses(model, prompts, prompt_mask, n=2, max_new_tokens=8, eos_ids=[299], pad_id=0,
                            sampling=greedy)
    theirs = model.generate(input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=8, min_new_tokens=8,
                            do_sample=False, pad_token_id=0, eos_token_id=299)[:, prompts.shape[1]:]
    assert torch.equal(ours[::2], theirs) and torch.equal(ours[1::2], theirs)
    eos = int(theirs[0, 2])  # prompt 0's third greedy token as eos: its rows end there, padded after
    stopped = sample_responses(model, prompts, prompt_mask, n=2, max_new_tokens=8, eos_ids=[eos], pad_id=0,
                               sampling=greedy)
    first = int((theirs[0] == eos).nonzero()[0])
    assert stopped[0, first] == eos and (stopped[0, first + 1:] == 0).all()


def test_sampling_keeps_top_k_and_top_p_tokens_only(model):
    from verlflow.backends.local.sampling import next_tokens

    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]] * 2000)
    assert set(next_tokens(logits, {"do_sample": True, "temperature": 1.0, "top_k": 2}).tolist()) == {0, 1}
    # softmax ≈ [0.72, 0.26, 0.013, 0.005]: top_p 0.9 keeps the first two, top_p 0.5 the first only.
    assert set(next_tokens(logits, {"do_sample": True, "top_p": 0.9}).tolist()) == {0, 1}
    assert set(next_tokens(logits, {"do_sample": True, "top_p": 0.5}).tolist()) == {0}


def test_a_draw_follows_the_probabilities_and_never_takes_an_impossible_token():
    from verlflow.backends.local.sampling import draw

    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(100_000, 1)
    frequencies = torch.bincount(draw(probs), minlength=5).float() / len(probs)
    assert frequencies[1] == 0 and frequencies[4] == 0
    assert torch.allclose(frequencies, probs[0], atol=0.01)


def test_on_policy_update_equals_the_two_pass_update(model):
    ids, attention, mask = _grouped_batch(model.config.vocab_size)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)[:, None] * mask
    config = actor(use_kl_loss=True, entropy_coeff=0.01, kl_loss_coef=0.1)
    ref, _ = batched_log_probs(model, ids, attention, 5, 1.0, 8, group=N)
    outcomes = []
    for two_pass in (True, False):
        policy = copy.deepcopy(model)
        batch = {"input_ids": ids, "attention_mask": attention, "response_mask": mask, "advantages": advantages,
                 "ref_log_prob": ref - 0.05}
        if two_pass:  # as the trainer does off-policy: old log-probs and verl's actor/entropy from a first pass
            batch["old_log_probs"], entropy = batched_log_probs(policy, ids, attention, 5, 1.0, 8, group=N,
                                                                with_entropy=True)
            old_entropy = agg_loss(loss_mat=entropy, loss_mask=mask.bool(), loss_agg_mode=config.loss_agg_mode).item()
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        metrics = update_actor(policy, optimizer, batch, actor=config, mini_batch=8, micro_batch=4,
                               grad_clip=100.0, temperature=1.0, group=N)
        outcomes.append((metrics, policy.state_dict()))
    (two, two_weights), (one, one_weights) = outcomes
    assert set(two) | {"actor/entropy"} == set(one)
    for name, value in two.items():
        assert one[name] == pytest.approx(value, abs=1e-5), name
    assert one["actor/entropy"] == pytest.approx(old_entropy, abs=1e-5)
    for name, value in two_weights.items():
        assert torch.allclose(value, one_weights[name], atol=1e-6), name


def test_on_policy_update_refuses_more_than_one_mini_batch(model):
    ids, attention, mask = _grouped_batch(model.config.vocab_size)
    batch = {"input_ids": ids, "attention_mask": attention, "response_mask": mask, "advantages": mask.float()}
    with pytest.raises(ValueError, match="on-policy"):
        update_actor(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.1), batch, actor=actor(),
                     mini_batch=4, micro_batch=4, grad_clip=1.0, temperature=1.0)
