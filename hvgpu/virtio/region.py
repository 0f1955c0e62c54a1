"""The region's layout: the header both sides find at its start.

A region is memory the guest and its executor both map: in a libvirt VM an
``ivshmem-plain`` device (``<shmem name='hvgpu-VM'>``, backed by
``/dev/shm/hvgpu-VM`` on the host, PCI BAR 2 in the guest); outside a VM a memfd
the guest passes over the unix socket. Bulk copies name offsets in it instead of
carrying bytes on the socket.

The executor writes the header when a guest attaches the VM's device region; the
guest finds, among the ivshmem devices it sees, the one whose header carries the
token the executor handed back in REGION_ATTACH's reply. The header is advisory: the
guest can overwrite it, and the executor never reads anything back from a region
but the bytes of a copy. Data starts at :data:`DATA_OFFSET`.

The C side (the guest's shim) takes all of this from the header cgen generates.
Pure data: must not map, open or allocate anything.
"""

from __future__ import annotations

import struct

from hvgpu.virtio import protocol as P

MAGIC = b"HVGPUSHM"
VERSION = 1
DATA_OFFSET = 4096  # the header's page; allocations start after it
TOKEN_SIZE = 16
ALIGN = 4096  # allocations in a region start on page boundaries

# The header, in order: (field, type, count); a count above 1 is an array of bytes.
HEADER_FIELDS = (("magic", "u8", len(MAGIC)), ("version", "u32", 1),
                 ("data_offset", "u32", 1), ("size", "u64", 1),  # the region's size
                 ("token", "u8", TOKEN_SIZE), ("device", "u32", 1))  # vGPU device number
HEADER = struct.Struct("<" + "".join(f"{count}s" if count > 1 else P.SCALARS[typ]
                                     for _, typ, count in HEADER_FIELDS))

# REGION_ATTACH kinds
KIND_MEMFD = 1  # a sealed memfd the guest passes with the frame (unix sockets only)
KIND_DEVICE = 2  # the VM's ivshmem region, which the agent opens on the host

PCI_VENDOR = 0x1AF4  # Red Hat, Inc. (QEMU's ivshmem)
PCI_DEVICE = 0x1110  # Inter-VM shared memory
PCI_BAR = 2  # ivshmem-plain's shared memory BAR

# name -> C type of what the C header carries (cgen), as HVGPU_REGION_<name>; the
# header itself is hvgpu_region_header_t there.
C_CONSTANTS = (
    ("MAGIC", "str"), ("VERSION", "i32"), ("DATA_OFFSET", "u64"), ("TOKEN_SIZE", "i32"),
    ("ALIGN", "u64"), ("KIND_MEMFD", "i32"), ("KIND_DEVICE", "i32"), ("PCI_VENDOR", "i32"),
    ("PCI_DEVICE", "i32"), ("PCI_BAR", "i32"),
)


def pack_header(size: int, token: bytes, device: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, DATA_OFFSET, size, token, device)


def unpack_header(data) -> tuple[int, bytes, int] | None:
    """(region size, token, device) from a region's first bytes, or None where they
    are no hvgpu header of this version."""
    if len(data) < HEADER.size:
        return None
    magic, version, offset, size, token, device = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or offset != DATA_OFFSET:
        return None
    return size, token, device


def align_up(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)
