"""The CUDA driver library as the executor calls it: cuda.bindings and libcuda itself.

The one place cuda.bindings is imported and libcuda.so.1 loaded (the families
of ``CudaDevice`` take both from here); every non-success ``CUresult`` becomes
``CudaError`` with CUDA's own number (:func:`ok`, :func:`fail`). Also the C
structures passed to libcuda as they are (launch configurations, graph node
parameters).

Must not keep state beyond the loaded library, or validate guest input.
"""

from __future__ import annotations

import ctypes

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

try:
    from cuda.bindings import driver as cu
except ImportError as exc:  # reported to the guest by the executor, not a crash
    cu = None
    IMPORT_ERROR = str(exc)
else:
    IMPORT_ERROR = ""

MAX_PARAMS = P.MAX_PARAMS  # CUDA 12.1+: up to 32764 bytes of kernel parameters


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("kernel_params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class MemsetNodeParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t),
                ("height", ctypes.c_size_t)]


def _side(prefix: str) -> list:
    s = ctypes.c_size_t
    return [(prefix + "x", s), (prefix + "y", s), (prefix + "z", s), (prefix + "lod", s),
            (prefix + "memory_type", ctypes.c_int), (prefix + "host", ctypes.c_void_p),
            (prefix + "device", ctypes.c_uint64), (prefix + "array", ctypes.c_void_p),
            (prefix + "reserved", ctypes.c_void_p), (prefix + "pitch", s),
            (prefix + "height", s)]


class Memcpy3D(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = _side("src_") + _side("dst_") + [
        ("width_bytes", ctypes.c_size_t), ("height", ctypes.c_size_t),
        ("depth", ctypes.c_size_t)]


class UpdateResultInfo(ctypes.Structure):  # CUgraphExecUpdateResultInfo
    _fields_ = [("result", ctypes.c_int), ("error_node", ctypes.c_void_p),
                ("error_from_node", ctypes.c_void_p)]


HOST, DEVICE = 1, 2  # CUmemorytype
_libcuda = None


def driver_library():
    """libcuda itself, for the calls whose arguments are raw C structures from the guest
    (launch attributes, tensor maps): passed through as bytes, not rebuilt field by field."""
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _libcuda.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                              ctypes.c_void_p, ctypes.c_void_p]
        for name in ("cuOccupancyMaxActiveClusters", "cuOccupancyMaxPotentialClusterSize"):
            getattr(_libcuda, name).argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                ctypes.POINTER(LaunchConfig)]
        # the JIT linker: every pointer argument a pointer, not an int (64-bit values)
        _libcuda.cuLinkCreate_v2.argtypes = [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_void_p]
        _libcuda.cuLinkAddData_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_size_t, ctypes.c_char_p, ctypes.c_uint,
                                              ctypes.c_void_p, ctypes.c_void_p]
        _libcuda.cuLinkComplete.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _libcuda.cuLinkDestroy.argtypes = [ctypes.c_void_p]
        for name in ("cuStreamSetAttribute", "cuStreamGetAttribute"):
            getattr(_libcuda, name).argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        _libcuda.cuStreamCopyAttributes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        for name in ("cuMemPoolGetAttribute", "cuMemPoolSetAttribute"):
            getattr(_libcuda, name).argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        _libcuda.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_char_p,
            ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int]
    return _libcuda


def result_code(err) -> int:
    return int(getattr(err, "value", err))


def fail(err, what: str):
    status = result_code(err)
    text = ""
    if cu is not None:
        try:
            e, desc = cu.cuGetErrorString(err)
            if result_code(e) == 0 and desc:
                text = desc.decode()
        except Exception:
            pass
    raise CudaError(status, f"{what}: {text}" if text else what)


def ok(result, what: str):
    err = result[0]
    if result_code(err) != 0:
        fail(err, what)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def device_memory(ordinal: int):
    """CUmemAllocationProp of device memory on ``ordinal``, exportable by no handle."""
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    return prop


def access(prop, flags: int):
    desc = cu.CUmemAccessDesc()
    desc.location = prop.location
    desc.flags = cu.CUmemAccess_flags(flags)
    return desc
