"""Runs in the guest after the slice is attached with --region: the Python API's pinned
memory and a large pageable copy go through the VM's region device, which the
executor's header (and token) identifies. Prints one line per fact; exits 1 on a
wrong byte."""

import ctypes
import os
import sys

from hvgpu.guest import Device
from hvgpu.guest.client import frames_sent
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as layout

COPIES = ("MEMCPY_HTOD", "MEMCPY_DTOH", "MEMCPY_HTOD_REGION", "MEMCPY_DTOH_REGION")

MiB = 1 << 20


def main() -> int:
    dev = Device()
    conn = dev.conn
    before = {op: sum(frames_sent(op)) for op in COPIES}
    pinned = dev.pinned(2 * MiB)
    mode = conn.lane()[0]
    # in the VM's device region, the pinned memory's offset is from the region's start,
    # where the executor's header is
    header = layout.unpack_header(ctypes.string_at(pinned.addr - pinned.offset,
                                                   layout.HEADER.size)) \
        if mode == "device" else None
    print(f"region: {mode}, token {header[1].hex() if header else None}", flush=True)
    pinned.view[:] = os.urandom(2 * MiB)
    buf = dev.allocate(2 * MiB)
    buf.copy_from(pinned.view)
    back = dev.pinned(2 * MiB)
    buf.copy_to(back.view)
    same = bytes(back.view) == bytes(pinned.view)
    print(f"pinned round trip: {'same bytes' if same else 'OTHER BYTES'}", flush=True)
    data = os.urandom(20 * MiB + 123)
    big = dev.allocate(len(data))
    big.copy_from(data)
    staged = bytes(big.copy_to()) == data
    print(f"staged round trip: {'same bytes' if staged else 'OTHER BYTES'}", flush=True)
    sent = {op: sum(frames_sent(op)) - before[op] for op in COPIES}
    print("copies by op: " + ", ".join(f"{op} {n}" for op, n in sorted(sent.items()) if n),
          flush=True)
    print(f"caps: device {bool(conn.caps & P.CAP_REGION_DEVICE)}", flush=True)
    return 0 if same and staged else 1


if __name__ == "__main__":
    sys.exit(main())
