"""The guest's end of the shared-memory lane: pinned memory and staged copies.

A connection whose agent offers a region (HELLO's CAP_SHM_DEVICE in a VM with
``hvgpu attach --shm``; CAP_SHM_MEMFD on a unix socket) gets one on its first
large copy or pinned allocation:

- the VM's device region: SHM_ATTACH(kind 2) answers with a token, and
  ``hvgpu.guest.region`` finds the ivshmem BAR whose header carries it;
- otherwise a sealed memfd, passed with SHM_ATTACH(kind 1).

Pinned memory (``PinnedMemory``: ``Device.pinned``) is room in the region, so a
copy from or to it names an offset and the host's DMA does the rest. A large
pageable copy is staged through two slots of the region: the guest copies one
chunk (``parallel_copy``: on a few threads) while the host's DMA moves the other,
each slot reused only after its fence (a STREAM_SYNCHRONIZE sent without waiting)
has answered; a copy that fails returns only once its DMA is over. Where no region
can be had, ``upload``/``download`` say so (False) and the socket carries the
bytes as before.

Must not import ``hvgpu.host``; maps only memory the agent handed over (a BAR)
or memory it made itself (a memfd).
"""

from __future__ import annotations

import bisect
import ctypes
import fcntl
import logging
import mmap
import os

from hvgpu.errors import CudaError, HvgpuError
from hvgpu.guest import parallel_copy
from hvgpu.guest import region as guest_region
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio import region as R
# Staged as the libcuda shim stages: one definition for both (tuning.py).
from hvgpu.virtio.tuning import STAGE_CHUNK, STAGE_MIN, STAGE_SLOTS

log = logging.getLogger(__name__)

_SYNC = P.OP["STREAM_SYNCHRONIZE"]


def address_of(view: memoryview) -> int | None:
    """The address of a writable buffer's first byte, or None (read-only)."""
    if view.readonly or not view.nbytes:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class _Mapping:
    """Memory both sides map: (region id, the guest's mmap, its address)."""

    def __init__(self, region: int, size: int, mem, owned_fd: int | None = None):
        self.region, self.size, self.mem = region, size, mem
        self._anchor = (ctypes.c_char * size).from_buffer(mem)
        self.addr = ctypes.addressof(self._anchor)
        self.fd = owned_fd

    def close(self) -> None:
        self._anchor = None
        try:
            self.mem.close()
        except BufferError:  # views of it are still alive; the mapping goes with them
            pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class PinnedMemory:
    """Page-locked host memory in the shared region: ``view`` is writable, and
    copies from and to it (or any buffer inside it) are DMA on the host. A copy
    from it returns before the DMA has read it: change it only after a sync."""

    def __init__(self, lane: "SharedLane", mapping: _Mapping, offset: int, size: int,
                 whole_region: bool):
        self.lane, self.mapping, self.offset, self.size = lane, mapping, offset, size
        self.whole_region = whole_region
        self.addr = mapping.addr + offset
        self.view = memoryview(mapping.mem)[offset:offset + size]

    def __repr__(self) -> str:
        return f"<hvgpu PinnedMemory {self.size} bytes in region {self.mapping.region}>"

    def close(self) -> None:
        if self.view is not None:
            self.view.release()
            self.view = None
            self.lane.free(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SharedLane:
    """One connection's regions: staging slots and pinned memory. Every method runs
    with the connection's lock held (the client's copy paths take it)."""

    def __init__(self, conn):
        self.conn = conn
        self.tried = False
        self.mode: str | None = None  # "device" (the VM's region) or "memfd"; None: none
        self.no_staging = False
        self.device: _Mapping | None = None  # the VM's region, if attached
        self.token: bytes | None = None  # the one its header carried
        self.staging: tuple[_Mapping, int] | None = None  # (mapping, offset of the slots)
        self.pinned: list[tuple[int, int, PinnedMemory]] = []  # (addr, end, mem), sorted
        self.why_not = ""

    # -- setting up ----------------------------------------------------------

    def _attach(self) -> bool:
        """A region (the VM's device, else memfds), once; False (and why_not) where none
        can be had."""
        if self.tried:
            return self.mode is not None
        self.tried = True
        caps = self.conn.caps
        if caps & P.CAP_SHM_DEVICE:
            try:
                if self._attach_device():
                    self.mode = "device"
            except CudaError as exc:
                self.why_not = f"{exc}"
        if self.mode is None and caps & P.CAP_SHM_MEMFD:
            self.mode = "memfd"  # each memfd is attached as it is made
        if self.mode is None and not self.why_not:
            self.why_not = "the agent offers no shared-memory region"
        if self.mode is None:
            log.info("copies travel on the socket: %s", self.why_not)
        return self.mode is not None

    def _staging(self) -> bool:
        """Two slots for pageable copies, made on the first one; False where the region
        has no room for them (the copy then goes on the socket)."""
        if self.staging is None and not self.no_staging and self._attach():
            try:
                if self.mode == "device":
                    self.staging = (self.device, self._room(STAGE_SLOTS * STAGE_CHUNK))
                else:
                    self.staging = (self._memfd(STAGE_SLOTS * STAGE_CHUNK), 0)
            except CudaError as exc:
                self.no_staging = True
                log.info("pageable copies travel on the socket: %s", exc)
        return self.staging is not None

    def _attach_device(self) -> bool:
        region, device, size, token = self.conn.call("SHM_ATTACH", R.KIND_DEVICE, 0, 0)
        try:
            found = guest_region.find_device_region(token, device)
        except (OSError, HvgpuError) as exc:
            found, self.why_not = None, f"the VM's shared-memory device cannot be mapped: {exc}"
        if found is None:
            self.why_not = self.why_not or ("no ivshmem device of this VM carries the agent's "
                                            "token")
            self.conn.call("SHM_DETACH", region)
            return False
        self.device = _Mapping(region, found.size, found.mmap)
        self.token = token
        self._device_found = found  # keeps its mapping alive
        return True

    def _memfd(self, size: int) -> _Mapping:
        size = R.align_up(size)
        fd = os.memfd_create("hvgpu-pinned", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            mem = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            region, _, got, _ = self.conn.call_with_fds("SHM_ATTACH", R.KIND_MEMFD, 0, size,
                                                        fds=[fd])
        except BaseException:
            os.close(fd)
            raise
        return _Mapping(region, got, mem, owned_fd=fd)

    def _room(self, size: int) -> int:
        return self.conn.call("SHM_ALLOC", self.device.region, 0, size)[0]

    # -- pinned memory --------------------------------------------------------

    def allocate(self, size: int) -> PinnedMemory:
        if size <= 0:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"pinned memory of {size} bytes")
        if not self._attach():
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                            f"no pinned memory without a shared-memory region: {self.why_not}")
        if self.device is not None:
            mem = PinnedMemory(self, self.device, self._room(size), size, False)
        else:
            mem = PinnedMemory(self, self._memfd(size), 0, size, True)
        bisect.insort(self.pinned, (mem.addr, mem.addr + size, mem), key=lambda t: t[0])
        return mem

    def free(self, mem: PinnedMemory) -> None:
        with self.conn.lock:
            self.pinned = [t for t in self.pinned if t[2] is not mem]
            try:
                if self.conn.closed:
                    return
                if mem.whole_region:
                    self.conn.call("SHM_DETACH", mem.mapping.region)
                else:
                    self.conn.call("SHM_FREE", mem.mapping.region, 0, mem.offset)
            finally:
                if mem.whole_region:  # its memfd: the executor has its own mapping
                    mem.mapping.close()

    def find(self, view: memoryview) -> tuple[int, int] | None:
        """(region, offset) where the buffer lies wholly in pinned memory."""
        if not self.pinned:
            return None
        addr = address_of(view)
        if addr is None:
            return None
        i = bisect.bisect_right(self.pinned, addr, key=lambda t: t[0]) - 1
        if i < 0:
            return None
        start, end, mem = self.pinned[i]
        if addr + view.nbytes > end:
            return None
        return mem.mapping.region, mem.offset + (addr - start)

    # -- copies ------------------------------------------------------------------

    def upload(self, dst: int, view: memoryview, stream: int) -> bool:
        """Host to device through the region; False: use the socket."""
        n = view.nbytes
        pinned = self.find(view)
        conn = self.conn
        if pinned is not None:
            region, offset = pinned
            conn.post("MEMCPY_HTOD_SHM", dst, region, 0, offset, n, stream)
            return True
        if n < STAGE_MIN or not self._staging():
            return False
        mapping, slots = self.staging
        src = address_of(view)  # None (read-only): copied under the GIL, on one thread
        fences: list[int] = []
        sync = codec.REQUEST[_SYNC]
        err = None
        for k, off in enumerate(range(0, n, STAGE_CHUNK)):
            slot = slots + (k % STAGE_SLOTS) * STAGE_CHUNK
            if len(fences) == STAGE_SLOTS:  # this slot's last chunk has reached the GPU
                err = self._settle(fences.pop(0), err)
            if err is not None:
                break
            c = min(STAGE_CHUNK, n - off)
            if src is None:
                mapping.mem[slot:slot + c] = view[off:off + c]
            else:
                parallel_copy.copy(mapping.addr + slot, src + off, c)
            conn.post("MEMCPY_HTOD_SHM", dst + off, mapping.region, 0, slot, c, stream)
            fences.append(conn.send_request(_SYNC, sync.encode((stream,))))
        for seq in fences:
            err = self._settle(seq, err)
        if err is not None:
            self._fail(err, stream)
        return True

    def download(self, view: memoryview, src: int, stream: int) -> bool:
        """Device to host through the region, waiting for the stream; False: use the
        socket."""
        n = view.nbytes
        if view.readonly:
            return False  # the socket path says what is wrong with it
        pinned = self.find(view)
        conn = self.conn
        sync = codec.REQUEST[_SYNC]
        if pinned is not None:
            region, offset = pinned
            conn.post("MEMCPY_DTOH_SHM", region, 0, offset, src, n, stream)
            err = self._settle(conn.send_request(_SYNC, sync.encode((stream,))), None)
            if err is not None:
                self._fail(err, stream)
            return True
        if n < STAGE_MIN or not self._staging():
            return False
        mapping, slots = self.staging
        dst = address_of(view)  # writable: copy_from_device's contract
        chunks = [(off, min(STAGE_CHUNK, n - off)) for off in range(0, n, STAGE_CHUNK)]
        fences: list[int] = []
        err = None

        def ask(k: int) -> None:
            off, c = chunks[k]
            slot = slots + (k % STAGE_SLOTS) * STAGE_CHUNK
            conn.post("MEMCPY_DTOH_SHM", mapping.region, 0, slot, src + off, c, stream)
            fences.append(conn.send_request(_SYNC, sync.encode((stream,))))

        for k in range(min(STAGE_SLOTS, len(chunks))):
            ask(k)
        for k, (off, c) in enumerate(chunks):
            err = self._settle(fences.pop(0), err)
            if err is not None:
                break  # the chunks asked for are settled below; no more are asked
            slot = slots + (k % STAGE_SLOTS) * STAGE_CHUNK
            parallel_copy.copy(dst + off, mapping.addr + slot, c)
            if k + STAGE_SLOTS < len(chunks):
                ask(k + STAGE_SLOTS)
        for seq in fences:
            err = self._settle(seq, err)
        if err is not None:
            self._fail(err, stream)
        return True

    def _settle(self, seq: int, err):
        """Read a fence's reply; keep the first error (every reply is still read)."""
        try:
            self.conn.read_reply(_SYNC, seq)
        except CudaError as exc:
            return err or exc
        return err

    def _fail(self, err: CudaError, stream: int):
        """Raise a copy's error once none of its DMA is still under way: a fence that
        carried an earlier op's error was answered without waiting for the stream, and
        the slots (or the guest's pinned memory) must not change after the copy
        returned. The extra fence's own error, if any, is err again or a sticky one."""
        try:
            self.conn.read_reply(_SYNC, self.conn.send_request(
                _SYNC, codec.REQUEST[_SYNC].encode((stream,))))
        except CudaError:
            pass
        raise err

    def forget(self) -> None:
        """The connection closed: the agent let go of everything already."""
        self.pinned = []
