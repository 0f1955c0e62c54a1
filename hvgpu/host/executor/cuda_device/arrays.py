"""Array, texture and surface calls of ``CudaDevice``, and cuMemcpy3D.

Through libcuda directly: the descriptors are cuda.h's C structures, built here
from the fields the session checked (the texture and resource view descriptions
arrive as cuda.h lays them out and are passed as they are; they hold no
pointers). An array or mipmapped array is its CUarray / CUmipmappedArray value;
texture and surface objects are their 64-bit values.

Must not validate guest input beyond what the driver does: the session has.
"""

from __future__ import annotations

import ctypes
import struct

from hvgpu.host.executor.cuda_device.driver import Memcpy3D, driver_library, fail

_ARRAY, _MIPMAP, _LINEAR, _PITCH2D = 0, 1, 2, 3
_RESOURCE_DESC = 144  # sizeof(CUDA_RESOURCE_DESC)


class Array3DDescriptor(ctypes.Structure):  # CUDA_ARRAY3D_DESCRIPTOR
    _fields_ = [("width", ctypes.c_size_t), ("height", ctypes.c_size_t),
                ("depth", ctypes.c_size_t), ("format", ctypes.c_int),
                ("channels", ctypes.c_uint), ("flags", ctypes.c_uint)]


def _call(name: str, *args) -> None:
    err = getattr(driver_library(), name)(*args)
    if err:
        fail(err, name)


def resource_desc(res_type: int, resource: int, fmt: int, channels: int, width: int,
                  height: int, pitch: int, flags: int) -> bytes:
    """CUDA_RESOURCE_DESC: resType, the union at offset 8 (128 bytes), flags at 136."""
    raw = bytearray(_RESOURCE_DESC)
    struct.pack_into("<i", raw, 0, res_type)
    if res_type in (_ARRAY, _MIPMAP):
        struct.pack_into("<Q", raw, 8, resource)
    elif res_type == _LINEAR:
        struct.pack_into("<QiIQ", raw, 8, resource, fmt, channels, width)
    else:
        struct.pack_into("<QiIQQQ", raw, 8, resource, fmt, channels, width, height, pitch)
    struct.pack_into("<I", raw, 136, flags)
    return bytes(raw)


def _set_side(p: Memcpy3D, prefix: str, side: tuple) -> None:
    kind, where, x, y, z, pitch, height = side
    for name, value in (("x", x), ("y", y), ("z", z), ("memory_type", kind), ("pitch", pitch),
                        ("height", height)):
        setattr(p, prefix + name, value)
    setattr(p, prefix + {1: "host", 2: "device", 3: "array"}[kind], where)


class ArrayMemoryRequirements(ctypes.Structure):  # CUDA_ARRAY_MEMORY_REQUIREMENTS
    _fields_ = [("size", ctypes.c_size_t), ("alignment", ctypes.c_size_t),
                ("reserved", ctypes.c_uint * 4)]


class ArrayCalls:
    def array_memory_requirements(self, array, mipmapped: int) -> tuple[int, int]:
        req = ArrayMemoryRequirements()
        name = ("cuArrayGetMemoryRequirements", "cuMipmappedArrayGetMemoryRequirements")[mipmapped]
        _call(name, ctypes.byref(req), ctypes.c_void_p(array), ctypes.c_int(int(self.dev)))
        return req.size, req.alignment

    """``GpuDevice``'s array, texture, surface and 3D copy methods over the driver."""

    def array_create(self, width, height, depth, fmt, channels, flags) -> int:
        desc = Array3DDescriptor(width, height, depth, fmt, channels, flags)
        out = ctypes.c_void_p()
        _call("cuArray3DCreate_v2", ctypes.byref(out), ctypes.byref(desc))
        return int(out.value)

    def array_destroy(self, array) -> None:
        _call("cuArrayDestroy", ctypes.c_void_p(array))

    def array_descriptor(self, array) -> tuple:
        desc = Array3DDescriptor()
        _call("cuArray3DGetDescriptor_v2", ctypes.byref(desc), ctypes.c_void_p(array))
        return (desc.width, desc.height, desc.depth, desc.format, desc.channels, desc.flags)

    def mipmap_create(self, width, height, depth, fmt, channels, flags, levels) -> int:
        desc = Array3DDescriptor(width, height, depth, fmt, channels, flags)
        out = ctypes.c_void_p()
        _call("cuMipmappedArrayCreate", ctypes.byref(out), ctypes.byref(desc),
              ctypes.c_uint(levels))
        return int(out.value)

    def mipmap_destroy(self, mipmap) -> None:
        _call("cuMipmappedArrayDestroy", ctypes.c_void_p(mipmap))

    def mipmap_level(self, mipmap, level) -> int:
        out = ctypes.c_void_p()
        _call("cuMipmappedArrayGetLevel", ctypes.byref(out), ctypes.c_void_p(mipmap),
              ctypes.c_uint(level))
        return int(out.value)

    def tex_create(self, res_type, resource, fmt, channels, width, height, pitch, res_flags,
                   tex_desc, view_desc) -> int:
        res = ctypes.create_string_buffer(resource_desc(res_type, resource, fmt, channels, width,
                                                        height, pitch, res_flags),
                                          _RESOURCE_DESC)
        tex = ctypes.create_string_buffer(bytes(tex_desc), len(tex_desc))
        view = ctypes.create_string_buffer(bytes(view_desc), len(view_desc)) if view_desc \
            else None
        out = ctypes.c_uint64()
        _call("cuTexObjectCreate", ctypes.byref(out), res, tex, view)
        return int(out.value)

    def tex_destroy(self, value) -> None:
        _call("cuTexObjectDestroy", ctypes.c_uint64(value))

    def surf_create(self, array) -> int:
        res = ctypes.create_string_buffer(resource_desc(_ARRAY, array, 0, 0, 0, 0, 0, 0),
                                          _RESOURCE_DESC)
        out = ctypes.c_uint64()
        _call("cuSurfObjectCreate", ctypes.byref(out), res)
        return int(out.value)

    def surf_destroy(self, value) -> None:
        _call("cuSurfObjectDestroy", ctypes.c_uint64(value))

    def memcpy_3d(self, src, dst, width, height, depth, stream) -> None:
        p = Memcpy3D()
        _set_side(p, "src_", src)
        _set_side(p, "dst_", dst)
        p.width_bytes, p.height, p.depth = width, height, depth
        _call("cuMemcpy3DAsync_v2", ctypes.byref(p), ctypes.c_void_p(int(stream)))
