"""Where training happens: :mod:`.verl` (verl itself, on NPU/GPU nodes) or :mod:`.local` (the embedded trainer).

:mod:`.train_setup` chooses one from the device and the ``backend`` parameter; both take the same composed
config and log the same metric names.
"""
