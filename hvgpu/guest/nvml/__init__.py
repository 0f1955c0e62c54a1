"""The sources of the guest's ``libnvidia-ml.so.1`` (NVML answered by the agent).

setup.py compiles them, with the CUDA shim's wire.c, into
``hvgpu/guest/shim/libnvidia-ml.so.1``, beside ``libcuda.so.1``, so that
``hvgpu-guest run`` and ``hvgpu-guest ldconfig`` put both on the library path.
Nothing here is imported at run time.
"""
