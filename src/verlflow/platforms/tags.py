"""The ``device.*`` run tags: what a run says about the machine it ran on and the hardware record it carries.

Written by :mod:`verlflow.device.detect` (``DeviceProfile.tags``, ``hardware_tags``) and
``verlflow.config.schema.Accelerator.tags``; read by compare, the registry's lineage and identity.
"""

TYPE_TAG = "device.type"  # the Device kind: npu | gpu | cpu
NAME_TAG = "device.name"  # the accelerator as its lister names it ("Ascend910B2"), the CPU model on a CPU
COUNT_TAG = "device.count"  # devices as verl counts them (an A3 die is one)
MEMORY_TAG = "device.memory_gb"  # memory per device (GiB)
STACK_TAG = "device.stack"  # the stack the run's profile expects (config/stacks)
# Hardware identity, side by side: what the machine's listing tool names and which record fits it, next to the
# record the run's profile carries (device.record, device.model, device.peak_tflops, …; Accelerator.tags).
DETECTED_TAG = "device.detected"  # the machine's accelerator as listed, with its generation: "Ascend910B2 (A2)"
DETECTED_PROFILE_TAG = "device.detected_profile"  # the shipped profile whose record fits the machine ("none")
RECORD_TAG = "device.record"  # the run profile's record name ("A3")
RECORD_FITS_TAG = "device.record_fits"  # true | false (the user accepted another record: accept_other_hardware)
MODEL_TAG = "device.model"  # the record's accelerator model
NODE_TAG = "device.node"  # the record's node
DEVICES_PER_NODE_TAG = "device.devices_per_node"
PEAK_TFLOPS_TAG = "device.peak_tflops"  # "<peak> <dtype>" per device
DIES_PER_CHIP_TAG = "device.dies_per_chip"
INTERCONNECT_TAG = "device.interconnect"
HBM_GBPS_TAG = "device.hbm_gbps"  # memory bandwidth per device (GB/s)
PREFIX = "device."  # every tag above, and device.<field> of the collected profile (driver, cann, cuda, ...)


def tag(field: str) -> str:
    """``device.<field>``: the tag of one field of the collected device profile (driver, firmware, cann, ...)."""
    return PREFIX + field
DRIVER_TAG = "device.driver"  # the driver (the HDK on Ascend)
FIRMWARE_TAG = "device.firmware"
CANN_TAG = "device.cann"  # Ascend's toolkit version
CUDA_TAG = "device.cuda"  # the CUDA torch was built with (else the driver's)
