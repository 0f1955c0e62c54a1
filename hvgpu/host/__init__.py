"""Everything that runs on the GPU host: the agent, its executors and (later)
the slice manager and libvirt integration. Never imported by ``hvgpu.guest``.
"""
