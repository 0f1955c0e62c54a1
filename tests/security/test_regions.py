"""A hostile guest against the region lane: a region is only ever the
guest's own memory, named by checked offsets, within its VM's limit; nothing it
passes or names reaches a host file, another connection's room or the executor's
memory, and the session goes on after each refusal."""

from __future__ import annotations

import array
import fcntl
import mmap
import os
import socket
import threading

import pytest

from hvgpu.errors import CudaError
from hvgpu.host.executor import regions
from hvgpu.host.executor.session import Session
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
from hvgpu.virtio.transport import socket_pair
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame, hello, read_reply

MiB = 1 << 20
ONEWAY = P.FLAG_ONEWAY


def memfd(size: int, seal: bool = True) -> int:
    fd = os.memfd_create("hvgpu-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


class Guest:
    """A raw guest on an in-process session over a unix socket pair."""

    def __init__(self, limit: int = 64 * MiB,
                 executor_regions: regions.ExecutorRegions | None = None,
                 device: FakeDevice | None = None):
        self.device = device or FakeDevice()
        self.executor_regions = executor_regions or regions.ExecutorRegions(limit)
        self.sock, host = socket_pair()
        self.sock.settimeout(30)
        self.session = Session(host, self.device, peer="guest",
                               executor_regions=self.executor_regions)
        self.thread = threading.Thread(target=self.session.serve, daemon=True)
        self.thread.start()
        self.sock.sendall(hello(caps=P.CAP_REGION_MEMFD | P.CAP_REGION_DEVICE))
        _, _, _, status, body = read_reply(self.sock)
        assert status == 0
        self.caps = codec.REPLY[P.OP["HELLO"]].decode(body)[2]
        self.seq = 10

    def call(self, op: str, *values, fds=()):
        self.seq += 1
        data = frame(op, *values, seq=self.seq)
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _ints(fds))])
        else:
            self.sock.sendall(data)
        _, op_, seq, status, body = read_reply(self.sock)
        assert seq == self.seq
        if status:
            return status, codec.ERROR.decode(body)[3]
        return 0, codec.REPLY[P.OP[op]].decode(body)

    def post(self, op: str, *values):
        self.seq += 1
        self.sock.sendall(frame(op, *values, flags=ONEWAY, seq=self.seq))

    def attach_memfd(self, size: int, seal: bool = True):
        fd = memfd(size, seal)
        status, got = self.call("REGION_ATTACH", R.KIND_MEMFD, 0, size, fds=[fd])
        return fd, status, got

    def alloc(self, size: int) -> int:
        status, got = self.call("MEM_ALLOC", size)
        assert status == 0, got
        return got[0]

    def close(self):
        self.sock.close()
        self.thread.join(10)


def _ints(fds) -> bytes:
    return array.array("i", fds).tobytes()


@pytest.fixture
def guest():
    g = Guest()
    yield g
    g.close()


def test_a_memfd_region_carries_copies_both_ways_without_bytes_on_the_socket(guest):
    assert guest.caps & P.CAP_REGION_MEMFD
    fd, status, got = guest.attach_memfd(4 * MiB)
    assert status == 0, got
    region, _, size, token = got
    assert size == 4 * MiB and len(token) == R.TOKEN_SIZE
    view = mmap.mmap(fd, size)
    view[0:8] = b"ABCDEFGH"
    dptr = guest.alloc(1 * MiB)
    guest.post("MEMCPY_HTOD_REGION", dptr, region, 0, 0, 8, 0)
    guest.post("MEMCPY_DTOH_REGION", region, 0, 4096, dptr, 8, 0)
    assert guest.call("STREAM_SYNCHRONIZE", 0)[0] == 0
    assert view[4096:4104] == b"ABCDEFGH"
    assert guest.session.counts["h2d_bytes"] == 8 and guest.session.counts["d2h_bytes"] == 8
    assert guest.device.registered  # page-locked for DMA
    assert guest.call("REGION_DETACH", region)[0] == 0
    assert not guest.device.registered
    assert guest.executor_regions.budget.used == 0
    view.close()
    os.close(fd)


@pytest.mark.parametrize("what", ["unsealed", "pipe", "no-fd", "short", "unaligned"])
def test_what_is_not_a_sealed_memfd_of_the_size_said_is_refused(guest, what):
    size = 1 * MiB
    if what == "pipe":
        r, w = os.pipe()
        status, msg = guest.call("REGION_ATTACH", R.KIND_MEMFD, 0, size, fds=[r])
        os.close(r), os.close(w)
    elif what == "no-fd":
        status, msg = guest.call("REGION_ATTACH", R.KIND_MEMFD, 0, size)
    else:
        fd = memfd(size // 2 if what == "short" else size, seal=what != "unsealed")
        said = size + 100 if what == "unaligned" else size
        status, msg = guest.call("REGION_ATTACH", R.KIND_MEMFD, 0, said, fds=[fd])
        os.close(fd)
    assert status == P.CUDA_ERROR_INVALID_VALUE, msg
    assert not guest.device.registered and guest.executor_regions.budget.used == 0
    assert not guest.session.reader.fds  # the descriptor did not linger
    assert guest.call("PING")[0] == 0  # and the session goes on


def test_offsets_outside_the_region_or_overflowing_are_refused(guest):
    fd, status, got = guest.attach_memfd(1 * MiB)
    region = got[0]
    dptr = guest.alloc(2 * MiB)
    for offset, size in ((MiB - 8, 16), (MiB, 1), ((1 << 64) - 8, 16), (0, 2 * MiB)):
        guest.post("MEMCPY_DTOH_REGION", region, 0, offset, dptr, size, 0)
        status, msg = guest.call("CTX_SYNCHRONIZE")
        assert status == P.CUDA_ERROR_INVALID_VALUE and "outside" in msg, (offset, size, msg)
    guest.post("MEMCPY_HTOD_REGION", dptr, region + 1, 0, 0, 8, 0)  # a region never attached
    status, msg = guest.call("CTX_SYNCHRONIZE")
    assert status == P.CUDA_ERROR_INVALID_VALUE and "not attached" in msg
    # a device address the guest does not own is refused as for any copy
    guest.post("MEMCPY_HTOD_REGION", 0x10, region, 0, 0, 8, 0)
    status, msg = guest.call("CTX_SYNCHRONIZE")
    assert status == P.CUDA_ERROR_INVALID_VALUE
    os.close(fd)


def test_regions_count_against_the_limit_and_come_back_at_disconnect():
    executor_regions = regions.ExecutorRegions(8 * MiB)
    g = Guest(executor_regions=executor_regions)
    fd1, status, _ = g.attach_memfd(6 * MiB)
    assert status == 0
    fd2, status, msg = g.attach_memfd(4 * MiB)
    assert status == P.CUDA_ERROR_OUT_OF_MEMORY and "limit" in msg
    assert executor_regions.budget.used == 6 * MiB
    g.close()
    assert executor_regions.budget.used == 0 and not g.device.registered
    for fd in (fd1, fd2):
        os.close(fd)


def test_a_vm_without_region_offers_none_and_refuses_attach():
    g = Guest(limit=0)
    assert not g.caps & (P.CAP_REGION_MEMFD | P.CAP_REGION_DEVICE)
    fd, status, msg = g.attach_memfd(1 * MiB)
    assert status == P.CUDA_ERROR_OUT_OF_MEMORY and "hvgpu attach --region" in msg
    status, msg = g.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
    assert status == P.CUDA_ERROR_NOT_SUPPORTED and "--region" in msg
    os.close(fd)
    g.close()


def test_a_flood_of_descriptors_is_closed_not_kept(guest):
    before = len(os.listdir("/proc/self/fd"))
    r, w = os.pipe()
    for _ in range(20):
        guest.sock.sendmsg([frame("PING", seq=5)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                     _ints([r, w, r, w]))])
        read_reply(guest.sock)
    assert len(guest.session.reader.fds) <= 4
    guest.close()
    os.close(r), os.close(w)
    assert len(os.listdir("/proc/self/fd")) <= before


def _device_regions(tmp_path, size=4 * MiB):
    path = tmp_path / "hvgpu-vm1"
    with open(path, "wb") as f:
        f.truncate(size)

    def open_device():
        return os.open(path, os.O_RDWR), size

    return regions.ExecutorRegions(size, open_device, vgpu=0), path


def test_the_device_region_is_shared_by_a_vms_connections_but_rooms_are_not(tmp_path):
    executor_regions, path = _device_regions(tmp_path)
    device = FakeDevice()
    a, b = (Guest(executor_regions=executor_regions, device=device),
            Guest(executor_regions=executor_regions, device=device))
    assert a.caps & P.CAP_REGION_DEVICE
    status, (ra, _, size, token) = a.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
    assert status == 0 and size == 4 * MiB
    with open(path, "rb") as f:  # what the guest finds in its BAR
        assert R.unpack_header(f.read(R.HEADER.size)) == (size, token, 0)
    status, (rb, _, _, token_b) = b.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)
    assert token_b == token
    (oa,) = a.call("REGION_ALLOC", ra, 0, 8192)[1]
    (ob,) = b.call("REGION_ALLOC", rb, 0, 8192)[1]
    assert oa >= R.DATA_OFFSET and ob >= R.DATA_OFFSET and abs(oa - ob) >= 8192
    dptr = a.alloc(MiB)
    a.post("MEMCPY_DTOH_REGION", ra, 0, ob, dptr, 16, 0)  # into b's room: refused
    status, msg = a.call("CTX_SYNCHRONIZE")
    assert status == P.CUDA_ERROR_INVALID_VALUE and "not inside an allocation" in msg
    a.post("MEMCPY_DTOH_REGION", ra, 0, 0, dptr, 16, 0)  # the header: nobody's room
    assert a.call("CTX_SYNCHRONIZE")[0] == P.CUDA_ERROR_INVALID_VALUE
    a.post("MEMCPY_DTOH_REGION", ra, 0, oa, dptr, 16, 0)
    assert a.call("CTX_SYNCHRONIZE")[0] == 0
    status, msg = a.call("REGION_FREE", ra, 0, ob)
    assert status == P.CUDA_ERROR_INVALID_VALUE
    a.close()  # its room comes back; b's stays
    assert b.call("REGION_ALLOC", rb, 0, 8192)[1][0] == oa
    b.close()
    assert executor_regions.budget.used == size  # the device region stays mapped with the executor
    executor_regions.close()
    assert executor_regions.budget.used == 0 and not device.registered


def test_rooms_in_the_device_region_are_bounded(tmp_path):
    executor_regions, _ = _device_regions(tmp_path, 1 * MiB)
    g = Guest(executor_regions=executor_regions)
    region = g.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[1][0]
    status, msg = g.call("REGION_ALLOC", region, 0, 2 * MiB)
    assert status == P.CUDA_ERROR_INVALID_VALUE
    got = [g.call("REGION_ALLOC", region, 0, 4096) for _ in range(300)]
    assert got[-1][0] == P.CUDA_ERROR_OUT_OF_MEMORY  # 255 pages after the header
    assert sum(1 for s, _ in got if s == 0) == (1 * MiB - R.DATA_OFFSET) // 4096
    g.close()
    executor_regions.close()


def test_rooms_first_fit_and_coalesce():
    rooms = regions.Rooms(0, 16 * 4096)
    a, b, c = rooms.take(4096), rooms.take(8192), rooms.take(4096)
    assert (a, b, c) == (0, 4096, 3 * 4096)
    rooms.give(b, 8192)
    rooms.give(a, 4096)
    assert rooms.take(3 * 4096) == 0
    assert rooms.take(13 * 4096) is None


F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)


@pytest.mark.parametrize("seal", [fcntl.F_SEAL_WRITE, F_SEAL_FUTURE_WRITE])
def test_a_memfd_sealed_against_writing_is_refused_and_the_session_goes_on(guest, seal):
    fd = memfd(MiB)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seal)  # the executor cannot map it writable
    status, msg = guest.call("REGION_ATTACH", R.KIND_MEMFD, 0, MiB, fds=[fd])
    os.close(fd)
    assert status == P.CUDA_ERROR_INVALID_VALUE and "cannot be mapped" in msg, msg
    assert guest.executor_regions.budget.used == 0 and not guest.device.registered
    assert guest.call("PING")[0] == 0


class _RegisterRefused(FakeDevice):
    """cuMemHostRegister fails; meanwhile the executor opens a descriptor, which gets
    the number the guest's memfd had (the lowest free one, as the kernel gives them)."""

    taken: int | None = None
    opened: int | None = None

    def host_register(self, addr, size):
        null = os.open(os.devnull, os.O_RDONLY)
        if null != self.taken:
            os.dup2(null, self.taken)  # the memfd's number is free again: the Region closed it
            os.close(null)
        self.opened = self.taken
        raise CudaError(999, "cuMemHostRegister: refused")


def test_a_region_that_cannot_be_registered_closes_its_descriptor_once():
    device = _RegisterRefused()
    g = Guest(device=device)
    take_fd = g.session.reader.take_fd

    def spy():
        device.taken = take_fd()
        return device.taken

    g.session.reader.take_fd = spy
    fd, status, msg = g.attach_memfd(MiB)
    os.close(fd)
    assert status == 999, msg
    assert device.opened is not None
    try:
        # the executor's descriptor that now has that number is still its own
        assert os.path.samestat(os.fstat(device.opened), os.stat(os.devnull))
    finally:
        try:
            os.close(device.opened)
        except OSError:
            pass
    assert g.executor_regions.budget.used == 0
    assert g.call("PING")[0] == 0
    g.close()


def test_an_earlier_one_way_error_neither_stops_nor_is_lost_to_the_lanes_bookkeeping(tmp_path):
    """The guest library attaches, allocates and frees on its own; a deferred CUDA error
    must wait for the program's next CUDA call, and a room or region given back must
    be given back (else it stays held while the guest thinks it free)."""
    device_region, _ = _device_regions(tmp_path)
    executor_regions = regions.ExecutorRegions(8 * MiB, device_region.open_device)
    g = Guest(executor_regions=executor_regions)
    dptr = g.alloc(MiB)
    region = g.call("REGION_ATTACH", R.KIND_DEVICE, 0, 0)[1][0]
    fd, status, got = g.attach_memfd(MiB)
    assert status == 0, got
    g.post("MEMSET", 0x10, 1, 0, 1, 0)  # not this guest's memory: a deferred error
    failed = g.seq
    status, got_room = g.call("REGION_ALLOC", region, 0, 8192)
    assert status == 0, got_room
    (room,) = got_room
    assert g.call("REGION_FREE", region, 0, room) == (0, ())
    assert g.call("REGION_DETACH", got[0]) == (0, ())
    assert executor_regions.budget.used == 4 * MiB  # the memfd's share came back
    assert g.call("REGION_ALLOC", region, 0, 8192) == (0, (room,))  # the room came back
    g.seq += 1
    g.sock.sendall(frame("CTX_SYNCHRONIZE", seq=g.seq))
    _, _, _, status, body = read_reply(g.sock)
    assert status == P.CUDA_ERROR_INVALID_VALUE  # reported where a CUDA call would see it
    assert codec.ERROR.decode(body)[2] == failed
    g.post("MEMCPY_DTOH_REGION", region, 0, room, dptr, 16, 0)
    assert g.call("CTX_SYNCHRONIZE")[0] == 0
    os.close(fd)
    g.close()
    executor_regions.close()


def test_regions_per_connection_are_bounded(guest):
    fds = []
    for i in range(regions.MAX_REGIONS + 1):
        fd, status, got = guest.attach_memfd(4096)
        fds.append(fd)
        if i < regions.MAX_REGIONS:
            assert status == 0, got
    assert status == P.CUDA_ERROR_OUT_OF_MEMORY and "at most" in got
    assert guest.executor_regions.budget.used == regions.MAX_REGIONS * 4096
    assert guest.call("PING")[0] == 0
    for fd in fds:
        os.close(fd)


def test_the_device_region_is_taken_whole_or_not_at_all(tmp_path):
    executor_regions, _ = _device_regions(tmp_path)
    g = Guest(executor_regions=executor_regions)
    status, msg = g.call("REGION_ATTACH", R.KIND_DEVICE, 0, 4096)
    assert status == P.CUDA_ERROR_INVALID_VALUE and "0 takes it whole" in msg
    assert not g.session.regions
    status, got = g.call("REGION_ATTACH", R.KIND_DEVICE, 0, 4 * MiB)
    assert status == 0 and got[2] == 4 * MiB
    g.close()
    executor_regions.close()
