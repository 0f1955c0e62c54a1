"""Runs in the guest: finds the VM's region device (QEMU's ivshmem-plain) by
its region's token with the guest's C client library (hvgpu_region_find, the code
the Python API's lane and the shim both run), reads its header and writes a pattern
the host reads back from the /dev/shm file behind the device (tests/vm/vm.py).

    guest_region.py TOKEN_FILE root         as root: map, check, write PATTERN at PATTERN_OFFSET
    guest_region.py TOKEN_FILE user NAME    as user NAME (its groups from /etc/group, as at
                                         login): map, write USER_MARK after the pattern
    guest_region.py TOKEN_FILE shim         the shim's own lookup (hvgpu_region_find), through
                                         ctypes: map, read the header, write SHIM_MARK

Prints one line per fact; exits 1 when the region is not found or cannot be mapped.
The host also imports :func:`pattern` and the offsets, to check what came back.
"""

import ctypes
import errno
import hashlib
import sys

from hvgpu.virtio import region as layout

PATTERN_SIZE = 64 << 10  # sixteen pages
# Above the room the executor hands out later in the run (staging slots and pinned
# memory are taken first-fit from DATA_OFFSET), so what these steps wrote stays.
PATTERN_OFFSET = 48 << 20
USER_OFFSET = PATTERN_OFFSET + PATTERN_SIZE
USER_MARK = b"written by an ordinary user of the guest"
TAIL_MARK = b"the region's last bytes"
SHIM_OFFSET = USER_OFFSET + 4096
SHIM_MARK = b"written through the shim's mapping"


def pattern(token: bytes) -> bytes:
    """What the guest writes at DATA_OFFSET: derived from the token, so no other run's
    bytes can pass for it."""
    out, block = bytearray(), token
    while len(out) < PATTERN_SIZE:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:PATTERN_SIZE])


def token(path: str) -> bytes:
    """The region's token. The host test writes the header and hands the token over in
    a file; once the executor serves REGION_ATTACH, the token comes from its reply."""
    with open(path) as f:
        return bytes.fromhex(f.read().strip())


def become(name: str) -> None:
    import os
    import pwd

    user = pwd.getpwnam(name)
    os.initgroups(name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    print(f"as uid {os.getuid()}, groups {sorted(os.getgroups())}", flush=True)


def shim(want: bytes) -> int:
    import ctypes

    from hvgpu.guest.shim import library

    lib = ctypes.CDLL(str(library()))
    lib.hvgpu_region_error.restype = ctypes.c_char_p
    base, size = ctypes.c_void_p(), ctypes.c_uint64()
    rc = lib.hvgpu_region_find(want, 0, ctypes.byref(base), ctypes.byref(size))
    print(f"hvgpu_region_find: {rc} {lib.hvgpu_region_error().decode()}".rstrip(), flush=True)
    if rc != 0:
        return 1
    header = layout.unpack_header(ctypes.string_at(base.value, layout.HEADER.size))
    carries = header is not None and header[1] == want
    print(f"mapped {size.value} bytes; header {'carries the token' if carries else header}",
          flush=True)
    ctypes.memmove(base.value + SHIM_OFFSET, SHIM_MARK, len(SHIM_MARK))
    print(f"wrote {len(SHIM_MARK)} bytes at {SHIM_OFFSET}", flush=True)
    return 0


def find(lib, want: bytes):
    """(base, size) of the device carrying want for vGPU 0, or None having said why."""
    lib.hvgpu_region_error.restype = ctypes.c_char_p
    base, size = ctypes.c_void_p(), ctypes.c_uint64()
    rc = lib.hvgpu_region_find(want, 0, ctypes.byref(base), ctypes.byref(size))
    if rc == 0:
        return base.value, size.value
    said = lib.hvgpu_region_error().decode()
    if rc == -errno.ENOENT:
        print(f"no device carries the token: {said}", flush=True)
    else:
        code = "region-permission" if rc in (-errno.EACCES, -errno.EPERM) else "region-device"
        print(f"RegionError {code}: {said}", flush=True)
    return None


def main(argv: list[str]) -> int:
    from hvgpu.guest.client import library
    from hvgpu.guest.install import devices

    want = token(argv[1])
    if argv[2] == "shim":
        return shim(want)
    if argv[2] == "user":
        become(argv[3])
    for dev in devices():
        print(f"device {dev.address}: {dev.resource}, {dev.size} bytes", flush=True)
    found = find(library(), want)
    if found is None:
        return 1
    base, mapped = found
    size, got, device = layout.unpack_header(ctypes.string_at(base, layout.HEADER.size))
    print(f"found: header size {size}, vGPU {device}, token "
          f"{'matches' if got == want else 'DIFFERS'}, mapped {mapped} bytes at {base:#x}",
          flush=True)
    if argv[2] == "user":
        ctypes.memmove(base + USER_OFFSET, USER_MARK, len(USER_MARK))
        print(f"wrote {len(USER_MARK)} bytes at {USER_OFFSET}", flush=True)
    else:
        ctypes.memmove(base + PATTERN_OFFSET, pattern(want), PATTERN_SIZE)
        ctypes.memmove(base + mapped - len(TAIL_MARK), TAIL_MARK, len(TAIL_MARK))
        back = ctypes.string_at(base + PATTERN_OFFSET, PATTERN_SIZE)
        print(f"wrote {PATTERN_SIZE} bytes at {PATTERN_OFFSET} and the tail; read "
              f"back {'the same' if back == pattern(want) else 'OTHER BYTES'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
