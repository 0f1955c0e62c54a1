"""The executor: one process per guest connection, holding that guest's CUDA
context on the real GPU and serving its data lane.

``cuda_device`` is the only package in hvgpu that imports CUDA. ``session``
speaks the protocol and serves every op through ``ops``, which validates every
handle and address against what this guest owns; neither imports CUDA, so both
run unchanged over the test double in ``tests/``.
"""
