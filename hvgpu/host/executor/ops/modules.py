"""Modules, their functions and variables, and kernel launches.

A :class:`Module` is charged what its load took of device memory (its
``__device__`` variables, which no cuMemAlloc shows), measured under the
device-memory lock, and owns that charge until it is unloaded; unloading is
parked while a graph may still run its code. Source is compiled by NVRTC
through ``nvrtc_policy``'s checks, in one of the VM's compiler slots, and the
image kept in the VM's compile cache. A launch's parameter buffer must have
the kernel's size (``cuFuncGetParamInfo``, asked once per function); the
session's C loop serves most launches with the same check.

Must not import CUDA; every driver call goes through the session's ``GpuDevice``.
"""

from __future__ import annotations

import logging
import struct

from hvgpu.errors import ConnectionLost, CudaError
from hvgpu.host.executor import jit_policy, nvrtc_policy
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.ops import checks
from hvgpu.host.executor.ops import fields as F
from hvgpu.host.executor.ops.ledger import DEVICE_MEMORY, Resource, quietly
from hvgpu.host.executor.ops.table import ALREADY_REPLIED, MEASURED, RELEASES, Family
from hvgpu.host.executor.tables import Allocations
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

log = logging.getLogger(__name__)

FAMILY = Family("modules and launches")
declare = FAMILY.declare

# Payloads held whole before use; larger ones are refused (CUDA_ERROR_INVALID_VALUE)
# and skipped, so the session goes on.
MAX_MODULE_IMAGE = 256 << 20  # MODULE_LOAD_DATA: a PTX, cubin or fatbin image
MAX_SOURCE = nvrtc_policy.MAX_SOURCE  # MODULE_COMPILE(_HEADERS): source and its headers
# How long a compilation waits for the VM's compiler slot before it is refused: two
# compilations that each reach their limits (compiler.py: 60 CPU s, 150 s in all).
COMPILE_WAIT = 300.0
# MODULE_FUNCTION_NAMES answers in one frame's body.
MAX_FUNCTION_NAMES = P.MAX_FUNCTION_NAMES
_LAUNCH_ATTR_SIZE = P.LAUNCH_ATTR_SIZE  # sizeof(CUlaunchAttribute)
_MAX_FUNC_ATTRIBUTES = P.MAX_FUNC_ATTRIBUTES  # FUNC_GET_ATTRIBUTES answers in a 32-bit mask


class Module(Resource):
    """A loaded module: the driver's, and what its load was charged."""

    __slots__ = ("obj",)

    def __init__(self, obj, charge: int):
        super().__init__(0, charge)
        self.obj = obj

    def release(self, session) -> None:
        with DEVICE_MEMORY:
            session.device.module_unload(self.obj)
        session.ledger.uncharge(self.charge)


def load(session, image) -> int:
    """Load ``image``, charged what the load took of device memory; its handle."""
    device = session.device
    if session.quota is None:
        module = Module(device.module_load(image), 0)
    else:
        obj, taken = session.ledger.measure(device, lambda: device.module_load(image),
                                            device.module_unload, "the module's variables take")
        module = Module(obj, taken)
    module.handle = session.modules.add(module)
    return module.handle


def module(session, handle: int) -> Module:
    return session.modules.get(handle)


# -- modules ------------------------------------------------------------------------

@declare("MODULE_LOAD_DATA", charge=MEASURED, payload=(MAX_MODULE_IMAGE, "module image"))
def module_load_data(session, hdr):
    with session.uploads.holding(hdr.payload_len, "module image"):
        image = session.reader.read_payload()
        if not image:
            raise CudaError(P.CUDA_ERROR_INVALID_IMAGE, "empty module image")
        return (load(session, image),)


def _program(name, options, names: list[str]) -> tuple:
    """nvrtc_policy's checks of what a compilation is asked to be."""
    name = nvrtc_policy.check_program_name(name)
    nvrtc_policy.check_header_names(names)
    return name, nvrtc_policy.check_options([o for o in options.split("\0") if o], names)


def _compile_check(session, hdr, name, options) -> tuple:
    return (*_program(name, options, []), [], [hdr.payload_len])


def _compile_headers_check(session, hdr, name, options, header_names, sizes) -> tuple:
    names = [h for h in header_names.split("\0") if h]
    if len(sizes) % 8 or len(sizes) // 8 != len(names) + 1:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{len(names)} header names need {8 * (len(names) + 1)} bytes of "
                        f"sizes, not {len(sizes)}")
    counts = [int.from_bytes(sizes[i:i + 8], "little") for i in range(0, len(sizes), 8)]
    if sum(counts) != hdr.payload_len:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"sizes add up to {sum(counts)} bytes, the payload is "
                        f"{hdr.payload_len}")
    return (*_program(name, options, names), names, counts)


def _compile(session, hdr, name, opts, names: list[str], counts: list[int]):
    """NVRTC (in the per-VM cache or a confined child), then the load."""
    with session.uploads.holding(hdr.payload_len, "source with its headers"):
        data = session.reader.read_payload()
        parts, at = [], 0
        for n in counts:
            parts.append(data[at:at + n])
            at += n
        source, headers = parts[0], dict(zip(names, parts[1:]))
        nvrtc_policy.check_includes(source, headers, name)
        key = CompileCache.key(session.device.compiler_id(), name, opts, source, headers)
        image, build_log, hit = session.cache.get_or_build(
            key, lambda: _build(session, source, name, opts, headers))
        log.info("%s: compiled %s (%s)", session.peer, name, "cache hit" if hit else "NVRTC")
        return (load(session, image), build_log[:P.MAX_MESSAGE])


def _build(session, source, name, opts, headers):
    """A compilation in one of the VM's compiler slots (waiting for one if need be)."""
    with session.compile_slots.slot(COMPILE_WAIT):
        return session.device.compile(source, name, opts, headers)


declare("MODULE_COMPILE", check=_compile_check, charge=MEASURED,
        payload=(MAX_SOURCE, "source"))(_compile)
declare("MODULE_COMPILE_HEADERS", check=_compile_headers_check, charge=MEASURED,
        payload=(MAX_SOURCE, "source with its headers"))(_compile)


def _module(session, hdr, handle, *fields) -> tuple:
    return (module(session, handle), *fields)


@declare("MODULE_UNLOAD", check=_module, charge=RELEASES)
def module_unload(session, hdr, mod):
    handle = mod.handle
    if not session.graphs.park(f"module {handle}", lambda: mod.release(session)):
        mod.release(session)  # its code may be in a graph: parked until none is left
    session.modules.pop(handle)
    ranges = session.globals.pop(handle, None)
    if ranges is not None:
        ranges.clear()  # and so out of the C loop's table
    for fid in [f for f, (m, _) in session.functions.objects.items() if m == handle]:
        session.functions.pop(fid)
        session.layouts.pop(fid, None)
        session.launchable.pop(fid, None)
        if session.burst is not None:
            session.burst.drop_function(fid)


@declare("MODULE_GET_FUNCTION", check=_module)
def module_get_function(session, hdr, mod, name):
    fn = session.device.module_function(mod.obj, name)
    return (session.functions.add((mod.handle, fn)),)


@declare("MODULE_FUNCTION_NAMES", check=_module)
def module_function_names(session, hdr, mod):
    names = "\0".join(session.device.module_function_names(mod.obj)).encode()
    if len(names) > MAX_FUNCTION_NAMES:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"the module's function names take {len(names)} bytes, more than "
                        f"hvgpu answers in one reply ({MAX_FUNCTION_NAMES})")
    return (names,)


@declare("MODULE_GET_GLOBAL", check=_module)
def module_get_global(session, hdr, mod, name):
    dptr, size = session.device.module_global(mod.obj, name)
    ranges = session.globals.setdefault(mod.handle, Allocations(session.burst))
    if dptr not in ranges.sizes and size:
        ranges.add(dptr, size)
    return (dptr, size)


# -- functions --------------------------------------------------------------------------

def _function(session, hdr, handle, *fields) -> tuple:
    return (checks.function(session, handle), *fields)


def _param_info(session, hdr, function) -> tuple:
    return function, checks.layout(session, function)


@declare("FUNC_GET_PARAM_INFO", check=_param_info)
def func_get_param_info(session, hdr, function, layout):
    checks.launchable(session, function)  # the guest asks before its first launch: C takes that one
    return (b"".join(o.to_bytes(4, "little") + s.to_bytes(4, "little") for o, s in layout),)


@declare("FUNC_GET_ATTRIBUTE", check=_function)
def func_get_attribute(session, hdr, fn, attrib):
    return (session.device.func_attribute(fn, attrib),)


def _attributes(session, hdr, function, count) -> tuple:
    if not 0 < count <= _MAX_FUNC_ATTRIBUTES:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{count} function attributes asked for (1..{_MAX_FUNC_ATTRIBUTES})")
    return checks.function(session, function), count


@declare("FUNC_GET_ATTRIBUTES", check=_attributes)
def func_get_attributes(session, hdr, fn, count):
    known, values = 0, []
    for attrib in range(count):
        try:
            values.append(session.device.func_attribute(fn, attrib))
            known |= 1 << attrib
        except CudaError as exc:
            if exc.status != P.CUDA_ERROR_INVALID_VALUE:
                raise
            values.append(0)  # an attribute this driver does not have
    return (known, struct.pack(f"<{count}i", *values))


@declare("FUNC_SET_ATTRIBUTE", check=_function)
def func_set_attribute(session, hdr, fn, attrib, value):
    session.device.func_set_attribute(fn, attrib, value)


@declare("FUNC_SET_CACHE_CONFIG", check=_function)
def func_set_cache_config(session, hdr, fn, config):
    session.device.func_set_cache_config(fn, config)


@declare("OCCUPANCY_MAX_BLOCKS", check=_function)
def occupancy_max_blocks(session, hdr, fn, block_size, shared_mem, flags):
    return (session.device.occupancy_max_blocks(fn, block_size, shared_mem, flags),)


@declare("OCCUPANCY_AVAILABLE_SMEM", check=_function)
def occupancy_available_smem(session, hdr, fn, blocks, block_size):
    return (session.device.occupancy_available_smem(fn, blocks, block_size),)


def _clusters(session, hdr, which, function, gx, gy, gz, bx, by, bz, shared, attrs) -> tuple:
    if which not in (0, 1) or len(attrs) % _LAUNCH_ATTR_SIZE:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "bad cluster occupancy query")
    return which, checks.function(session, function), (gx, gy, gz), (bx, by, bz), shared, attrs


@declare("OCCUPANCY_CLUSTERS", check=_clusters)
def occupancy_clusters(session, hdr, which, fn, grid, block, shared, attrs):
    return (session.device.occupancy_clusters(which, fn, grid, block, shared, attrs),)


def _tensor_map(session, hdr, dtype, rank, address, dims, strides, box, element_strides,
                *rest) -> tuple:
    if not 1 <= rank <= 5 or len(dims) != 8 * rank or len(strides) != 8 * (rank - 1) \
            or len(box) != 4 * rank or len(element_strides) != 4 * rank:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"tensor map arrays do not match rank {rank}")
    return (dtype, rank, address, dims, strides, box, element_strides, *rest)


@declare("TENSOR_MAP_ENCODE_TILED", check=_tensor_map)
def tensor_map_encode_tiled(session, hdr, *fields):
    return (session.device.tensor_map_encode_tiled(*fields),)


def _im2col(session, hdr, dtype, rank, address, dims, strides, lower, upper, channels, pixels,
            element_strides, interleave, swizzle, l2, oob, wide, mode) -> tuple:
    corners = 4 if wide else 4 * (rank - 2)
    if not 3 <= rank <= 5 or wide not in (0, 1) or len(dims) != 8 * rank \
            or len(strides) != 8 * (rank - 1) or len(lower) != corners \
            or len(upper) != corners or len(element_strides) != 4 * rank:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"im2col tensor map arrays do not match rank {rank}")
    return (dtype, rank, address, dims, strides, lower, upper, channels, pixels,
            element_strides, interleave, swizzle, l2, oob, wide, mode)


@declare("TENSOR_MAP_ENCODE_IM2COL", check=_im2col)
def tensor_map_encode_im2col(session, hdr, *fields):
    return (session.device.tensor_map_encode_im2col(*fields),)


def _replace_address(session, hdr, tensor_map, address) -> tuple:
    if len(tensor_map) != P.TENSOR_MAP_SIZE:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"a tensor map of {len(tensor_map)} bytes, not {P.TENSOR_MAP_SIZE}")
    return bytes(tensor_map), address


# The map is the guest's bytes, which the driver rewrites in a buffer of the executor's:
# what it names is no more than a kernel parameter the guest could have written itself.
@declare("TENSOR_MAP_REPLACE_ADDRESS", check=_replace_address)
def tensor_map_replace_address(session, hdr, tensor_map, address):
    return (session.device.tensor_map_replace_address(tensor_map, address),)


# -- launches ------------------------------------------------------------------------------

# Served by the C loop too; a launch's frame is decoded in place (raw): its parameters
# go to the driver as a view of the receive buffer.
@declare("LAUNCH_KERNEL", raw=True, burst=("cuLaunchKernel",),
         fields=(F.function("function"), F.params("params"), F.stream("stream")))
def launch_kernel(session, hdr, fn, gx, gy, gz, bx, by, bz, shared, s, params):
    session.device.launch(fn, (gx, gy, gz), (bx, by, bz), shared, s, params)
    session.counts["launches"] += 1


@declare("LAUNCH_KERNEL_EX", burst=("cuLaunchKernelEx",), fields=(
    F.function("function"), F.params("params"), F.attrs("attrs"), F.stream("stream")))
def launch_kernel_ex(session, hdr, fn, gx, gy, gz, bx, by, bz, shared, s, params, attrs):
    session.device.launch_ex(fn, (gx, gy, gz), (bx, by, bz), shared, s, params, attrs)
    session.counts["launches"] += 1


def _cooperative(session, hdr, *fields) -> list:
    values = _COOPERATIVE_FIELDS(session, hdr, *fields)
    attrs = values[-1]
    size = P.LAUNCH_ATTR_SIZE
    if not any(int.from_bytes(attrs[i:i + 4], "little") == P.LAUNCH_ATTR_COOPERATIVE
               and int.from_bytes(attrs[i + 8:i + 12], "little")
               for i in range(0, len(attrs), size)):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        "a cooperative launch without CU_LAUNCH_ATTRIBUTE_COOPERATIVE set")
    return values


_COOPERATIVE_FIELDS = F.derive("LAUNCH_COOPERATIVE", (
    F.function("function"), F.params("params"), F.attrs("attrs"), F.stream("stream")))


# Answered, not one-way: the driver refuses a grid of more blocks than can be resident
# at once (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) at the call, and so must the guest.
@declare("LAUNCH_COOPERATIVE", check=_cooperative)
def launch_cooperative(session, hdr, fn, gx, gy, gz, bx, by, bz, shared, s, params, attrs):
    session.device.launch_ex(fn, (gx, gy, gz), (bx, by, bz), shared, s, params, attrs)
    session.counts["launches"] += 1


def release_all(session) -> None:
    """At the end, under the lock a module load measures under; their charges go with
    the guest's whole."""
    with DEVICE_MEMORY:
        for held in session.modules.objects.values():
            quietly(session.device.module_unload, held.obj)
        session.modules.objects.clear()


# -- the JIT linker -----------------------------------------------------------------------

MAX_LINKED = 16  # linked images a connection may leave unfetched at once


def _link_check(session, hdr, options, inputs, names) -> tuple:
    return (jit_policy.check_options(options),
            jit_policy.check_inputs(inputs, names, hdr.payload_len))


@declare("LINK", check=_link_check, payload=(P.MAX_LINK_BYTES, "link inputs"))
def link(session, hdr, options, inputs):
    """Links on the device (its linker is the driver's, which JIT-compiles PTX where
    MODULE_LOAD_DATA's already is); a failed link is a reply with its status and logs,
    so the guest's error log buffer gets what the linker said."""
    with session.uploads.holding(hdr.payload_len, "link inputs"):
        data = bytes(session.reader.read_payload())
    linked = session.linked
    if len(linked) >= MAX_LINKED:
        raise CudaError(P.CUDA_ERROR_OUT_OF_MEMORY, f"{MAX_LINKED} linked images are waiting "
                        "to be fetched (cuLinkComplete without cuLinkDestroy)")
    parts, at = [], 0
    for kind, name, size in inputs:
        parts.append((kind, name, data[at:at + size]))
        at += size
    status, image, info, error, wall = session.device.link(options, parts, P.MAX_LINK_LOG)
    handle = 0
    if not status:
        handle = session.next_link = max(session.next_link + 1, P.FIRST_HANDLE)
        linked[handle] = image
    return (status, wall, handle, len(image) if not status else 0,
            info[:P.MAX_LINK_LOG - 1], error[:P.MAX_LINK_LOG - 1])


@declare("LINK_IMAGE")
def link_image(session, hdr, image):
    data = session.linked.pop(image, None)
    if data is None:
        raise CudaError(P.CUDA_ERROR_INVALID_HANDLE, f"no linked image {image} of this guest")
    try:
        with session.send_lock:
            session.send_locked(pack_header(hdr.op, P.FLAG_REPLY, hdr.seq, 0, 0, len(data)))
            session.send_locked(memoryview(data))
    except OSError as exc:
        raise ConnectionLost(f"guest went away while the linked image was sent: {exc}") \
            from None
    return ALREADY_REPLIED
