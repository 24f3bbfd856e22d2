"""Write a checkpoint in verl's FSDP layout the way verl's actor worker does: a model wrapped in
FSDP on a real torch.distributed process group (gloo, CPU), saved by verl's own FSDPCheckpointManager.

    python tests/standins/fsdp_checkpoint.py MODEL_DIR OUT_DIR/global_step_2/actor --world-size 2 [--fsdp 2]

Each rank writes ``model_world_size_{W}_rank_{R}.pt`` (+ optim / extra_state); rank 0 writes
``fsdp_config.json`` and ``huggingface/`` (config, tokenizer). A test helper, not product code.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _save_rank(rank: int, world_size: int, port: int, model_dir: str, actor_dir: str, fsdp: int, step: int) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if fsdp == 1:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            wrapped = FSDP(model, use_orig_params=True)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("fsdp",))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        # One optimizer step so the weights differ from the initial ones and the optimizer has state.
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        wrapped(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        manager = FSDPCheckpointManager(model=wrapped, optimizer=optimizer, lr_scheduler=None,
                                        processing_class=tokenizer)
        manager.save_checkpoint(local_path=actor_dir, global_step=step)
        if rank == 0 and fsdp == 1:
            with FSDP.summon_full_params(wrapped, rank0_only=True, writeback=False):
                torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                           os.path.join(actor_dir, "..", "expected_state.pt"))
        elif fsdp == 2:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:
                torch.save(full, os.path.join(actor_dir, "..", "expected_state.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save_fsdp_checkpoint(model_dir: str, actor_dir: str, *, world_size: int = 1, fsdp: int = 1, step: int = 1) -> None:
    """Save ``model_dir``'s model as verl's actor checkpoint in ``actor_dir`` from ``world_size`` ranks.

    Also writes ``<actor_dir>/../expected_state.pt``: the full (unsharded) fp32 state dict after the
    optimizer step, for the test to compare the merged model against.
    """
    import torch.multiprocessing as mp

    port = _free_port()
    if world_size == 1:
        _save_rank(0, 1, port, model_dir, actor_dir, fsdp, step)
    else:
        mp.start_processes(_save_rank, args=(world_size, port, model_dir, actor_dir, fsdp, step),
                           nprocs=world_size, start_method="spawn", join=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("actor_dir")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--fsdp", type=int, default=1, choices=(1, 2))
    parser.add_argument("--step", type=int, default=1)
    args = parser.parse_args()
    save_fsdp_checkpoint(args.model_dir, args.actor_dir, world_size=args.world_size, fsdp=args.fsdp, step=args.step)
    sys.exit(0)
