"""Runs in the guest after the slice is attached with --shm: the Python API's pinned
memory and a large pageable copy go through the VM's shared-memory device, which the
executor's header (and token) identifies. Prints one line per fact; exits 1 on a
wrong byte."""

import os
import sys

from hvgpu.guest import Device
from hvgpu.virtio import protocol as P

MiB = 1 << 20


def main() -> int:
    dev = Device()
    conn = dev.conn
    sent = []
    post = conn.post

    def counting_post(op, *values, **kw):
        sent.append(op)
        return post(op, *values, **kw)

    conn.post = counting_post
    pinned = dev.pinned(2 * MiB)
    lane = conn.shared
    print(f"region: {lane.mode}, token {lane.token.hex() if lane.token else None}", flush=True)
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
    print("copies by op: " + ", ".join(f"{op} {sent.count(op)}" for op in sorted(set(sent))
                                        if "MEMCPY" in op), flush=True)
    print(f"caps: device {bool(conn.caps & P.CAP_SHM_DEVICE)}", flush=True)
    return 0 if same and staged else 1


if __name__ == "__main__":
    sys.exit(main())
