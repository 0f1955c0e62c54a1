"""hvgpu: share a host's NVIDIA GPUs among its libvirt/KVM virtual machines.

The package is split by where code runs: ``hvgpu.virtio`` is the wire that
both sides speak, ``hvgpu.host`` runs on the GPU host, ``hvgpu.guest`` runs in
a VM that has no GPU. This top-level module holds only what both sides share
and must not import either side.
"""

__version__ = "0.1.0"
