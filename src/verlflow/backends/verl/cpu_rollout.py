"""An ``hf`` rollout for verl on the CPU: transformers' ``generate`` behind verl's async rollout interface.

    actor_rollout_ref.rollout.name=hf   # with the cpu-verl profile (VERL_USE_EXTERNAL_MODULES loads this)

verl >= 0.9 generates through a rollout *server* (vLLM, SGLang, TRT-LLM: Ray actors answering
``generate(prompt_ids, sampling_params) -> TokenOutput``) plus a *server adapter* inside each trainer worker
that pushes new weights to it. None of those servers runs without an accelerator, so this module supplies
the three pieces verl's registries ask for:

- :class:`HFRolloutServer`, a Ray actor holding a transformers model: one request at a time, sampled
  tokens and their log-probs (from the raw logits, as vLLM reports them); sleep/wake are no-ops;
- :class:`HFReplica`, registered in ``RolloutReplicaRegistry``: starts that actor under a fixed name;
- :class:`HFServerAdapter`, registered in ``_ROLLOUT_REGISTRY``: ``update_weights`` gathers the actor's
  state dict and hands it to the server.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
import torch

ROLLOUT_NAME = "hf"


def server_name(replica_rank: int, suffix: str = "") -> str:
    """The Ray actor name of a replica's server (the adapter finds it by this name)."""
    return f"verlflow_hf_server_{replica_rank}{suffix}"


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


class HFRolloutServer:
    """A transformers model answering verl's token-in/token-out ``generate`` (a Ray actor)."""

    def __init__(self, config: Any, model_config: Any):
        from transformers import AutoModelForCausalLM

        self.config = config
        path = _get(model_config, "local_path") or _get(model_config, "path")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()
        generation = self.model.generation_config
        self.eos_token_id = generation.eos_token_id
        self.pad_token_id = generation.pad_token_id if generation.pad_token_id is not None else self.eos_token_id
        self.global_steps: int | None = None
        self._lock = asyncio.Lock()

    def ready(self) -> bool:
        """Answers once the model is loaded."""
        return True

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data=None, video_data=None, **_kwargs):
        """Sample one response to ``prompt_ids``; token ids, their log-probs and the stop reason."""
        from verl.workers.rollout.replica import TokenOutput

        async with self._lock:
            tokens, log_probs = await asyncio.to_thread(self._generate, prompt_ids, sampling_params)
        stop = "completed" if tokens and tokens[-1] in self._eos_ids() else None
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason=stop,
                           extra_fields={"global_steps": self.global_steps})

    def _eos_ids(self) -> set[int]:
        eos = self.eos_token_id
        return set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float]]:
        limit = int(_get(self.config, "response_length", 512))
        max_tokens = min(int(params.get("max_tokens") or params.get("max_new_tokens") or limit), limit)
        temperature = float(params.get("temperature", 1.0) or 0.0)
        kwargs: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            top_k = int(params.get("top_k", -1) or -1)
            kwargs.update(temperature=temperature, top_p=float(params.get("top_p", 1.0)), top_k=max(top_k, 0))
        ids = torch.tensor([prompt_ids], dtype=torch.long)  # [1, prompt_len]
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                  eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                                  return_dict_in_generate=True, output_logits=True, **kwargs)
        tokens = out.sequences[0, ids.shape[1]:].tolist()  # [response_len]
        logits = torch.stack(out.logits, dim=1)[0, : len(tokens)].float()  # [response_len, vocab]
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)
        return tokens, log_probs.tolist()

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> int:
        """Load the trainer's new weights; returns how many tensors were loaded."""
        current = self.model.state_dict()
        loadable = {k: v.to(current[k].dtype) for k, v in state_dict.items() if k in current}
        self.model.load_state_dict(loadable, strict=False)
        return len(loadable)

    def set_global_steps(self, global_steps: int) -> None:
        """The training step whose weights are loaded (reported with every response)."""
        self.global_steps = global_steps

    # Memory is not an issue on the CPU: sleeping, waking and cache control do nothing.
    def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    def sleep(self) -> None:
        return None

    def clear_kv_cache(self) -> None:
        return None

    def release_kv_cache(self) -> None:
        return None

    def resume_kv_cache(self) -> None:
        return None

    def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    def resume_generation(self) -> None:
        return None

    def start_profile(self, **_kwargs) -> None:
        return None

    def stop_profile(self) -> None:
        return None


def _replica_base():
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


def _adapter_base():
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFReplica(_replica_base()):
    """One ``hf`` rollout server per replica, started as a named Ray actor on the CPU."""

    async def launch_servers(self):
        """Start the server actor and wait until its model is loaded."""
        name = server_name(self.replica_rank, self.name_suffix)
        server = ray.remote(HFRolloutServer).options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
        handle = server.remote(config=self.config, model_config=self.model_config)
        await handle.ready.remote()
        self.servers = [handle]
        self._server_handle = handle
        self._server_address = f"hf://{name}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(_adapter_base()):
    """Inside each trainer worker: pushes the actor's weights to its replica's ``hf`` server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self._has_server = rank % size == 0
        self._server = None

    def _handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int | None = None, wire_format: str = "named_tensors",
                             **_kwargs):
        """Gather full tensors (every rank takes part: DTensor gathers are collective) and send them."""
        if wire_format != "named_tensors":
            raise ValueError(f"the hf rollout takes wire_format='named_tensors', not {wire_format!r}")
        state: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if self._has_server:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self._has_server:
            server = self._handle()
            await server.update_weights.remote(state)
            if global_steps is not None:
                await server.set_global_steps.remote(global_steps)

