"""Protocol v1 of the data lane, defined once: header, operations, statuses.

Everything that speaks the wire (the Python guest client, the executor, the
C shim generated from ``templates/wire/hvgpu_wire.h.j2``) takes its layout
from the tables in this module, so the sides cannot drift. The module is pure
data plus tiny lookups; it must not open sockets or import CUDA.

A frame is a fixed 32-byte little-endian header, then ``body_len`` bytes of
body, then ``payload_len`` bytes of raw payload (bulk data: copies, module
images, sources), which is never re-encoded.

A body is the op's scalar fields packed in order with no padding, each
variable-length field (``str``/``bytes``) standing as a ``u32`` length in that
place, followed by the variable fields' bytes in order. Replies whose status
is not success carry :data:`ERROR_FIELDS` instead of the op's reply fields.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 1
MIN_VERSION = 1
MAGIC = 0x4748  # "HG" little-endian on the wire: 0x48 0x47

DEFAULT_PORT = 5170  # vsock/tcp port the agent listens on unless told otherwise
MAX_VGPUS = 8  # per VM: the guest reaches vGPU N at the agent's port + N
HOST_CID = 2  # VMADDR_CID_HOST: where a guest finds the agent over vsock

MAX_BODY = 1 << 20  # bodies are small; anything larger is a broken peer
MAX_PAYLOAD = 1 << 30  # per frame; larger copies travel as several frames
MAX_MESSAGE = 64 << 10  # error messages and compile logs are cut here


FLAG_ONEWAY = 0x01  # request: the sender expects no reply
FLAG_REPLY = 0x02  # this frame answers the request with the same seq
# With FLAG_REPLY, no body and no payload: "still working on seq N" (for a run of
# launches, the run's first), sent while the executor has been busy with a frame for
# a while, only to guests that set CAP_PROGRESS in HELLO. A guest restarts its silence
# timer and reads on; the real reply still follows.
FLAG_PROGRESS = 0x04
PROGRESS_EVERY = 1.0  # seconds between progress frames while the executor is busy
# With FLAG_REPLY, no body: the payload is what the GPU's kernels printed (device-side
# printf) that a synchronisation flushed, sent just before the reply of a synchronous
# request (same op and seq) to guests that set CAP_OUTPUT. The guest writes it to its
# standard output before the call returns, and reads on: the real reply follows.
FLAG_OUTPUT = 0x08

# Capability bits exchanged in HELLO.
CAP_NVRTC = 1 << 0  # the agent compiles CUDA C++ source (MODULE_COMPILE)
CAP_PARAM_INFO = 1 << 1  # FUNC_GET_PARAM_INFO is served from cuFuncGetParamInfo
CAP_PROGRESS = 1 << 2  # the guest accepts FLAG_PROGRESS frames (and the agent sends them)
CAP_REGION_MEMFD = 1 << 3  # REGION_ATTACH of a memfd passed with the frame (unix sockets)
CAP_REGION_DEVICE = 1 << 4  # the VM has a region device (ivshmem) to REGION_ATTACH
# The guest only looks (the NVML library, hvgpu-guest smi): its connection is not one of
# the vGPU's processes in VGPU_PROCESSES. The agent echoes it.
CAP_MONITOR = 1 << 5
CAP_OUTPUT = 1 << 6  # the guest accepts FLAG_OUTPUT frames (kernel printf output)

# HELLO's client: the guest software's name, then, where the guest states which of the
# VM's processes it speaks for, "; pid PID; NAME" (its pid inside the VM and its name,
# argv[0]): what VGPU_PROCESSES lists. It is the guest's word, shown to its own VM only.
MAX_PROCESS_NAME = 64  # characters of a process's name kept
MAX_PROCESSES = 64  # VGPU_PROCESSES lists at most this many
CLIENT_FORMAT = "%s; pid %d; %s"  # software, pid, name (printf's and Python's % alike)


def client_text(software: str, pid: int, name: str) -> str:
    """HELLO's client for ``software`` speaking for process ``pid`` called ``name``."""
    return CLIENT_FORMAT % (software, pid, name)


def parse_client(text: str) -> tuple[int, str]:
    """(pid, name) a HELLO's client states; (0, "") where it states none. The name keeps
    printable ASCII alone (it is shown in terminals), cut at MAX_PROCESS_NAME."""
    parts = text.split("; ", 2)
    digits = parts[1][4:] if len(parts) == 3 and parts[1].startswith("pid ") else ""
    # ASCII digits alone: str.isdigit() takes "²" (which int() refuses) and "١٢"
    if not (0 < len(digits) <= 10 and all("0" <= c <= "9" for c in digits)):
        return 0, ""
    pid = int(digits)
    if not 0 < pid < 1 << 31:
        return 0, ""
    name = "".join(c if " " <= c <= "~" else "?" for c in parts[2][:MAX_PROCESS_NAME])
    return pid, name

# Field types: name -> struct code ("" marks a variable-length field).
SCALARS = {"u8": "B", "u16": "H", "u32": "I", "i32": "i", "u64": "Q",
           "i64": "q", "f32": "f", "f64": "d"}
VARIABLE = ("str", "bytes")
C_TYPES = {"u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "i32": "int32_t",
           "u64": "uint64_t", "i64": "int64_t", "f32": "float", "f64": "double",
           "str": "uint32_t", "bytes": "uint32_t"}

# The frame header, in wire order.
HEADER_FIELDS = (("magic", "u16"), ("version", "u8"), ("flags", "u8"), ("op", "u16"),
                 ("reserved", "u16"), ("seq", "u32"), ("status", "i32"),
                 ("body_len", "u32"), ("reserved2", "u32"), ("payload_len", "u64"))
HEADER = struct.Struct("<" + "".join(SCALARS[t] for _, t in HEADER_FIELDS))
assert HEADER.size == 32


def header_fields(*names: str) -> struct.Struct:
    """Reads only the named header fields (in header order) in place, skipping the rest."""
    parts = [SCALARS[t] if name in names else f"{struct.calcsize(SCALARS[t])}x"
             for name, t in HEADER_FIELDS]
    while parts and parts[-1].endswith("x"):
        parts.pop()
    assert len([p for p in parts if not p.endswith("x")]) == len(names), names
    return struct.Struct("<" + "".join(parts))

SYNC = "sync"  # the sender waits for the reply
ONEWAY = "oneway"  # pipelined; errors surface at the next sync op


@dataclass(frozen=True)
class Op:
    code: int
    name: str
    kind: str  # SYNC or ONEWAY
    request: tuple = ()  # ((field, type), ...)
    reply: tuple = ()
    request_payload: bool = False  # bulk bytes follow the request body
    reply_payload: bool = False  # bulk bytes follow the reply body
    doc: str = ""


def _f(spec: str) -> tuple:
    """'u64 dst, u64 stream' -> (('dst','u64'), ('stream','u64'))."""
    fields = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        typ, name = part.split()
        assert typ in SCALARS or typ in VARIABLE, typ
        fields.append((name, typ))
    return tuple(fields)


# The op table. Codes are stable: never renumber, only add.
OPS: tuple[Op, ...] = (
    Op(0x01, "HELLO", SYNC, _f("u32 version, u32 min_version, u64 caps, str client"),
       _f("u32 version, u32 reserved, u64 caps, u64 max_payload, u32 max_body, str peer, str agent"),
       doc="First frame of every connection: version and capability handshake."),
    Op(0x02, "PING", SYNC, doc="Round trip through the executor without touching CUDA."),
    # Driver calls no other op covers (issue: misc entry points): answered, so a refusal
    # comes back at the call.
    Op(0x03, "CTX_EVENT", SYNC, _f("u64 event, u32 wait"),
       doc="cuCtxRecordEvent (wait 0) or cuCtxWaitEvent (wait 1) of the executor's context "
           "with an event of this connection: all the context's work so far, or all its "
           "later work waiting for the event."),
    Op(0x04, "CTX_RESET_PERSISTING_L2", SYNC, doc="cuCtxResetPersistingL2Cache."),
    Op(0x05, "DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH", SYNC, _f("u32 format, u32 channels"),
       _f("u64 width"),
       doc="cuDeviceGetTexture1DLinearMaxWidth: elements, for CUarray_format's format."),
    Op(0x06, "DEVICE_HOST_ATOMIC_CAPS", SYNC, _f("bytes operations"), _f("bytes caps"),
       doc="cuDeviceGetHostAtomicCapabilities: operations are CUatomicOperation numbers "
           "(u32 each, at most MAX_ATOMIC_OPERATIONS), caps one u32 of "
           "CUatomicOperationCapability bits for each."),
    Op(0x07, "ARRAY_MEMORY_REQUIREMENTS", SYNC, _f("u64 array, u32 mipmapped"),
       _f("u64 size, u64 alignment"),
       doc="cuArrayGetMemoryRequirements (mipmapped 0: array is an array handle) or "
           "cuMipmappedArrayGetMemoryRequirements (1: a mipmapped array's) of this "
           "connection."),
    Op(0x09, "TENSOR_MAP_ENCODE_IM2COL", SYNC,
       _f("u32 dtype, u32 rank, u64 address, bytes dims, bytes strides, bytes lower, "
          "bytes upper, u32 channels, u32 pixels, bytes element_strides, u32 interleave, "
          "u32 swizzle, u32 l2_promotion, u32 oob_fill, u32 wide, u32 mode"),
       _f("bytes map"),
       doc="cuTensorMapEncodeIm2col (wide 0: lower and upper are the pixel box's corners, "
           "i32 arrays of rank - 2) or cuTensorMapEncodeIm2colWide (wide 1: one i32 each, "
           "the corners' widths; mode its CUtensorMapIm2ColWideMode); dims and strides as "
           "TENSOR_MAP_ENCODE_TILED's. The reply is the 128-byte CUtensorMap."),
    Op(0x0A, "TENSOR_MAP_REPLACE_ADDRESS", SYNC, _f("bytes map, u64 address"), _f("bytes map"),
       doc="cuTensorMapReplaceAddress of a CUtensorMap (TENSOR_MAP_SIZE bytes) the guest "
           "holds: the map with its global address replaced."),
    Op(0x10, "DRIVER_GET_VERSION", SYNC, (), _f("i32 version")),
    Op(0x11, "DEVICE_GET_COUNT", SYNC, (), _f("i32 count")),
    Op(0x12, "DEVICE_GET_ATTRIBUTE", SYNC, _f("i32 attrib, i32 device"), _f("i32 value"),
       doc="cuDeviceGetAttribute; attrib is CUdevice_attribute's number."),
    Op(0x13, "DEVICE_GET_NAME", SYNC, _f("i32 device"), _f("str name")),
    Op(0x14, "DEVICE_GET_UUID", SYNC, _f("i32 device"), _f("bytes uuid")),
    Op(0x15, "DEVICE_TOTAL_MEM", SYNC, _f("i32 device"), _f("u64 bytes")),
    Op(0x16, "SLICE_INFO", SYNC, (), _f("str vm, u64 mem, u64 mem_used, u32 compute"),
       doc="The guest's slice: VM name, quota, in use, compute share in percent "
           "(0: none reserved). vm is empty when the connection has the whole GPU."),
    Op(0x17, "DEVICE_GET_ATTRIBUTES", SYNC, _f("i32 device, u32 count"), _f("bytes values"),
       doc="Attributes 1..count at once as i32 each (0 where the driver has none): "
           "the shim's cache, filled in one round trip."),
    Op(0x18, "VGPU_PROCESSES", SYNC, (),
       _f("u32 count, bytes pids, bytes used, str names"),
       doc="The processes of this VM that have a connection to this vGPU (not those that "
           "only look, CAP_MONITOR), one row per pid, at most MAX_PROCESSES: pids u32 "
           "each (as the VM numbers them, from their HELLO), used the bytes of the slice "
           "each holds (u64 each), names NUL-separated. Never another VM's."),
    Op(0x19, "VGPU_UTILIZATION", SYNC, (), _f("u32 known, u32 gpu"),
       doc="The slice's GPU utilisation in percent over the driver's last sample period, "
           "where the host knows it (known 1); known 0: not measured here."),
    Op(0x20, "CTX_SYNCHRONIZE", SYNC),
    Op(0x21, "MEM_GET_INFO", SYNC, (), _f("u64 free, u64 total")),
    Op(0x28, "CTX_GET_LIMIT", SYNC, _f("i32 limit"), _f("u64 value"),
       doc="cuCtxGetLimit of the executor's context; limit is CUlimit's number."),
    # Context limits and cooperative launches (issue 27).
    Op(0xD0, "CTX_SET_LIMIT", SYNC, _f("i32 limit, u64 value"), _f("u64 value"),
       doc="cuCtxSetLimit of the executor's context, charged what the driver's free memory "
           "fell by; replies what cuCtxGetLimit then says (the driver may round it)."),
    # The JIT linker (cuLinkCreate .. cuLinkDestroy): the guest keeps the link state and
    # sends it whole at cuLinkComplete; the executor links and keeps the image until the
    # guest fetches it into its own memory.
    Op(0xD2, "LINK", SYNC, _f("bytes options, bytes inputs, str names"),
       _f("u32 status, f32 wall_ms, u64 image, u64 size, str info_log, str error_log"),
       request_payload=True,
       doc="options: (u32 CUjit_option, u32 reserved, u64 value) each, scalar options only "
           "(LINK_OPTION_SIZE bytes); inputs: (u32 CUjitInputType, u32 reserved, u64 size) "
           "each (LINK_INPUT_SIZE bytes), the payload their bytes in order; names "
           "NUL-separated, one per input. status is the link's CUresult, the logs what the "
           "linker said (at most MAX_LINK_LOG bytes each); image names the linked cubin "
           "of size bytes, until LINK_IMAGE fetches it."),
    Op(0xD3, "LINK_IMAGE", SYNC, _f("u64 image"), reply_payload=True,
       doc="The linked cubin (reply payload) of a LINK of this connection, given once."),
    Op(0xD4, "MODULE_FUNCTION_NAMES", SYNC, _f("u64 module"), _f("bytes names"),
       doc="cuModuleEnumerateFunctions: the names of the module's functions in the "
           "driver's order, NUL-separated (each then found with MODULE_GET_FUNCTION); "
           "refused with CUDA_ERROR_INVALID_VALUE past MAX_FUNCTION_NAMES bytes."),
    Op(0xD1, "LAUNCH_COOPERATIVE", SYNC,
       _f("u64 function, u32 grid_x, u32 grid_y, u32 grid_z, u32 block_x, u32 block_y, "
          "u32 block_z, u32 shared_mem, u64 stream, bytes params, bytes attrs"),
       doc="cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_COOPERATIVE set (attrs as in "
           "LAUNCH_KERNEL_EX, the cooperative one included), answered: the driver's refusal "
           "of a grid larger than can be resident at once "
           "(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) comes back at the call."),
    Op(0x22, "MEM_ALLOC", SYNC, _f("u64 size"), _f("u64 dptr"),
       doc="Returns the real device address in the executor's context."),
    Op(0x23, "MEM_FREE", SYNC, _f("u64 dptr")),
    Op(0x24, "MEMCPY_HTOD", ONEWAY, _f("u64 dst, u64 stream"), request_payload=True,
       doc="The payload is the source bytes; ordered on the stream (0: legacy default)."),
    Op(0x25, "MEMCPY_DTOH", SYNC, _f("u64 src, u64 size, u64 stream"), reply_payload=True,
       doc="Waits for the stream's earlier work; the reply payload is the bytes."),
    Op(0x26, "MEMCPY_DTOD", ONEWAY, _f("u64 dst, u64 src, u64 size, u64 stream")),
    Op(0x27, "MEMSET", ONEWAY, _f("u64 dst, u64 count, u32 value, u32 width, u64 stream"),
       doc="cuMemsetD8/D16/D32Async by width (1, 2 or 4 bytes); count is in elements."),
    Op(0x30, "MODULE_LOAD_DATA", SYNC, (), _f("u64 module"), request_payload=True,
       doc="The payload is a PTX (NUL-terminated), cubin or fatbin image."),
    Op(0x31, "MODULE_COMPILE", SYNC, _f("str name, str options"), _f("u64 module, str log"),
       request_payload=True,
       doc="NVRTC on the host; the payload is CUDA C++ source; options are NUL-separated."),
    Op(0x3E, "MODULE_COMPILE_HEADERS", SYNC,
       _f("str name, str options, str header_names, bytes sizes"), _f("u64 module, str log"),
       request_payload=True,
       doc="MODULE_COMPILE with headers the source includes by name: the payload is the "
           "source, then each header's text; sizes holds their byte counts (u64 each, the "
           "source's first); header_names and options are NUL-separated."),
    Op(0x32, "MODULE_UNLOAD", SYNC, _f("u64 module")),
    Op(0x33, "MODULE_GET_FUNCTION", SYNC, _f("u64 module, str name"), _f("u64 function")),
    Op(0x34, "FUNC_GET_PARAM_INFO", SYNC, _f("u64 function"), _f("bytes layout"),
       doc="layout: one (u32 offset, u32 size) pair per parameter, from cuFuncGetParamInfo."),
    Op(0x35, "LAUNCH_KERNEL", ONEWAY,
       _f("u64 function, u32 grid_x, u32 grid_y, u32 grid_z, u32 block_x, u32 block_y, "
          "u32 block_z, u32 shared_mem, u64 stream, bytes params"),
       doc="params: the packed parameter buffer laid out by FUNC_GET_PARAM_INFO."),
    Op(0x36, "MODULE_GET_GLOBAL", SYNC, _f("u64 module, str name"), _f("u64 dptr, u64 size"),
       doc="cuModuleGetGlobal: the variable's device range becomes copyable by this guest."),
    Op(0x37, "FUNC_GET_ATTRIBUTE", SYNC, _f("u64 function, i32 attrib"), _f("i32 value"),
       doc="cuFuncGetAttribute; attrib is CUfunction_attribute's number."),
    Op(0x38, "FUNC_SET_ATTRIBUTE", ONEWAY, _f("u64 function, i32 attrib, i32 value"),
       doc="cuFuncSetAttribute (e.g. the dynamic shared memory limit); sent as a call, "
           "it is answered."),
    Op(0x39, "OCCUPANCY_MAX_BLOCKS", SYNC,
       _f("u64 function, i32 block_size, u64 shared_mem, u32 flags"), _f("i32 blocks"),
       doc="cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags."),
    Op(0x3A, "OCCUPANCY_AVAILABLE_SMEM", SYNC, _f("u64 function, i32 blocks, i32 block_size"),
       _f("u64 bytes"), doc="cuOccupancyAvailableDynamicSMemPerBlock."),
    Op(0x3B, "LAUNCH_KERNEL_EX", ONEWAY,
       _f("u64 function, u32 grid_x, u32 grid_y, u32 grid_z, u32 block_x, u32 block_y, "
          "u32 block_z, u32 shared_mem, u64 stream, bytes params, bytes attrs"),
       doc="cuLaunchKernelEx: attrs is the CUlaunchAttribute array as CUDA lays it out "
           "(72 bytes each); attributes naming events are not sent."),
    Op(0x3C, "TENSOR_MAP_ENCODE_TILED", SYNC,
       _f("u32 dtype, u32 rank, u64 address, bytes dims, bytes strides, bytes box, "
          "bytes element_strides, u32 interleave, u32 swizzle, u32 l2_promotion, u32 oob_fill"),
       _f("bytes map"),
       doc="cuTensorMapEncodeTiled on the host; dims/strides are u64 arrays, box and "
           "element_strides u32 arrays; the reply is the 128-byte CUtensorMap."),
    Op(0x3D, "OCCUPANCY_CLUSTERS", SYNC,
       _f("u32 which, u64 function, u32 grid_x, u32 grid_y, u32 grid_z, u32 block_x, "
          "u32 block_y, u32 block_z, u32 shared_mem, bytes attrs"), _f("i32 value"),
       doc="which 0: cuOccupancyMaxActiveClusters, 1: cuOccupancyMaxPotentialClusterSize, "
           "for the launch configuration given (attrs as in LAUNCH_KERNEL_EX)."),
    Op(0x3F, "FUNC_GET_ATTRIBUTES", SYNC, _f("u64 function, u32 count"),
       _f("u32 known, bytes values"),
       doc="Attributes 0..count-1 (count <= 32) at once as i32 each: the shim's cache of "
           "the function, filled in one round trip; bit i of known is set where the "
           "driver answered attribute i (0 stands in the others)."),
    Op(0x40, "STREAM_CREATE", SYNC, _f("u32 flags"), _f("u64 stream")),
    Op(0x41, "STREAM_DESTROY", SYNC, _f("u64 stream")),
    Op(0x42, "STREAM_SYNCHRONIZE", SYNC, _f("u64 stream")),
    Op(0x43, "STREAM_QUERY", SYNC, _f("u64 stream"),
       doc="Replies CUDA_ERROR_NOT_READY (600) while work is pending."),
    Op(0x44, "STREAM_WAIT_EVENT", ONEWAY, _f("u64 stream, u64 event, u32 flags")),
    Op(0x45, "STREAM_CREATE_PRIORITY", SYNC, _f("u32 flags, i32 priority"), _f("u64 stream")),
    Op(0x46, "STREAM_PRIORITY_RANGE", SYNC, (), _f("i32 least, i32 greatest"),
       doc="cuCtxGetStreamPriorityRange."),
    # Stream attributes: value is CUlaunchAttributeValue as cuda.h lays it out
    # (LAUNCH_ATTR_VALUE_SIZE bytes), for the attributes valid for streams alone.
    Op(0x47, "STREAM_SET_ATTRIBUTE", SYNC, _f("u64 stream, u32 attr, bytes value"),
       doc="cuStreamSetAttribute; an access policy window names memory of this guest."),
    Op(0x48, "STREAM_GET_ATTRIBUTE", SYNC, _f("u64 stream, u32 attr"), _f("bytes value"),
       doc="cuStreamGetAttribute: the value as cuda.h lays it out."),
    Op(0x49, "STREAM_COPY_ATTRIBUTES", SYNC, _f("u64 dst, u64 src"),
       doc="cuStreamCopyAttributes between two streams of this guest."),
    Op(0x50, "EVENT_CREATE", SYNC, _f("u32 flags"), _f("u64 event")),
    Op(0x51, "EVENT_DESTROY", SYNC, _f("u64 event")),
    Op(0x52, "EVENT_RECORD", ONEWAY, _f("u64 event, u64 stream")),
    Op(0x53, "EVENT_QUERY", SYNC, _f("u64 event"),
       doc="Replies CUDA_ERROR_NOT_READY (600) while the event is pending."),
    Op(0x54, "EVENT_SYNCHRONIZE", SYNC, _f("u64 event")),
    Op(0x55, "EVENT_ELAPSED_TIME", SYNC, _f("u64 start, u64 end"), _f("f32 ms")),
    # Graph memory: allocation and free nodes, the driver's graph memory pool (issue: graph
    # memory nodes). An allocation node's address is the driver's, fixed for the graph's
    # life; the slice is charged what the connection's instantiations allocate.
    Op(0x56, "GRAPH_ADD_MEM_ALLOC_NODE", SYNC,
       _f("u64 graph, u64 size, u32 location_type, i32 location_id, bytes deps"),
       _f("u64 node, u64 dptr"),
       doc="cuGraphAddMemAllocNode of size bytes of device memory (location_type 1, "
           "location_id 0: this vGPU's), readable and writable by it alone; dptr is the "
           "allocation's address."),
    Op(0x57, "GRAPH_ADD_MEM_FREE_NODE", SYNC, _f("u64 graph, u64 dptr, bytes deps"),
       _f("u64 node"),
       doc="cuGraphAddMemFreeNode of dptr, an address an allocation node of this "
           "connection's graphs returned."),
    Op(0x58, "GRAPH_NODE_GET_TYPE", SYNC, _f("u64 node"),
       _f("u32 type, u32 reserved, u64 dptr, u64 size"),
       doc="cuGraphNodeGetType: type is CUgraphNodeType's number; of an allocation node "
           "(10) its address and size, of a free node (11) the address it frees."),
    Op(0x59, "DEVICE_GRAPH_MEM_TRIM", SYNC, (),
       doc="cuDeviceGraphMemTrim: the graph memory pool gives back what no allocation uses."),
    Op(0x5A, "DEVICE_GRAPH_MEM_ATTRIBUTE", SYNC, _f("u32 attr, u32 set, u64 value"),
       _f("u64 value"),
       doc="cuDeviceGetGraphMemAttribute (set 0) or cuDeviceSetGraphMemAttribute (set 1, "
           "only a high-water mark, only to 0); attr is CUgraphMem_attribute's number."),
    # Virtual memory management: device-located, non-exportable memory only. A
    # location is (CUmemLocationType, device), the device as the connection sees it (0).
    Op(0x60, "MEM_ADDRESS_RESERVE", SYNC, _f("u64 size, u64 alignment, u64 addr, u64 flags"),
       _f("u64 dptr"), doc="cuMemAddressReserve: addresses with no memory behind them."),
    Op(0x61, "MEM_ADDRESS_FREE", SYNC, _f("u64 dptr, u64 size"),
       doc="cuMemAddressFree of a whole reservation with nothing mapped in it."),
    Op(0x62, "MEM_CREATE", SYNC,
       _f("u64 size, u32 type, u32 handle_types, u32 location_type, i32 location_id, "
          "u32 alloc_flags"), _f("u64 handle"),
       doc="cuMemCreate, charged to the slice; alloc_flags: CUmemAllocationProp's allocFlags "
           "(compressionType, gpuDirectRDMACapable, usage) as its first four bytes."),
    Op(0x63, "MEM_RELEASE", SYNC, _f("u64 handle"),
       doc="cuMemRelease: the memory goes once nothing maps it."),
    Op(0x64, "MEM_MAP", SYNC, _f("u64 dptr, u64 size, u64 offset, u64 handle, u64 flags"),
       doc="cuMemMap inside a reservation of this guest."),
    Op(0x65, "MEM_UNMAP", SYNC, _f("u64 dptr, u64 size"),
       doc="cuMemUnmap of whole mappings."),
    Op(0x66, "MEM_SET_ACCESS", SYNC, _f("u64 dptr, u64 size, bytes descs"),
       doc="cuMemSetAccess; descs: CUmemAccessDesc array as CUDA lays it out (12 bytes "
           "each). Mapped memory becomes copyable by this guest once readable and writable."),
    Op(0x67, "MEM_GET_ACCESS", SYNC, _f("u64 dptr"), _f("u64 flags"),
       doc="cuMemGetAccess for this connection's device."),
    Op(0x68, "MEM_GET_GRANULARITY", SYNC, _f("u32 option"), _f("u64 granularity"),
       doc="cuMemGetAllocationGranularity of device memory (option 0: minimum, "
           "1: recommended)."),
    Op(0x69, "MEM_RETAIN_HANDLE", SYNC, _f("u64 dptr"), _f("u64 handle"),
       doc="cuMemRetainAllocationHandle: the handle mapped at dptr, with one more reference."),
    Op(0x6A, "MEM_HANDLE_INFO", SYNC, _f("u64 handle"), _f("u64 size"),
       doc="The size of a handle of this guest (cuMemGetAllocationPropertiesFromHandle)."),
    Op(0x6B, "MEM_GET_GRANULARITY_OF", SYNC, _f("u32 option, u32 alloc_flags"),
       _f("u64 granularity"),
       doc="cuMemGetAllocationGranularity of device memory made with alloc_flags "
           "(as MEM_CREATE's: a compression type in its first byte)."),
    Op(0x6C, "MEM_HANDLE_PROPS", SYNC, _f("u64 handle"), _f("u64 size, u32 alloc_flags"),
       doc="cuMemGetAllocationPropertiesFromHandle of a handle of this guest: its size and "
           "the allocation flags the driver made it with (compression it was granted)."),
    # Stream-ordered allocation. Pool 0 stands for the connection's default pool.
    Op(0x70, "MEM_POOL_CREATE", SYNC,
       _f("u32 type, u32 handle_types, u32 location_type, i32 location_id, u64 max_size, "
          "u32 usage"), _f("u64 pool"), doc="cuMemPoolCreate of a device pool."),
    Op(0x71, "MEM_POOL_DESTROY", SYNC, _f("u64 pool")),
    Op(0x72, "MEM_POOL_DEFAULT", SYNC, (), _f("u64 pool"),
       doc="The connection's default pool (cuDeviceGetDefaultMemPool)."),
    Op(0x73, "MEM_ALLOC_ASYNC", SYNC, _f("u64 size, u64 pool, u64 stream"), _f("u64 dptr"),
       doc="cuMemAllocFromPoolAsync; the slice is charged what the pool holds."),
    Op(0x74, "MEM_FREE_ASYNC", ONEWAY, _f("u64 dptr, u64 stream"), doc="cuMemFreeAsync."),
    Op(0x75, "MEM_POOL_SET_ATTRIBUTE", SYNC, _f("u64 pool, i32 attrib, u64 value"),
       doc="cuMemPoolSetAttribute; attrib is CUmemPool_attribute's number."),
    Op(0x76, "MEM_POOL_GET_ATTRIBUTE", SYNC, _f("u64 pool, i32 attrib"), _f("u64 value")),
    Op(0x77, "MEM_POOL_TRIM_TO", SYNC, _f("u64 pool, u64 keep"), doc="cuMemPoolTrimTo."),
    # The region lane (hvgpu/virtio/region.py): bulk bytes in a region both
    # sides map, named by (region, offset). A region is this connection's memfd, or
    # the VM's device region, of which a connection copies only what it allocated.
    # REGION_ATTACH/DETACH/ALLOC/FREE are no synchronising points: an earlier one-way op's
    # error is kept for the next other synchronous op, and they are done regardless.
    Op(0x90, "REGION_ATTACH", SYNC, _f("u32 kind, u32 flags, u64 size"),
       _f("u32 region, u32 device, u64 size, bytes token"),
       doc="kind 1 (memfd): the fd travels with this frame (SCM_RIGHTS), sealed against "
           "shrinking, size bytes long; kind 2 (device): the VM's ivshmem region, whose "
           "header the executor writes with the token and vGPU device number it replies "
           "(size 0: all of it). "
           "The region is registered with the driver (DMA) and counts against the "
           "VM's region limit."),
    Op(0x91, "REGION_DETACH", SYNC, _f("u32 region"),
       doc="Waits for the connection's work, then unregisters and unmaps the region."),
    Op(0x92, "REGION_ALLOC", SYNC, _f("u32 region, u32 reserved, u64 size"), _f("u64 offset"),
       doc="Room in a region (page-aligned) for this connection: its pinned host memory."),
    Op(0x93, "REGION_FREE", SYNC, _f("u32 region, u32 reserved, u64 offset"),
       doc="Gives back an REGION_ALLOC after the connection's work on it is done."),
    Op(0x94, "MEMCPY_HTOD_REGION", ONEWAY,
       _f("u64 dst, u32 region, u32 reserved, u64 offset, u64 size, u64 stream"),
       doc="cuMemcpyHtoDAsync from the region: ordered on the stream, DMA."),
    Op(0x95, "MEMCPY_DTOH_REGION", ONEWAY,
       _f("u32 region, u32 reserved, u64 offset, u64 src, u64 size, u64 stream"),
       doc="cuMemcpyDtoHAsync into the region: the bytes are there once a later "
           "synchronising op on the stream (or the context) has answered."),
    Op(0x80, "FUNC_SET_CACHE_CONFIG", ONEWAY, _f("u64 function, u32 config"),
       doc="cuFuncSetCacheConfig; config is CUfunc_cache's number."),
    # Stream capture and CUDA graphs: the executor's real streams capture; graphs and
    # their instantiations are the executor's, named by handles of this connection.
    Op(0xA0, "STREAM_BEGIN_CAPTURE", SYNC, _f("u64 stream, u32 mode"),
       _f("u64 id, u64 graph"),
       doc="cuStreamBeginCapture; mode is CUstreamCaptureMode's number. Replies the "
           "capture's id and the handle of the graph it builds (the one END_CAPTURE gives)."),
    Op(0xA1, "STREAM_END_CAPTURE", SYNC, _f("u64 stream"), _f("u64 graph"),
       doc="cuStreamEndCapture: the graph's handle. A capture that failed replies its "
           "error (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, ...) and has ended all the same. "
           "Carried out even where an earlier one-way frame's error is owed (a later call "
           "reports it); a one-way frame of the capture that failed invalidated it."),
    Op(0xA2, "STREAM_CAPTURE_INFO", SYNC, _f("u64 stream, u32 nodes"),
       _f("u32 status, u32 reserved, u64 id, u64 graph, bytes nodes"),
       doc="cuStreamGetCaptureInfo: status is CUstreamCaptureStatus's number; while "
           "active, the graph's handle and, where nodes is 1, the node handles (u64 each) "
           "the stream's next captured work will depend on (each node named is given a "
           "handle for as long as its graph: nodes 0 where they are not wanted)."),
    Op(0xA3, "GRAPH_INSTANTIATE", SYNC, _f("u64 graph, u64 flags"), _f("u64 exec"),
       doc="cuGraphInstantiateWithFlags; flags are CUgraphInstantiate_flags."),
    Op(0xA4, "GRAPH_LAUNCH", ONEWAY, _f("u64 exec, u64 stream"), doc="cuGraphLaunch."),
    Op(0xA5, "GRAPH_UPLOAD", ONEWAY, _f("u64 exec, u64 stream"), doc="cuGraphUpload."),
    Op(0xA6, "GRAPH_DESTROY", SYNC, _f("u64 graph"), doc="cuGraphDestroy."),
    Op(0xA7, "GRAPH_EXEC_DESTROY", SYNC, _f("u64 exec"), doc="cuGraphExecDestroy."),
    Op(0xA8, "GRAPH_GET_NODES", SYNC, _f("u64 graph, u32 max"), _f("u64 count, bytes nodes"),
       doc="cuGraphGetNodes: how many nodes the graph has, and the handles (u64 each) of "
           "the first max of them."),
    # Graphs built node by node. deps: the node handles (u64 each) the new node depends on,
    # nodes of the same graph.
    Op(0xA9, "GRAPH_CREATE", SYNC, _f("u32 flags"), _f("u64 graph"), doc="cuGraphCreate."),
    Op(0xAA, "GRAPH_ADD_KERNEL_NODE", SYNC,
       _f("u64 graph, u64 function, u32 grid_x, u32 grid_y, u32 grid_z, u32 block_x, "
          "u32 block_y, u32 block_z, u32 shared_mem, bytes deps, bytes params"), _f("u64 node"),
       doc="cuGraphAddKernelNode; params is the packed parameter buffer, as for a launch."),
    Op(0xAB, "GRAPH_ADD_MEMSET_NODE", SYNC,
       _f("u64 graph, u64 dst, u64 pitch, u32 value, u32 element_size, u64 width, "
          "u64 height, bytes deps"), _f("u64 node"),
       doc="cuGraphAddMemsetNode: height rows of width elements (1, 2 or 4 bytes), pitch "
           "bytes apart."),
    Op(0xAC, "GRAPH_ADD_MEMCPY_NODE", SYNC,
       _f("u64 graph, u32 kind, u32 region, u64 dst, u64 src, u64 size, bytes deps"),
       _f("u64 node"),
       doc="cuGraphAddMemcpyNode of size bytes; kind 0: device to device; 1: from the "
           "region (src is an offset in it) to the device; 2: from the device to the region "
           "(dst is an offset)."),
    Op(0xAD, "GRAPH_ADD_EMPTY_NODE", SYNC, _f("u64 graph, bytes deps"), _f("u64 node"),
       doc="cuGraphAddEmptyNode."),
    Op(0xAE, "GRAPH_ADD_EVENT_NODE", SYNC, _f("u64 graph, u32 wait, u32 reserved, u64 event, "
                                              "bytes deps"), _f("u64 node"),
       doc="cuGraphAddEventRecordNode (wait 0) or cuGraphAddEventWaitNode (wait 1)."),
    Op(0xAF, "GRAPH_ADD_DEPENDENCIES", SYNC, _f("u64 graph, bytes from_nodes, bytes to_nodes"),
       doc="cuGraphAddDependencies: edges from_nodes[i] -> to_nodes[i]."),
    Op(0xB0, "GRAPH_EXEC_KERNEL_NODE_SET_PARAMS", SYNC,
       _f("u64 exec, u64 node, u64 function, u32 grid_x, u32 grid_y, u32 grid_z, "
          "u32 block_x, u32 block_y, u32 block_z, u32 shared_mem, bytes params"),
       doc="cuGraphExecKernelNodeSetParams: the kernel node's parameters in an "
           "instantiated graph (node is a node of the graph it was made from)."),
    Op(0xB1, "GRAPH_EXEC_UPDATE", SYNC, _f("u64 exec, u64 graph"),
       _f("u32 result, u32 reserved, u64 error_node"),
       doc="cuGraphExecUpdate: result is CUgraphExecUpdateResult's number; the call fails "
           "(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) where the graph's shape differs."),
    Op(0xB2, "GRAPH_CLONE", SYNC, _f("u64 graph"), _f("u64 clone"),
       doc="cuGraphClone: a new graph of this connection, a copy of graph."),
    Op(0xB3, "GRAPH_NODE_FIND_IN_CLONE", SYNC, _f("u64 clone, u64 node"), _f("u64 node"),
       doc="cuGraphNodeFindInClone: the node of clone that is the copy of node, a node "
           "of the graph clone was made from."),
    Op(0xB4, "GRAPH_CONDITIONAL_HANDLE_CREATE", SYNC,
       _f("u64 graph, u32 default_value, u32 flags"), _f("u64 handle"),
       doc="cuGraphConditionalHandleCreate: handle is the driver's "
           "CUgraphConditionalHandle value (a kernel sets it, given it as a parameter); "
           "flags are CU_GRAPH_COND_ASSIGN_DEFAULT or 0."),
    Op(0xB5, "GRAPH_ADD_CONDITIONAL_NODE", SYNC,
       _f("u64 graph, u64 handle, u32 type, u32 size, bytes deps"), _f("u64 node, bytes bodies"),
       doc="cuGraphAddNode of a conditional node: type is CUgraphConditionalNodeType's "
           "number (0 IF, 1 WHILE, 2 SWITCH), size how many body graphs (at most "
           "MAX_CONDITIONAL_BODIES), handle one GRAPH_CONDITIONAL_HANDLE_CREATE made for "
           "this graph or one it is the body of. bodies: the handles (u64 each) of the "
           "node's body graphs, the driver's and the node's own: nodes are added to them, "
           "and they go with the node's graph."),
    # CUDA arrays, mipmapped arrays, texture and surface objects, 2D/3D copies (issue 27).
    # An array is the executor's, named by a handle of this connection; a texture or
    # surface object is named by the driver's own value (a kernel reads it as a
    # parameter), which the executor serves only to the connection that made it. A copy
    # side is (kind, where, x in bytes, y, z, pitch, height) with kind CUmemorytype's
    # number: 2 device memory (where: its address), 3 an array (where: its handle).
    Op(0xC0, "ARRAY_CREATE", SYNC,
       _f("u64 width, u64 height, u64 depth, u32 format, u32 channels, u32 flags"),
       _f("u64 array"),
       doc="cuArray3DCreate (cuArrayCreate: depth 0, flags 0), charged what it took."),
    Op(0xC1, "ARRAY_DESTROY", SYNC, _f("u64 array"), doc="cuArrayDestroy."),
    Op(0xC2, "ARRAY_GET_DESCRIPTOR", SYNC, _f("u64 array"),
       _f("u64 width, u64 height, u64 depth, u32 format, u32 channels, u32 flags"),
       doc="cuArray3DGetDescriptor of an array of this connection (a mipmap level too)."),
    Op(0xC3, "MIPMAPPED_ARRAY_CREATE", SYNC,
       _f("u64 width, u64 height, u64 depth, u32 format, u32 channels, u32 flags, u32 levels"),
       _f("u64 mipmap"), doc="cuMipmappedArrayCreate, charged what it took."),
    Op(0xC4, "MIPMAPPED_ARRAY_DESTROY", SYNC, _f("u64 mipmap"),
       doc="cuMipmappedArrayDestroy: its levels' handles go with it."),
    Op(0xC5, "MIPMAPPED_ARRAY_GET_LEVEL", SYNC, _f("u64 mipmap, u32 level"), _f("u64 array"),
       doc="cuMipmappedArrayGetLevel: an array handle, not destroyable on its own."),
    Op(0xC6, "TEX_OBJECT_CREATE", SYNC,
       _f("u32 res_type, u32 format, u64 resource, u64 width, u64 height, u64 pitch, "
          "u32 channels, u32 res_flags, bytes tex_desc, bytes view_desc"), _f("u64 object"),
       doc="cuTexObjectCreate. res_type is CUresourcetype's number: 0 array, 1 mipmapped "
           "array (resource: its handle), 2 linear (resource: a device address, width its "
           "size in bytes), 3 pitch2D (resource: a device address, width in elements); "
           "tex_desc is CUDA_TEXTURE_DESC as cuda.h lays it out (TEX_DESC_SIZE bytes), "
           "view_desc CUDA_RESOURCE_VIEW_DESC (VIEW_DESC_SIZE bytes) or empty. object is the "
           "driver's CUtexObject value."),
    Op(0xC7, "TEX_OBJECT_DESTROY", SYNC, _f("u64 object"), doc="cuTexObjectDestroy."),
    Op(0xC8, "SURF_OBJECT_CREATE", SYNC, _f("u64 array"), _f("u64 object"),
       doc="cuSurfObjectCreate of an array of this connection (made with "
           "CUDA_ARRAY3D_SURFACE_LDST); object is the driver's CUsurfObject value."),
    Op(0xC9, "SURF_OBJECT_DESTROY", SYNC, _f("u64 object"), doc="cuSurfObjectDestroy."),
    Op(0xCA, "MEMCPY_3D", ONEWAY,
       _f("u32 src_kind, u32 dst_kind, u64 src, u64 src_x, u64 src_y, u64 src_z, "
          "u64 src_pitch, u64 src_height, u64 dst, u64 dst_x, u64 dst_y, u64 dst_z, "
          "u64 dst_pitch, u64 dst_height, u64 width, u64 height, u64 depth, u64 stream"),
       doc="cuMemcpy3DAsync between device memory and arrays of this connection: depth "
           "slices of height rows of width bytes."),
    Op(0xCB, "MEMCPY_3D_TO", ONEWAY,
       _f("u32 dst_kind, u32 reserved, u64 dst, u64 dst_x, u64 dst_y, u64 dst_z, "
          "u64 dst_pitch, u64 dst_height, u64 width, u64 height, u64 depth, u64 stream"),
       request_payload=True,
       doc="cuMemcpy3DAsync from the guest's memory: the payload is the rows, width bytes "
           "each, packed (width * height * depth bytes, at most MAX_COPY_3D)."),
    Op(0xCC, "MEMCPY_3D_FROM", SYNC,
       _f("u32 src_kind, u32 reserved, u64 src, u64 src_x, u64 src_y, u64 src_z, "
          "u64 src_pitch, u64 src_height, u64 width, u64 height, u64 depth, u64 stream"),
       reply_payload=True,
       doc="cuMemcpy3DAsync to the guest's memory, after the stream's earlier work: the "
           "reply payload is the rows, width bytes each, packed (at most MAX_COPY_3D)."),
    # CUDA IPC between the processes of one VM (issue: IPC). Every process of a VM that
    # uses a vGPU has its connection to that vGPU's one executor, which serves the IPC
    # itself: a handle is an unguessable token (IPC_HANDLE_SIZE random bytes) naming an
    # allocation or an event in the executor's table of exports, which no other VM's
    # executor holds.
    Op(0xE0, "IPC_GET_MEM_HANDLE", SYNC, _f("u64 dptr"), _f("bytes handle"),
       doc="cuIpcGetMemHandle of the cuMemAlloc allocation dptr lies in: its token, the "
           "same each time while the allocation lives."),
    Op(0xE1, "IPC_OPEN_MEM_HANDLE", SYNC, _f("u32 flags, bytes handle"),
       _f("u64 dptr, u64 size"),
       doc="cuIpcOpenMemHandle: the allocation's base and size, copyable by this "
           "connection until it closes it as often as it opened it; refused "
           "(CUDA_ERROR_INVALID_CONTEXT) in the connection that exported it."),
    Op(0xE2, "IPC_CLOSE_MEM_HANDLE", SYNC, _f("u64 dptr"), _f("u32 left"),
       doc="cuIpcCloseMemHandle of a base this connection opened: left is how many opens "
           "of it are still held (0: no longer copyable by this connection)."),
    Op(0xE3, "IPC_GET_EVENT_HANDLE", SYNC, _f("u64 event"), _f("bytes handle"),
       doc="cuIpcGetEventHandle of an event made with CU_EVENT_INTERPROCESS and "
           "CU_EVENT_DISABLE_TIMING."),
    Op(0xE4, "IPC_OPEN_EVENT_HANDLE", SYNC, _f("bytes handle"), _f("u64 event"),
       doc="cuIpcOpenEventHandle: a handle of this connection for the exported event "
           "(EVENT_DESTROY lets it go)."),
    Op(0xE5, "MEM_EXPORT", SYNC, _f("u64 handle, u32 handle_type, u32 flags"),
       _f("bytes token"),
       doc="cuMemExportToShareableHandle of memory made exportable as a POSIX file "
           "descriptor (handle_type 1): the token (IPC_HANDLE_SIZE bytes) the guest "
           "library puts in the descriptor it gives the program."),
    Op(0xE6, "MEM_IMPORT", SYNC, _f("u32 handle_type, bytes token"), _f("u64 handle"),
       doc="cuMemImportFromShareableHandle: a handle of this connection for the memory "
           "a MEM_EXPORT token names (any connection of the VM's vGPU, this one too)."),
    # Page-locked memory a kernel reaches through the guest's own pointer, and stream
    # memory operations (executor/host_maps.py, ops/memops.py).
    Op(0xF0, "HOST_MAP", SYNC,
       _f("u32 region, u32 reserved, u64 offset, u64 size, u64 addr"), _f("u64 dptr"),
       doc="Maps pinned memory of this connection (a memfd region whole: offset 0, its "
           "size; or a room of the VM's region: its offset and the size REGION_ALLOC "
           "took) a second time in the executor, at addr, the address the guest maps it "
           "at (page-aligned, in user space, where nothing is mapped), and registers it "
           "with the driver device-mapped: dptr is its device address, addr itself. "
           "Unmapped when the room is freed or the region detached. "
           "CUDA_ERROR_NOT_SUPPORTED where it cannot be mapped there."),
    Op(0xF1, "STREAM_MEMOP", ONEWAY,
       _f("u64 stream, u32 flags, u32 call, u32 count, bytes ops"),
       doc="cuStreamBatchMemOp (call 0, _v2; 1: the deprecated v1) or one "
           "cuStreamWaitValue32/64 or cuStreamWriteValue32/64 (call 2: _v2; 3: v1; ops "
           "holds one): ops is count records of MEMOP_SIZE bytes (u32 operation, u32 "
           "flags, u64 address, u64 value), CUstreamBatchMemOpType's operations, at most "
           "MAX_MEMOPS; every address lies in device memory of this connection or in its "
           "device-mapped pinned memory (HOST_MAP)."),
    # Stream-ordered pools shared among the VM's processes, as VMM memory is: a pool made
    # exportable as a POSIX file descriptor and each allocation from it are tokens of the
    # executor's table; an imported pool only reaches the allocations imported into it.
    Op(0xE7, "MEM_POOL_EXPORT", SYNC, _f("u64 pool, u32 handle_type, u32 flags"),
       _f("bytes token"),
       doc="cuMemPoolExportToShareableHandle of a pool made exportable as a POSIX file "
           "descriptor (handle_type 1): its token, the same each time while the pool lives."),
    Op(0xE8, "MEM_POOL_IMPORT", SYNC, _f("u32 handle_type, u32 flags, bytes token"),
       _f("u64 pool"),
       doc="cuMemPoolImportFromShareableHandle: a pool handle of this connection for the "
           "pool a MEM_POOL_EXPORT token names; nothing is allocated from it."),
    Op(0xE9, "MEM_POOL_EXPORT_POINTER", SYNC, _f("u64 dptr"), _f("bytes token"),
       doc="cuMemPoolExportPointer of an allocation (its base) from an exportable pool of "
           "this connection: the token CUmemPoolPtrExportData carries (IPC_HANDLE_SIZE "
           "bytes), withdrawn when the allocation is freed."),
    Op(0xEA, "MEM_POOL_IMPORT_POINTER", SYNC, _f("u64 pool, bytes token"),
       _f("u64 dptr, u64 size"),
       doc="cuMemPoolImportPointer into a pool this connection imported: the allocation's "
           "base and size, copyable by this connection until it frees it (MEM_FREE_ASYNC)."),
)

# Body of every reply whose status is not success.
ERROR_FIELDS = _f("u16 op, u16 reserved, u32 seq, str message")

# Limits and layouts inside the ops' fields, which every guest and the executor keep
# alike.
MAX_PARAMS = 32764  # bytes of kernel parameters one launch carries (CUDA 12.1+'s limit)
LAUNCH_ATTR_SIZE = 72  # one CUlaunchAttribute in a launch's or a cluster query's attrs
LAUNCH_ATTR_VALUE_SIZE = 64  # one CUlaunchAttributeValue (STREAM_SET_ATTRIBUTE's value)
# CUlaunchAttributeID's attributes cuda.h says are valid for streams: access policy
# window, synchronization policy, priority, memory sync domain map and domain, NVLink
# utilisation-centric scheduling.
STREAM_ATTRS = frozenset({1, 3, 8, 9, 10, 16})
MAX_LAUNCH_ATTRS = 32  # attributes a guest sends with one launch (the executor's C loop
                       # serves this many; more go through its Python path)
# CUlaunchAttributeID's attributes that name events: a guest does not send them (an
# event is the executor's), and the executor refuses them.
LAUNCH_ATTR_PROGRAMMATIC_EVENT = 7
LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT = 12
LAUNCH_ATTR_COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE: its value is an int, 0 or not
LAUNCH_EVENT_ATTRS = frozenset({LAUNCH_ATTR_PROGRAMMATIC_EVENT,
                                LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT})
MAX_DEVICE_ATTRIBUTES = 1024  # DEVICE_GET_ATTRIBUTES's count at most
MAX_FUNCTION_NAMES = 512 << 10  # MODULE_FUNCTION_NAMES's names at most, NUL-separated
MAX_FUNC_ATTRIBUTES = 32  # FUNC_GET_ATTRIBUTES's count at most: its reply's known is 32 bits
UUID_SIZE = 16  # DEVICE_GET_UUID's uuid (a CUuuid)
TENSOR_MAP_SIZE = 128  # TENSOR_MAP_ENCODE_TILED's map (a CUtensorMap)
MAX_ATOMIC_OPERATIONS = 64  # CUatomicOperation values DEVICE_HOST_ATOMIC_CAPS asks at once
ACCESS_DESC_SIZE = 12  # one CUmemAccessDesc in MEM_SET_ACCESS's descs
MAX_ACCESS_DESCS = 64  # descriptors one MEM_SET_ACCESS carries at most
MAX_QUERY_NODES = 4096  # dependency nodes one STREAM_CAPTURE_INFO answers at most
MAX_GRAPH_NODES = 65536  # node handles a connection is given at most
MAX_CONDITIONAL_BODIES = 1024  # body graphs one conditional node has at most (SWITCH)
# Handles the executor gives (streams, events, modules, functions, graphs, ...) start
# here: below are CUDA's special stream values (0, 1, 2), which a guest sends as they are.
FIRST_HANDLE = 16
# GRAPH_ADD_MEMCPY_NODE's kind
MEMCPY_NODE_DEVICE = 0  # device to device
MEMCPY_NODE_FROM_REGION = 1  # src is an offset in the region
MEMCPY_NODE_TO_REGION = 2  # dst is an offset in the region
# Arrays and textures (issue 27)
MEMORY_DEVICE = 2  # a copy side's kind: CUmemorytype's CU_MEMORYTYPE_DEVICE
MEMORY_ARRAY = 3  # CU_MEMORYTYPE_ARRAY
MAX_COPY_3D = 8 << 20  # bytes one MEMCPY_3D_TO or MEMCPY_3D_FROM carries at most
# The JIT linker (LINK)
LINK_OPTION_SIZE = 16  # one (u32 option, u32 reserved, u64 value) in LINK's options
LINK_INPUT_SIZE = 16  # one (u32 type, u32 reserved, u64 size) in LINK's inputs
MAX_LINK_OPTIONS = 64  # options one link takes at most
MAX_LINK_INPUTS = 256  # inputs one link takes at most
MAX_LINK_BYTES = 256 << 20  # the inputs' bytes together, at most
MAX_LINK_LOG = 64 << 10  # bytes of each log a link replies, at most (NUL included)
TEX_DESC_SIZE = 104  # CUDA_TEXTURE_DESC
VIEW_DESC_SIZE = 112  # CUDA_RESOURCE_VIEW_DESC
IPC_HANDLE_SIZE = 64  # an IPC token: CUipcMemHandle's, CUipcEventHandle's and
                      # CUmemPoolPtrExportData's size
# Stream memory operations (STREAM_MEMOP)
MEMOP_SIZE = 24  # one (u32 operation, u32 flags, u64 address, u64 value) in its ops
MAX_MEMOPS = 256  # operations one STREAM_MEMOP carries at most (cuStreamBatchMemOp's limit)
MEMOP_BATCH, MEMOP_BATCH_V1, MEMOP_ONE, MEMOP_ONE_V1 = 0, 1, 2, 3  # its call

# name -> C type of what the C header carries besides the op table (cgen), as
# HVGPU_<name> ("i32": a plain int literal, as C writes small counts).
C_CONSTANTS = (
    ("MAX_PARAMS", "i32"), ("LAUNCH_ATTR_SIZE", "i32"),
    ("MAX_LAUNCH_ATTRS", "i32"), ("LAUNCH_ATTR_PROGRAMMATIC_EVENT", "i32"),
    ("LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT", "i32"), ("MAX_DEVICE_ATTRIBUTES", "i32"),
    ("LAUNCH_ATTR_COOPERATIVE", "i32"), ("LAUNCH_ATTR_VALUE_SIZE", "i32"),
    ("MAX_FUNC_ATTRIBUTES", "i32"), ("UUID_SIZE", "i32"), ("TENSOR_MAP_SIZE", "i32"),
    ("MAX_ATOMIC_OPERATIONS", "i32"),
    ("ACCESS_DESC_SIZE", "i32"), ("MAX_ACCESS_DESCS", "i32"), ("MAX_QUERY_NODES", "i32"),
    ("MAX_GRAPH_NODES", "i32"), ("MAX_CONDITIONAL_BODIES", "i32"), ("FIRST_HANDLE", "i32"),
    ("MEMCPY_NODE_DEVICE", "i32"),
    ("MEMCPY_NODE_FROM_REGION", "i32"), ("MEMCPY_NODE_TO_REGION", "i32"),
    ("MAX_VGPUS", "i32"), ("CLIENT_FORMAT", "str"),
    ("MEMORY_DEVICE", "i32"), ("MEMORY_ARRAY", "i32"), ("MAX_COPY_3D", "i32"),
    ("TEX_DESC_SIZE", "i32"), ("VIEW_DESC_SIZE", "i32"), ("IPC_HANDLE_SIZE", "i32"),
    ("LINK_OPTION_SIZE", "i32"), ("LINK_INPUT_SIZE", "i32"), ("MAX_LINK_OPTIONS", "i32"),
    ("MAX_LINK_INPUTS", "i32"), ("MAX_LINK_BYTES", "i32"), ("MAX_LINK_LOG", "i32"),
    ("MAX_FUNCTION_NAMES", "i32"),
    ("MEMOP_SIZE", "i32"), ("MAX_MEMOPS", "i32"), ("MEMOP_BATCH", "i32"),
    ("MEMOP_BATCH_V1", "i32"), ("MEMOP_ONE", "i32"), ("MEMOP_ONE_V1", "i32"),
)

OPS_BY_CODE = {op.code: op for op in OPS}
OPS_BY_NAME = {op.name: op for op in OPS}
OP = {op.name: op.code for op in OPS}  # OP["MEM_ALLOC"] == 0x22
assert len(OPS_BY_CODE) == len(OPS) and len(OPS_BY_NAME) == len(OPS)

# Statuses: CUDA's CUresult numbers (the ones the data lane produces or passes
# on; any other number still travels and is shown as CUDA_ERROR_<n>), then
# hvgpu's own wire statuses from 10000 up, where CUDA defines none.
STATUSES: dict[int, tuple[str, str]] = {
    0: ("CUDA_SUCCESS", "no error"),
    1: ("CUDA_ERROR_INVALID_VALUE", "an argument is out of range"),
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of device memory"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "the driver is not initialised"),
    4: ("CUDA_ERROR_DEINITIALIZED", "the driver is shutting down"),
    34: ("CUDA_ERROR_STUB_LIBRARY", "the driver found is a stub library"),
    35: ("CUDA_ERROR_INSUFFICIENT_DRIVER", "the installed driver is older than the runtime"),
    46: ("CUDA_ERROR_DEVICE_UNAVAILABLE", "the device is unavailable (the connection to the "
                                          "hvgpu agent was lost)"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is available"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    200: ("CUDA_ERROR_INVALID_IMAGE", "the module image is not valid"),
    201: ("CUDA_ERROR_INVALID_CONTEXT", "invalid context"),
    209: ("CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image for this GPU"),
    215: ("CUDA_ERROR_UNSUPPORTED_LIMIT", "the context limit is not supported by the device"),
    218: ("CUDA_ERROR_INVALID_PTX", "the PTX could not be compiled"),
    222: ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the PTX version is newer than the driver"),
    224: ("CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", "the execution affinity is not supported"),
    300: ("CUDA_ERROR_INVALID_SOURCE", "the source could not be compiled"),
    301: ("CUDA_ERROR_FILE_NOT_FOUND", "file not found"),
    400: ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    401: ("CUDA_ERROR_ILLEGAL_STATE", "the resource is not in a state the operation allows"),
    500: ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    600: ("CUDA_ERROR_NOT_READY", "work is still pending"),
    700: ("CUDA_ERROR_ILLEGAL_ADDRESS", "a kernel accessed an illegal address"),
    701: ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"),
    702: ("CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out"),
    712: ("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "the host memory is already "
                                                      "registered"),
    713: ("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "the host memory is not registered"),
    714: ("CUDA_ERROR_HARDWARE_STACK_ERROR", "a kernel's call stack overflowed"),
    715: ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "a kernel executed an illegal instruction"),
    716: ("CUDA_ERROR_MISALIGNED_ADDRESS", "a kernel accessed a misaligned address"),
    717: ("CUDA_ERROR_INVALID_ADDRESS_SPACE", "a kernel accessed an invalid address space"),
    718: ("CUDA_ERROR_INVALID_PC", "a kernel's program counter became invalid"),
    719: ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    720: ("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "a cooperative launch has more blocks "
                                                     "than can be resident at once"),
    800: ("CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
    801: ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    900: ("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "the operation is not permitted while "
                                                   "the stream is capturing"),
    901: ("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "the stream capture failed because of an "
                                                   "earlier error"),
    902: ("CUDA_ERROR_STREAM_CAPTURE_MERGE", "the operation would merge two capture sequences"),
    903: ("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "the capture was not begun on this stream"),
    904: ("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "a stream forked from the capture was not "
                                                "joined back"),
    905: ("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "a dependency would cross the capture's "
                                                 "boundary"),
    906: ("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "the legacy stream would join a capture"),
    907: ("CUDA_ERROR_CAPTURED_EVENT", "the event was last recorded in a capture"),
    908: ("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "the capture was begun on another thread"),
    910: ("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", "the graph cannot update the instantiated "
                                                  "graph (its shape differs)"),
    805: ("CUDA_ERROR_MPS_CONNECTION_FAILED", "the MPS client could not reach the MPS server"),
    807: ("CUDA_ERROR_MPS_SERVER_NOT_READY", "the MPS server takes no new client yet"),
    999: ("CUDA_ERROR_UNKNOWN", "unknown error"),
    10001: ("HVGPU_ERROR_BAD_FRAME", "the frame is malformed"),
    10002: ("HVGPU_ERROR_UNKNOWN_OP", "the operation is not part of this protocol"),
    10003: ("HVGPU_ERROR_VERSION", "no protocol version in common"),
    10004: ("HVGPU_ERROR_OVERSIZE", "the frame exceeds the agent's limits"),
    10005: ("HVGPU_ERROR_HANDSHAKE", "the connection did not start with HELLO"),
    10006: ("HVGPU_ERROR_INTERNAL", "the executor failed unexpectedly"),
    10007: ("HVGPU_ERROR_NO_GPU", "the host agent cannot reach a GPU"),
    10008: ("HVGPU_ERROR_NO_SLICE", "no GPU slice is attached to this VM"),
    10009: ("HVGPU_ERROR_TOO_MANY_CONNECTIONS", "the VM has as many connections open as the "
                                                "host agent allows"),
}
STATUS_BY_NAME = {name: code for code, (name, _) in STATUSES.items()}

# Every status by its name (a test checks that each entry above has one here), so
# that no code spells a status as a bare number.
SUCCESS = CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_STUB_LIBRARY = 34
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_DEVICE_UNAVAILABLE = 46
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
CUDA_ERROR_UNSUPPORTED_LIMIT = 215
CUDA_ERROR_INVALID_PTX = 218
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224
CUDA_ERROR_INVALID_SOURCE = 300
CUDA_ERROR_FILE_NOT_FOUND = 301
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701
CUDA_ERROR_LAUNCH_TIMEOUT = 702
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713
CUDA_ERROR_HARDWARE_STACK_ERROR = 714
CUDA_ERROR_ILLEGAL_INSTRUCTION = 715
CUDA_ERROR_MISALIGNED_ADDRESS = 716
CUDA_ERROR_INVALID_ADDRESS_SPACE = 717
CUDA_ERROR_INVALID_PC = 718
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_MERGE = 902
CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903
CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904
CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906
CUDA_ERROR_CAPTURED_EVENT = 907
CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908
CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910
CUDA_ERROR_MPS_CONNECTION_FAILED = 805
CUDA_ERROR_MPS_SERVER_NOT_READY = 807
CUDA_ERROR_UNKNOWN = 999
HV_BAD_FRAME = HVGPU_ERROR_BAD_FRAME = 10001
HV_UNKNOWN_OP = HVGPU_ERROR_UNKNOWN_OP = 10002
HV_VERSION = HVGPU_ERROR_VERSION = 10003
HV_OVERSIZE = HVGPU_ERROR_OVERSIZE = 10004
HV_HANDSHAKE = HVGPU_ERROR_HANDSHAKE = 10005
HV_INTERNAL = HVGPU_ERROR_INTERNAL = 10006
HV_NO_GPU = HVGPU_ERROR_NO_GPU = 10007
HV_NO_SLICE = HVGPU_ERROR_NO_SLICE = 10008
HV_TOO_MANY_CONNECTIONS = HVGPU_ERROR_TOO_MANY_CONNECTIONS = 10009
HV_STATUS_BASE = 10000  # hvgpu's own statuses start here; CUDA's are below


# Kernel faults: after one, every CUDA call of the process fails (a sticky error),
# whatever its context; the executor is replaced for the VM's next programs.
STICKY_STATUSES = frozenset({
    CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUDA_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_PC, CUDA_ERROR_LAUNCH_FAILED})


def status_name(status: int) -> str:
    entry = STATUSES.get(status)
    return entry[0] if entry else f"CUDA_ERROR_{status}"


def op_name(code: int) -> str:
    op = OPS_BY_CODE.get(code)
    return op.name if op else f"op 0x{code:02x}"
