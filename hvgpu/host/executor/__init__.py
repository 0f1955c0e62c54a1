"""The executor: one process per guest connection, holding that guest's CUDA
context on the real GPU and serving its data lane.

``cuda_device`` is the only module in hvgpu that imports CUDA. ``session``
speaks the protocol and validates every handle and address against what this
guest owns; it must not import CUDA, so it runs unchanged over the test double
in ``tests/``.
"""
