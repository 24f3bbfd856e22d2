"""The Ascend NPU: torch_npu, HCCL, ``npu-smi``, verl's ``npu`` profiler tool, the A3 node by default."""

from types import MappingProxyType

from verlflow.platforms.base import Platform

PLATFORM = Platform(
    kind="npu", word="NPU", torch_type="npu", default_profile="a3", torch_extension="torch_npu",
    visible_devices_var="ASCEND_RT_VISIBLE_DEVICES", ray_resource="NPU", collective_backend="hccl",
    collective_env_prefix="HCCL_", profiler_tool="npu", lister=("npu-smi", "info"),
    collector="verlflow.device.npu_listing",
    import_check="import torch, torch_npu; n = torch.npu.device_count(); assert n > 0, 'torch.npu.device_count() is 0'",
    # verlflow.device.npu_monitor's names
    system_metric_keys=MappingProxyType({"util": "utilization_percentage", "mem_mb": "hbm_usage_megabytes",
                                         "mem_pct": "hbm_usage_percentage", "power": "power_watts"}),
)
