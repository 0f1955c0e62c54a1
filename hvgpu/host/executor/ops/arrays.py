"""CUDA arrays, mipmapped arrays, texture and surface objects, and 2D/3D copies.

An :class:`Array` or :class:`Mipmap` is the driver's object under a handle of
this connection (``session.arrays``, ``session.mipmaps``); a mipmap level is an
array handle that goes with its mipmapped array and cannot be destroyed alone.
Each is charged what the driver's free memory fell by while it was made
(``ledger.measure``), refused ahead where its bytes alone exceed what the slice
has left, and given back when it is destroyed or the guest goes.

A texture or surface object is named by the driver's own value: a kernel takes
it as a parameter and the driver reads it there, so the guest must hold the real
value (rewriting kernel parameters would need to know which are objects). The
value grants nothing by itself: the object was made from this guest's own
arrays or memory, and the executor creates, destroys and looks up only objects
of the connection that made them (``session.textures``, ``session.surfaces``).

A copy side is (kind, where, x, y, z, pitch, height): device memory is checked
as a whole span (first byte to last) inside one allocation of the guest's, an
array against its own extent, before the driver sees either; host memory never
crosses: its rows travel packed in the frame's payload (``MEMCPY_3D_TO``) or
the reply's (``MEMCPY_3D_FROM``), at most ``MAX_COPY_3D`` bytes a frame.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

import ctypes

from hvgpu.errors import ConnectionLost, CudaError
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, Resource, quietly
from hvgpu.host.executor.ops.table import ALREADY_REPLIED, MEASURED, RELEASES, Family
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

FAMILY = Family("arrays and textures")
declare = FAMILY.declare

# CUarray_format -> bytes of one channel: the formats served (others are refused)
FORMAT_BYTES = {0x01: 1, 0x02: 2, 0x03: 4, 0x08: 1, 0x09: 2, 0x0A: 4, 0x10: 2, 0x20: 4}
CHANNELS = (1, 2, 4)
# CUDA_ARRAY3D_* flags served: layered, surface load/store, cubemap, texture gather,
# depth texture, colour attachment. Sparse arrays and deferred mapping are not.
FLAGS = 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20
SURFACE_LDST = 0x02
HOST = 1  # CU_MEMORYTYPE_HOST: the executor's own buffer of a payload copy
_U64 = 1 << 64
_RES_ARRAY, _RES_MIPMAP, _RES_LINEAR, _RES_PITCH2D = 0, 1, 2, 3


def _invalid(message: str) -> CudaError:
    return CudaError(P.CUDA_ERROR_INVALID_VALUE, message)


class Array(Resource):
    """An array the guest created, or a level of one of its mipmapped arrays
    (``level_of``: the mipmapped array's handle; it is freed with that)."""

    __slots__ = ("obj", "desc", "level_of")

    def __init__(self, obj, desc: tuple, charge: int = 0, level_of: int = 0):
        super().__init__(0, charge)
        self.obj, self.desc, self.level_of = obj, desc, level_of

    def release(self, session) -> None:
        with DEVICE_MEMORY:
            session.device.array_destroy(self.obj)
        session.ledger.uncharge(self.charge)

    @property
    def extent(self) -> tuple[int, int, int]:
        """(bytes of a row, rows, slices or layers) a copy may reach."""
        width, height, depth, fmt, channels, _ = self.desc
        return width * FORMAT_BYTES.get(fmt, 1) * channels, max(height, 1), max(depth, 1)


class Mipmap(Resource):
    """A mipmapped array the guest created; ``levels``: the handles given for its levels."""

    __slots__ = ("obj", "desc", "levels")

    def __init__(self, obj, desc: tuple, charge: int):
        super().__init__(0, charge)
        self.obj, self.desc, self.levels = obj, desc, {}

    def release(self, session) -> None:
        for handle in self.levels.values():
            session.arrays.objects.pop(handle, None)
        with DEVICE_MEMORY:
            session.device.mipmap_destroy(self.obj)
        session.ledger.uncharge(self.charge)


# -- arrays ---------------------------------------------------------------------------

def _descriptor(session, hdr, width, height, depth, fmt, channels, flags, *rest) -> tuple:
    """What CUDA would refuse, and what hvgpu does not serve, before the driver is
    asked; an array whose bytes alone exceed what the slice has left is refused too
    (measured after it was made, it would have held them meanwhile)."""
    if fmt not in FORMAT_BYTES:
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED if fmt else P.CUDA_ERROR_INVALID_VALUE,
                        f"array format 0x{fmt:x} is not served (8-, 16- and 32-bit integers, "
                        "half and float are)")
    if channels not in CHANNELS:
        raise _invalid(f"an array of {channels} channels (1, 2 or 4)")
    if flags & ~FLAGS:
        raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED,
                        f"array flags 0x{flags & ~FLAGS:x} (sparse arrays, deferred mapping "
                        "and video arrays) are not served")
    if not width or (depth and not height and not flags & 0x01):
        raise _invalid(f"array of {width}x{height}x{depth}: not a 1D, 2D or 3D extent")
    need = width * FORMAT_BYTES[fmt] * channels * max(height, 1) * max(depth, 1)
    if session.quota is not None:
        used, limit = session.quota.usage()
        if need > limit - used:
            raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY,
                            f"an array of {need} bytes does not fit the slice's "
                            f"{max(0, limit - used)} bytes left")
    return (width, height, depth, fmt, channels, flags, *rest)


@declare("ARRAY_CREATE", check=_descriptor, charge=MEASURED)
def array_create(session, hdr, width, height, depth, fmt, channels, flags):
    desc = (width, height, depth, fmt, channels, flags)
    device = session.device
    obj, taken = session.ledger.measure(device, lambda: device.array_create(*desc),
                                        device.array_destroy, "the array took")
    array = Array(obj, desc, taken)
    array.handle = session.arrays.add(array)
    return (array.handle,)


def _own_array(session, hdr, handle, *rest) -> tuple:
    return (session.arrays.get(handle), *rest)


@declare("ARRAY_DESTROY", check=_own_array, charge=RELEASES)
def array_destroy(session, hdr, array):
    if array.level_of:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "a mipmap level goes with its "
                                                    "mipmapped array, not on its own")
    session.arrays.pop(array.handle)
    array.release(session)


@declare("ARRAY_GET_DESCRIPTOR", check=_own_array)
def array_get_descriptor(session, hdr, array):
    return array.desc


@declare("MIPMAPPED_ARRAY_CREATE", check=_descriptor, charge=MEASURED)
def mipmap_create(session, hdr, width, height, depth, fmt, channels, flags, levels):
    if not levels:
        raise _invalid("a mipmapped array of 0 levels")
    desc = (width, height, depth, fmt, channels, flags)
    device = session.device
    obj, taken = session.ledger.measure(device, lambda: device.mipmap_create(*desc, levels),
                                        device.mipmap_destroy, "the mipmapped array took")
    mipmap = Mipmap(obj, desc, taken)
    mipmap.handle = session.mipmaps.add(mipmap)
    return (mipmap.handle,)


def _own_mipmap(session, hdr, handle, *rest) -> tuple:
    return (session.mipmaps.get(handle), *rest)


@declare("MIPMAPPED_ARRAY_DESTROY", check=_own_mipmap, charge=RELEASES)
def mipmap_destroy(session, hdr, mipmap):
    session.mipmaps.pop(mipmap.handle)
    mipmap.release(session)


@declare("MIPMAPPED_ARRAY_GET_LEVEL", check=_own_mipmap)
def mipmap_get_level(session, hdr, mipmap, level):
    handle = mipmap.levels.get(level)
    if handle is None:
        obj = session.device.mipmap_level(mipmap.obj, level)
        array = Array(obj, session.device.array_descriptor(obj), level_of=mipmap.handle)
        handle = array.handle = mipmap.levels[level] = session.arrays.add(array)
    return (handle,)


def _requirements(session, hdr, handle, mipmapped) -> tuple:
    if mipmapped not in (0, 1):
        raise _invalid(f"ARRAY_MEMORY_REQUIREMENTS's mipmapped is 0 or 1, not {mipmapped}")
    table = session.mipmaps if mipmapped else session.arrays
    return table.get(handle).obj, mipmapped


@declare("ARRAY_MEMORY_REQUIREMENTS", check=_requirements)
def array_memory_requirements(session, hdr, obj, mipmapped):
    return session.device.array_memory_requirements(obj, mipmapped)


# -- texture and surface objects ---------------------------------------------------------

def _texture(session, hdr, res_type, fmt, resource, width, height, pitch, channels,
             res_flags, tex_desc, view_desc) -> tuple:
    if len(tex_desc) != P.TEX_DESC_SIZE:
        raise _invalid(f"a texture description of {len(tex_desc)} bytes, not "
                       f"{P.TEX_DESC_SIZE}")
    if len(view_desc) not in (0, P.VIEW_DESC_SIZE):
        raise _invalid(f"a resource view description of {len(view_desc)} bytes, not "
                       f"{P.VIEW_DESC_SIZE}")
    if res_type == _RES_ARRAY:
        resource = session.arrays.get(resource).obj
    elif res_type == _RES_MIPMAP:
        resource = session.mipmaps.get(resource).obj
    elif res_type in (_RES_LINEAR, _RES_PITCH2D):
        if fmt not in FORMAT_BYTES or channels not in CHANNELS:
            raise _invalid(f"a texture of format 0x{fmt:x} with {channels} channels")
        if res_type == _RES_LINEAR:
            span = width
        else:
            row = width * FORMAT_BYTES[fmt] * channels
            if not width or not height:
                raise _invalid(f"a pitch2D texture of {width}x{height}")
            if pitch < row:
                raise _invalid(f"pitch {pitch} is smaller than a row of {row} bytes")
            span = pitch * (height - 1) + row
        if not span:
            raise _invalid("a texture of 0 bytes")
        checks.device_range(session, resource, span, "texture memory")
    else:
        raise _invalid(f"resource type {res_type} (array, mipmapped array, linear or pitch2D)")
    return (res_type, fmt, resource, width, height, pitch, channels, res_flags,
            bytes(tex_desc), bytes(view_desc))


@declare("TEX_OBJECT_CREATE", check=_texture)
def tex_object_create(session, hdr, res_type, fmt, resource, width, height, pitch, channels,
                      res_flags, tex_desc, view_desc):
    value = session.device.tex_create(res_type, resource, fmt, channels, width, height, pitch,
                                      res_flags, tex_desc, view_desc)
    session.textures.add(value)
    return (value,)


def _own_object(table: str, what: str):
    def check(session, hdr, value) -> tuple:
        if value not in getattr(session, table):
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{value} is not a {what} object of "
                                                        "this guest")
        return (value,)
    return check


@declare("TEX_OBJECT_DESTROY", check=_own_object("textures", "texture"))
def tex_object_destroy(session, hdr, value):
    session.device.tex_destroy(value)
    session.textures.discard(value)


def _surface(session, hdr, handle) -> tuple:
    array = session.arrays.get(handle)
    if not array.desc[5] & SURFACE_LDST:
        raise _invalid(f"array {handle} was not made for surfaces (CUDA_ARRAY3D_SURFACE_LDST)")
    return (array,)


@declare("SURF_OBJECT_CREATE", check=_surface)
def surf_object_create(session, hdr, array):
    value = session.device.surf_create(array.obj)
    session.surfaces.add(value)
    return (value,)


@declare("SURF_OBJECT_DESTROY", check=_own_object("surfaces", "surface"))
def surf_object_destroy(session, hdr, value):
    session.device.surf_destroy(value)
    session.surfaces.discard(value)


# -- copies -----------------------------------------------------------------------------

def side(session, kind, where, x, y, z, pitch, height, width, rows, depth, what) -> tuple:
    """The side a copy of depth slices of rows rows of width bytes reaches, checked:
    (kind, the device address or array object, x, y, z, pitch, height)."""
    if kind == P.MEMORY_ARRAY:
        array = session.arrays.get(where)
        row, most_rows, most_slices = array.extent
        if x + width > row or y + rows > most_rows or z + depth > most_slices:
            raise _invalid(f"{what}: {width} bytes x {rows} rows x {depth} at ({x}, {y}, {z}) "
                           f"run past the array's {row} bytes x {most_rows} x {most_slices}")
        return kind, array.obj, x, y, z, pitch, height
    if kind != P.MEMORY_DEVICE:
        raise _invalid(f"{what}: memory kind {kind} (device memory or an array)")
    if rows > 1 or depth > 1:
        if pitch < x + width:
            raise _invalid(f"{what}: pitch {pitch} is smaller than a row's {x} + {width} bytes")
        if depth > 1 and height < y + rows:
            raise _invalid(f"{what}: height {height} is smaller than {y} + {rows} rows")
    start = where + x + (y + z * height) * pitch
    span = ((depth - 1) * height + rows - 1) * pitch + width
    if start + span > _U64:
        raise _invalid(f"{what}: the copy runs past the end of the address space")
    checks.device_range(session, start, span, what)
    return kind, where, x, y, z, pitch, height


def _empty(width, height, depth) -> bool:
    return not (width and height and depth)


def _copy(session, hdr, src_kind, dst_kind, src, src_x, src_y, src_z, src_pitch, src_height,
          dst, dst_x, dst_y, dst_z, dst_pitch, dst_height, width, height, depth,
          stream) -> tuple:
    s = checks.stream(session, stream)
    if _empty(width, height, depth):
        return None, None, 0, 0, 0, s
    return (side(session, src_kind, src, src_x, src_y, src_z, src_pitch, src_height, width,
                 height, depth, "source"),
            side(session, dst_kind, dst, dst_x, dst_y, dst_z, dst_pitch, dst_height, width,
                 height, depth, "destination"), width, height, depth, s)


@declare("MEMCPY_3D", check=_copy)
def memcpy_3d(session, hdr, src, dst, width, height, depth, s):
    if src is not None:
        session.device.memcpy_3d(src, dst, width, height, depth, s)


def _packed(session, hdr, kind, where, x, y, z, pitch, height, width, rows, depth, stream,
            what: str, capture: str) -> tuple:
    s = checks.stream(session, stream)
    session.graphs.refuse_if_capturing(s, capture)
    n = width * rows * depth
    if n > P.MAX_COPY_3D:
        raise _invalid(f"a copy of {n} bytes in one frame (at most {P.MAX_COPY_3D})")
    if not n:
        return None, 0, 0, 0, s
    return (side(session, kind, where, x, y, z, pitch, height, width, rows, depth, what),
            width, rows, depth, s)


def _to(session, hdr, kind, reserved, *fields) -> tuple:
    checked = _packed(session, hdr, kind, *fields, what="destination",
                      capture="a copy from pageable host memory")
    need = checked[1] * checked[2] * checked[3]
    if hdr.payload_len != need:
        raise _invalid(f"a copy of {need} bytes carries {hdr.payload_len}")
    return checked


def _buffer(n: int) -> tuple[bytearray, int]:
    buf = bytearray(n)
    return buf, ctypes.addressof((ctypes.c_char * n).from_buffer(buf))


@declare("MEMCPY_3D_TO", check=_to, payload=(P.MAX_COPY_3D, "3D copy"))
def memcpy_3d_to(session, hdr, dst, width, height, depth, s):
    if dst is None:
        return
    n = hdr.payload_len
    with session.uploads.holding(n, "3D copy"):
        buf, addr = _buffer(n)
        session.reader.read_payload_into(memoryview(buf))
        # from pageable memory: the driver has taken the bytes when the call returns
        session.device.memcpy_3d((HOST, addr, 0, 0, 0, width, height), dst, width, height,
                                 depth, s)
    session.counts["h2d_bytes"] += n


def _from(session, hdr, kind, reserved, *fields) -> tuple:
    return _packed(session, hdr, kind, *fields, what="source",
                   capture="a copy to pageable host memory")


@declare("MEMCPY_3D_FROM", check=_from)
def memcpy_3d_from(session, hdr, src, width, height, depth, s):
    n = width * height * depth
    buf, addr = _buffer(n) if n else (bytearray(), 0)
    if n:
        with session.uploads.holding(n, "3D copy"):
            session.device.memcpy_3d(src, (HOST, addr, 0, 0, 0, width, height), width, height,
                                     depth, s)
            session.device.stream_synchronize(s)
    try:
        with session.send_lock:
            session.send_locked(pack_header(hdr.op, P.FLAG_REPLY, hdr.seq, 0, 0, n))
            if n:
                session.send_locked(memoryview(buf))
    except OSError as exc:
        raise ConnectionLost(f"guest went away during a copy: {exc}") from None
    session.counts["d2h_bytes"] += n
    return ALREADY_REPLIED


def release_all(session) -> None:
    """At the end: objects first (they refer to arrays and memory), then mipmapped arrays
    (with their levels), then arrays; their charges go with the guest's whole."""
    for value in list(session.textures):
        quietly(session.device.tex_destroy, value)
    for value in list(session.surfaces):
        quietly(session.device.surf_destroy, value)
    session.textures.clear()
    session.surfaces.clear()
    with DEVICE_MEMORY:
        for mipmap in list(session.mipmaps.objects.values()):
            quietly(session.device.mipmap_destroy, mipmap.obj)
        for array in list(session.arrays.objects.values()):
            if not array.level_of:
                quietly(session.device.array_destroy, array.obj)
    session.mipmaps.objects.clear()
    session.arrays.objects.clear()

