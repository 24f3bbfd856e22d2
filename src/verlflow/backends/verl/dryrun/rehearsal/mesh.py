"""What verl checks once its workers hold devices, checked by arithmetic for the profile's world size.

verl builds its device meshes and splits its batches inside the Ray workers, so these asserts cannot be
rehearsed without the devices. Each rule below is the arithmetic of one verl (or vLLM) statement, for
``world = trainer.n_gpus_per_node × trainer.nnodes``; the model's shape is read from its ``config.json``:

- Ulysses sequence parallelism (actor, and the reference policy's own size):
  ``models/transformers/monkey_patch.py`` asserts ``num_attention_heads % sp == 0`` and
  ``num_key_value_heads % sp == 0 or sp % num_key_value_heads == 0``; the mesh needs ``world % sp == 0``
  (``workers/engine/fsdp/transformer_impl.py``: ``init_device_mesh(world // sp, sp)``).
- The rollout mesh: ``workers/engine_workers.py:ActorRolloutRefWorker.init_model`` asserts
  ``world % (tensor_model_parallel_size × data_parallel_size × pipeline_model_parallel_size) == 0``.
- The engine workers' mini-batches (verl >= 0.9): ``workers/engine_workers.py:TrainingWorker.train_mini_batch``
  asserts ``ppo_mini_batch_size × n % dp == 0``, and ``utils/tensordict_utils.py:make_iterator`` that the
  per-rank batch ``train_batch_size × n / dp`` splits into whole per-rank mini-batches.
- vLLM's length: ``max_model_len`` (or, unset, prompt + response) at most the model's
  ``max_position_embeddings`` (vLLM ``ModelConfig``: "User-specified max_model_len … is greater than the
  derived max_model_len").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verlflow.backends.verl.dryrun.keys import ACTOR, REF, ROLLOUT
from verlflow.backends.verl.dryrun.rehearsal.raise_sites import value_of
from verlflow.errors import Problem


def _count(cfg: DictConfig, key: str) -> int | None:
    value = value_of(cfg, key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def model_shape(folder: str | None) -> dict[str, Any]:
    """The fields of a local model's ``config.json`` these rules read ({} when there is no such file)."""
    if not folder:
        return {}
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    return {k: text.get(k) for k in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")}


def _sequence_parallel_sizes(world: int, heads: Any, kv_heads: Any) -> str:
    """The Ulysses sizes every rule below accepts: dividing the devices and the heads, kv heads dividing or divided
    (1 turns sequence parallelism off)."""
    return ", ".join(str(d) for d in range(1, world + 1) if world % d == 0
                     and (not isinstance(heads, int) or heads % d == 0)
                     and (not isinstance(kv_heads, int) or kv_heads % d == 0 or d % kv_heads == 0))


def sequence_parallel_problems(cfg: DictConfig, shape: dict[str, Any], world: int) -> list[Problem]:
    """Ulysses sizes that do not divide the devices or the model's attention heads; the sizes offered fit both."""
    problems = []
    heads, kv_heads = shape.get("num_attention_heads"), shape.get("num_key_value_heads")
    fits = _sequence_parallel_sizes(world, heads, kv_heads)
    for section in (ACTOR, REF):
        key = f"{section}.ulysses_sequence_parallel_size"
        sp = _count(cfg, key)
        if not sp or sp == 1:
            continue
        if world % sp:
            problems.append(Problem(key, sp, f"the device mesh is (world // sp, sp) and {world} devices do not "
                                             f"split into groups of {sp}: use one of {fits}"))
        elif isinstance(heads, int) and heads % sp:
            problems.append(Problem(key, sp, f"the model's {heads} attention heads do not split over {sp} ranks "
                                             f"(verl's Ulysses patch asserts it): use one of {fits} (they divide "
                                             f"the heads and the {world} devices)"))
        elif isinstance(kv_heads, int) and kv_heads % sp and sp % kv_heads:
            problems.append(Problem(key, sp, f"the model's {kv_heads} key/value heads and {sp} ranks must divide "
                                             f"one another (verl's Ulysses patch asserts it): use one of {fits}"))
    return problems


def rollout_mesh_problems(cfg: DictConfig, world: int) -> list[Problem]:
    """A rollout mesh (tensor × data × pipeline parallel) that does not divide the devices."""
    tp = _count(cfg, f"{ROLLOUT}.tensor_model_parallel_size") or 1
    dp = _count(cfg, f"{ROLLOUT}.data_parallel_size")
    pp = _count(cfg, f"{ROLLOUT}.pipeline_model_parallel_size") or 1
    if dp is None or world % (tp * pp) or world % (tp * dp * pp) == 0:  # tp itself is the size checks' to report
        return []
    fits = [d for d in range(1, world + 1) if world % (tp * d * pp) == 0]
    return [Problem(f"{ROLLOUT}.data_parallel_size", dp, (
        f"the rollout mesh tensor_model_parallel_size × data_parallel_size × pipeline_model_parallel_size = "
        f"{tp} × {dp} × {pp} must divide the {world} devices: use data_parallel_size in {', '.join(map(str, fits))}"))]


def mini_batch_problems(cfg: DictConfig, world: int) -> list[Problem]:
    """verl >= 0.9's engine workers: mini-batches that do not split over the data-parallel ranks."""
    batch, n = _count(cfg, "data.train_batch_size"), _count(cfg, f"{ROLLOUT}.n")
    mini = _count(cfg, f"{ACTOR}.ppo_mini_batch_size")
    sp = _count(cfg, f"{ACTOR}.ulysses_sequence_parallel_size") or 1
    if not (batch and n and mini) or world % sp:
        return []
    dp = world // sp
    key = f"{ACTOR}.ppo_mini_batch_size"
    if (mini * n) % dp:
        return [Problem(key, mini, (
            f"ppo_mini_batch_size × rollout.n = {mini} × {n} = {mini * n} must split over the {dp} data-parallel "
            f"ranks (the engine worker asserts it): use a multiple of {dp // _gcd(n, dp)} that divides "
            f"data.train_batch_size={batch}"))]
    per_rank_batch, per_rank_mini = batch * n // dp, mini * n // dp
    if (batch * n) % dp == 0 and per_rank_batch % per_rank_mini:
        fits = [m for m in range(1, batch + 1) if batch % m == 0 and (m * n) % dp == 0]
        return [Problem(key, mini, (
            f"each rank's batch train_batch_size × n / {dp} = {per_rank_batch} does not split into its "
            f"mini-batches of {mini} × {n} / {dp} = {per_rank_mini}: use one of {', '.join(map(str, fits[-8:]))}"))]
    return []


def gen_batch_problems(cfg: DictConfig, world: int, *, engine_workers: bool) -> list[Problem]:
    """``data.gen_batch_size``: the dataloader's batch when set (``ray_trainer._create_dataloader``), so each step's
    ``gen_batch_size × n`` responses are what verl splits over the ranks (``protocol.py:DataProto.chunk``
    asserts ``len % chunks == 0``) and, on the engine workers, into mini-batches (``make_iterator``)."""
    gen, n = _count(cfg, "data.gen_batch_size"), _count(cfg, f"{ROLLOUT}.n")
    if not gen or not n or gen == _count(cfg, "data.train_batch_size"):
        return []
    key = "data.gen_batch_size"
    if (gen * n) % world:
        return [Problem(key, gen, (
            f"each step's gen_batch_size × rollout.n = {gen} × {n} = {gen * n} responses must split evenly over the "
            f"{world} devices (verl's DataProto.chunk asserts it): use a multiple of {world // _gcd(n, world)}"))]
    mini = _count(cfg, f"{ACTOR}.ppo_mini_batch_size")
    sp = _count(cfg, f"{ACTOR}.ulysses_sequence_parallel_size") or 1
    if engine_workers and mini and world % sp == 0 and (mini * n) % (world // sp) == 0:
        per_rank, per_mini = gen * n // (world // sp), mini * n // (world // sp)
        if per_rank % per_mini:
            return [Problem(key, gen, (
                f"each rank's share of a step, gen_batch_size × n / {world // sp} = {per_rank}, does not split into "
                f"its mini-batches of {per_mini} (ppo_mini_batch_size={mini}): use a multiple of {mini}"))]
    return []


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def length_problems(cfg: DictConfig, shape: dict[str, Any]) -> list[Problem]:
    """A rollout length longer than the model's positions (vLLM refuses it when the engine starts)."""
    positions = shape.get("max_position_embeddings")
    if not isinstance(positions, int):
        return []
    max_len = _count(cfg, f"{ROLLOUT}.max_model_len")
    if max_len and max_len > positions:
        return [Problem(f"{ROLLOUT}.max_model_len", max_len, (
            f"longer than the model's max_position_embeddings={positions}: vLLM refuses it; use at most {positions}"))]
    prompt, response = _count(cfg, "data.max_prompt_length"), _count(cfg, "data.max_response_length")
    if not max_len and prompt and response and prompt + response > positions:
        return [Problem("data.max_response_length", response, (
            f"max_prompt_length + max_response_length = {prompt + response} exceeds the model's "
            f"max_position_embeddings={positions}, which verl 0.5.0's vLLM rollout asserts they fit "
            f"(vllm_rollout_spmd.py:120): shorten them to at most {positions} together"))]
    return []


def device_problems(cfg: DictConfig, model_folder: str | None, *, engine_workers: bool) -> list[Problem]:
    """Every rule of this module for the config's world size and the model at ``model_folder``."""
    per_node, nodes = _count(cfg, "trainer.n_gpus_per_node"), _count(cfg, "trainer.nnodes")
    if not (per_node and nodes):
        return []
    world = per_node * nodes
    shape = model_shape(model_folder)
    problems = (sequence_parallel_problems(cfg, shape, world) + length_problems(cfg, shape)
                + gen_batch_problems(cfg, world, engine_workers=engine_workers))
    if engine_workers:
        problems += rollout_mesh_problems(cfg, world) + mini_batch_problems(cfg, world)
    return problems
