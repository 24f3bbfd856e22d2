"""The CUDA GPU: a CUDA build of torch, NCCL, ``nvidia-smi``, torch's profiler, the H20 node by default."""

from types import MappingProxyType

from verlflow.platforms.base import Platform

PLATFORM = Platform(
    kind="gpu", word="CUDA GPU", torch_type="cuda", default_profile="h20", needs_cuda_torch=True,
    visible_devices_var="CUDA_VISIBLE_DEVICES", ray_resource="GPU", collective_backend="nccl",
    collective_env_prefix="NCCL_", profiler_tool="torch", lister=("nvidia-smi",),
    collector="verlflow.device.gpu_listing",
    import_check="import torch; assert torch.cuda.is_available(), f'torch.cuda.is_available() is False (torch.version."
                 "cuda={torch.version.cuda})'",
    # MLflow's GPUMonitor's names
    system_metric_keys=MappingProxyType({"util": "utilization_percentage", "mem_mb": "memory_usage_megabytes",
                                         "mem_pct": "memory_usage_percentage", "power": "power_usage_watts"}),
)
