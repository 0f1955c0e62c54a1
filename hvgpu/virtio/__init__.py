"""The wire shared by host and guest: addresses, protocol table, codec,
framing and transports.

Nothing here knows about CUDA, libvirt or slices; ``transport`` is the only
module in hvgpu that creates sockets.
"""
