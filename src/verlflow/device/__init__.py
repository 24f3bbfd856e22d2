"""The machine: which device it has, what its tools say, what it records while training, what it lacks.

- :mod:`.detect`: npu | gpu | cpu, and the device profile logged as tags (chips, memory, driver, versions); the kinds
  themselves are :mod:`verlflow.platforms` (what each is called, listed by, narrowed by), which this package asks.
- :mod:`.probe`: the machine as commands, files and modules (recorded in tests); :mod:`.listing`,
  :mod:`.npu_listing`, :mod:`.gpu_listing`: each platform's collector of its lister's output.
- :mod:`.identity`: which shipped record fits the listed accelerator (SKU included), the refusal of a profile
  that is not the machine's, a run's record from its ``device.name``, and one accelerator across two runs.
- :mod:`.parsers`: pure parsers of ``npu-smi`` / ``nvidia-smi`` / CANN files (tested on recorded outputs).
- :mod:`.system_metrics`, :mod:`.npu_monitor`: ``system/*`` metrics during a train run (MLflow's + Ascend).
- :mod:`.stacks`: the guide's cluster images as data, and the resolution check against them.
- :mod:`.doctor`: the ``doctor`` step — can verl launch here, and what differs from the guide's stack.
"""
