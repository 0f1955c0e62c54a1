/* hvgpu data lane, protocol v1: wire layout for C.
 *
 * Generated from hvgpu/virtio/protocol.py, region.py and tuning.py by
 * `python -m hvgpu.virtio.cgen`. Do not edit: change the Python tables and
 * regenerate.
 *
 * A frame is hvgpu_header_t, then body_len bytes of body, then payload_len
 * bytes of raw payload. A body is the op's fixed struct below (each str/bytes
 * field standing as its uint32_t length), followed by the variable fields'
 * bytes in field order. All integers are little-endian.
 */
#ifndef HVGPU_WIRE_H
#define HVGPU_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HVGPU_PROTOCOL_VERSION 1
#define HVGPU_PROTOCOL_MIN_VERSION 1
#define HVGPU_MAGIC 0x4748
#define HVGPU_DEFAULT_PORT 5170
#define HVGPU_HOST_CID 2
#define HVGPU_MAX_BODY 1048576u
#define HVGPU_MAX_PAYLOAD 1073741824ull
#define HVGPU_MAX_PROCESSES 64 /* rows of VGPU_PROCESSES */
#define HVGPU_MAX_PROCESS_NAME 64 /* characters of a process's name */
#define HVGPU_FLAG_ONEWAY 0x01
#define HVGPU_FLAG_REPLY 0x02
#define HVGPU_FLAG_PROGRESS 0x04
#define HVGPU_FLAG_OUTPUT 0x08

#define HVGPU_CAP_MONITOR 0x20ull
#define HVGPU_CAP_NVRTC 0x1ull
#define HVGPU_CAP_OUTPUT 0x40ull
#define HVGPU_CAP_PARAM_INFO 0x2ull
#define HVGPU_CAP_PROGRESS 0x4ull
#define HVGPU_CAP_REGION_DEVICE 0x10ull
#define HVGPU_CAP_REGION_MEMFD 0x8ull


typedef struct __attribute__((packed)) hvgpu_header {
    uint16_t magic;
    uint8_t version;
    uint8_t flags;
    uint16_t op;
    uint16_t reserved;
    uint32_t seq;
    int32_t status;
    uint32_t body_len;
    uint32_t reserved2;
    uint64_t payload_len;
} hvgpu_header_t;

#define HVGPU_HEADER_SIZE 32u
_Static_assert(sizeof(hvgpu_header_t) == HVGPU_HEADER_SIZE, "the frame header is 32 bytes");

enum hvgpu_op {
    HVGPU_OP_HELLO = 0x01,  /* First frame of every connection: version and capability handshake. */
    HVGPU_OP_PING = 0x02,  /* Round trip through the executor without touching CUDA. */
    HVGPU_OP_CTX_EVENT = 0x03,  /* cuCtxRecordEvent (wait 0) or cuCtxWaitEvent (wait 1) of the executor's context with an event of this connection: all the context's work so far, or all its later work waiting for the event. */
    HVGPU_OP_CTX_RESET_PERSISTING_L2 = 0x04,  /* cuCtxResetPersistingL2Cache. */
    HVGPU_OP_DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH = 0x05,  /* cuDeviceGetTexture1DLinearMaxWidth: elements, for CUarray_format's format. */
    HVGPU_OP_DEVICE_HOST_ATOMIC_CAPS = 0x06,  /* cuDeviceGetHostAtomicCapabilities: operations are CUatomicOperation numbers (u32 each, at most MAX_ATOMIC_OPERATIONS), caps one u32 of CUatomicOperationCapability bits for each. */
    HVGPU_OP_ARRAY_MEMORY_REQUIREMENTS = 0x07,  /* cuArrayGetMemoryRequirements (mipmapped 0: array is an array handle) or cuMipmappedArrayGetMemoryRequirements (1: a mipmapped array's) of this connection. */
    HVGPU_OP_TENSOR_MAP_ENCODE_IM2COL = 0x09,  /* cuTensorMapEncodeIm2col (wide 0: lower and upper are the pixel box's corners, i32 arrays of rank - 2) or cuTensorMapEncodeIm2colWide (wide 1: one i32 each, the corners' widths; mode its CUtensorMapIm2ColWideMode); dims and strides as TENSOR_MAP_ENCODE_TILED's. The reply is the 128-byte CUtensorMap. */
    HVGPU_OP_TENSOR_MAP_REPLACE_ADDRESS = 0x0a,  /* cuTensorMapReplaceAddress of a CUtensorMap (TENSOR_MAP_SIZE bytes) the guest holds: the map with its global address replaced. */
    HVGPU_OP_DRIVER_GET_VERSION = 0x10,
    HVGPU_OP_DEVICE_GET_COUNT = 0x11,
    HVGPU_OP_DEVICE_GET_ATTRIBUTE = 0x12,  /* cuDeviceGetAttribute; attrib is CUdevice_attribute's number. */
    HVGPU_OP_DEVICE_GET_NAME = 0x13,
    HVGPU_OP_DEVICE_GET_UUID = 0x14,
    HVGPU_OP_DEVICE_TOTAL_MEM = 0x15,
    HVGPU_OP_SLICE_INFO = 0x16,  /* The guest's slice: VM name, quota, in use, compute share in percent (0: none reserved). vm is empty when the connection has the whole GPU. */
    HVGPU_OP_DEVICE_GET_ATTRIBUTES = 0x17,  /* Attributes 1..count at once as i32 each (0 where the driver has none): the shim's cache, filled in one round trip. */
    HVGPU_OP_VGPU_PROCESSES = 0x18,  /* The processes of this VM that have a connection to this vGPU (not those that only look, CAP_MONITOR), one row per pid, at most MAX_PROCESSES: pids u32 each (as the VM numbers them, from their HELLO), used the bytes of the slice each holds (u64 each), names NUL-separated. Never another VM's. */
    HVGPU_OP_VGPU_UTILIZATION = 0x19,  /* The slice's GPU utilisation in percent over the driver's last sample period, where the host knows it (known 1); known 0: not measured here. */
    HVGPU_OP_CTX_SYNCHRONIZE = 0x20,
    HVGPU_OP_MEM_GET_INFO = 0x21,
    HVGPU_OP_CTX_GET_LIMIT = 0x28,  /* cuCtxGetLimit of the executor's context; limit is CUlimit's number. */
    HVGPU_OP_CTX_SET_LIMIT = 0xd0,  /* cuCtxSetLimit of the executor's context, charged what the driver's free memory fell by; replies what cuCtxGetLimit then says (the driver may round it). */
    HVGPU_OP_LINK = 0xd2,  /* options: (u32 CUjit_option, u32 reserved, u64 value) each, scalar options only (LINK_OPTION_SIZE bytes); inputs: (u32 CUjitInputType, u32 reserved, u64 size) each (LINK_INPUT_SIZE bytes), the payload their bytes in order; names NUL-separated, one per input. status is the link's CUresult, the logs what the linker said (at most MAX_LINK_LOG bytes each); image names the linked cubin of size bytes, until LINK_IMAGE fetches it. */
    HVGPU_OP_LINK_IMAGE = 0xd3,  /* The linked cubin (reply payload) of a LINK of this connection, given once. */
    HVGPU_OP_MODULE_FUNCTION_NAMES = 0xd4,  /* cuModuleEnumerateFunctions: the names of the module's functions in the driver's order, NUL-separated (each then found with MODULE_GET_FUNCTION); refused with CUDA_ERROR_INVALID_VALUE past MAX_FUNCTION_NAMES bytes. */
    HVGPU_OP_LAUNCH_COOPERATIVE = 0xd1,  /* cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_COOPERATIVE set (attrs as in LAUNCH_KERNEL_EX, the cooperative one included), answered: the driver's refusal of a grid larger than can be resident at once (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) comes back at the call. */
    HVGPU_OP_MEM_ALLOC = 0x22,  /* Returns the real device address in the executor's context. */
    HVGPU_OP_MEM_FREE = 0x23,
    HVGPU_OP_MEMCPY_HTOD = 0x24,  /* The payload is the source bytes; ordered on the stream (0: legacy default). */
    HVGPU_OP_MEMCPY_DTOH = 0x25,  /* Waits for the stream's earlier work; the reply payload is the bytes. */
    HVGPU_OP_MEMCPY_DTOD = 0x26,
    HVGPU_OP_MEMSET = 0x27,  /* cuMemsetD8/D16/D32Async by width (1, 2 or 4 bytes); count is in elements. */
    HVGPU_OP_MODULE_LOAD_DATA = 0x30,  /* The payload is a PTX (NUL-terminated), cubin or fatbin image. */
    HVGPU_OP_MODULE_COMPILE = 0x31,  /* NVRTC on the host; the payload is CUDA C++ source; options are NUL-separated. */
    HVGPU_OP_MODULE_COMPILE_HEADERS = 0x3e,  /* MODULE_COMPILE with headers the source includes by name: the payload is the source, then each header's text; sizes holds their byte counts (u64 each, the source's first); header_names and options are NUL-separated. */
    HVGPU_OP_MODULE_UNLOAD = 0x32,
    HVGPU_OP_MODULE_GET_FUNCTION = 0x33,
    HVGPU_OP_FUNC_GET_PARAM_INFO = 0x34,  /* layout: one (u32 offset, u32 size) pair per parameter, from cuFuncGetParamInfo. */
    HVGPU_OP_LAUNCH_KERNEL = 0x35,  /* params: the packed parameter buffer laid out by FUNC_GET_PARAM_INFO. */
    HVGPU_OP_MODULE_GET_GLOBAL = 0x36,  /* cuModuleGetGlobal: the variable's device range becomes copyable by this guest. */
    HVGPU_OP_FUNC_GET_ATTRIBUTE = 0x37,  /* cuFuncGetAttribute; attrib is CUfunction_attribute's number. */
    HVGPU_OP_FUNC_SET_ATTRIBUTE = 0x38,  /* cuFuncSetAttribute (e.g. the dynamic shared memory limit); sent as a call, it is answered. */
    HVGPU_OP_OCCUPANCY_MAX_BLOCKS = 0x39,  /* cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags. */
    HVGPU_OP_OCCUPANCY_AVAILABLE_SMEM = 0x3a,  /* cuOccupancyAvailableDynamicSMemPerBlock. */
    HVGPU_OP_LAUNCH_KERNEL_EX = 0x3b,  /* cuLaunchKernelEx: attrs is the CUlaunchAttribute array as CUDA lays it out (72 bytes each); attributes naming events are not sent. */
    HVGPU_OP_TENSOR_MAP_ENCODE_TILED = 0x3c,  /* cuTensorMapEncodeTiled on the host; dims/strides are u64 arrays, box and element_strides u32 arrays; the reply is the 128-byte CUtensorMap. */
    HVGPU_OP_OCCUPANCY_CLUSTERS = 0x3d,  /* which 0: cuOccupancyMaxActiveClusters, 1: cuOccupancyMaxPotentialClusterSize, for the launch configuration given (attrs as in LAUNCH_KERNEL_EX). */
    HVGPU_OP_FUNC_GET_ATTRIBUTES = 0x3f,  /* Attributes 0..count-1 (count <= 32) at once as i32 each: the shim's cache of the function, filled in one round trip; bit i of known is set where the driver answered attribute i (0 stands in the others). */
    HVGPU_OP_STREAM_CREATE = 0x40,
    HVGPU_OP_STREAM_DESTROY = 0x41,
    HVGPU_OP_STREAM_SYNCHRONIZE = 0x42,
    HVGPU_OP_STREAM_QUERY = 0x43,  /* Replies CUDA_ERROR_NOT_READY (600) while work is pending. */
    HVGPU_OP_STREAM_WAIT_EVENT = 0x44,
    HVGPU_OP_STREAM_CREATE_PRIORITY = 0x45,
    HVGPU_OP_STREAM_PRIORITY_RANGE = 0x46,  /* cuCtxGetStreamPriorityRange. */
    HVGPU_OP_STREAM_SET_ATTRIBUTE = 0x47,  /* cuStreamSetAttribute; an access policy window names memory of this guest. */
    HVGPU_OP_STREAM_GET_ATTRIBUTE = 0x48,  /* cuStreamGetAttribute: the value as cuda.h lays it out. */
    HVGPU_OP_STREAM_COPY_ATTRIBUTES = 0x49,  /* cuStreamCopyAttributes between two streams of this guest. */
    HVGPU_OP_EVENT_CREATE = 0x50,
    HVGPU_OP_EVENT_DESTROY = 0x51,
    HVGPU_OP_EVENT_RECORD = 0x52,
    HVGPU_OP_EVENT_QUERY = 0x53,  /* Replies CUDA_ERROR_NOT_READY (600) while the event is pending. */
    HVGPU_OP_EVENT_SYNCHRONIZE = 0x54,
    HVGPU_OP_EVENT_ELAPSED_TIME = 0x55,
    HVGPU_OP_GRAPH_ADD_MEM_ALLOC_NODE = 0x56,  /* cuGraphAddMemAllocNode of size bytes of device memory (location_type 1, location_id 0: this vGPU's), readable and writable by it alone; dptr is the allocation's address. */
    HVGPU_OP_GRAPH_ADD_MEM_FREE_NODE = 0x57,  /* cuGraphAddMemFreeNode of dptr, an address an allocation node of this connection's graphs returned. */
    HVGPU_OP_GRAPH_NODE_GET_TYPE = 0x58,  /* cuGraphNodeGetType: type is CUgraphNodeType's number; of an allocation node (10) its address and size, of a free node (11) the address it frees. */
    HVGPU_OP_DEVICE_GRAPH_MEM_TRIM = 0x59,  /* cuDeviceGraphMemTrim: the graph memory pool gives back what no allocation uses. */
    HVGPU_OP_DEVICE_GRAPH_MEM_ATTRIBUTE = 0x5a,  /* cuDeviceGetGraphMemAttribute (set 0) or cuDeviceSetGraphMemAttribute (set 1, only a high-water mark, only to 0); attr is CUgraphMem_attribute's number. */
    HVGPU_OP_MEM_ADDRESS_RESERVE = 0x60,  /* cuMemAddressReserve: addresses with no memory behind them. */
    HVGPU_OP_MEM_ADDRESS_FREE = 0x61,  /* cuMemAddressFree of a whole reservation with nothing mapped in it. */
    HVGPU_OP_MEM_CREATE = 0x62,  /* cuMemCreate, charged to the slice; alloc_flags: CUmemAllocationProp's allocFlags (compressionType, gpuDirectRDMACapable, usage) as its first four bytes. */
    HVGPU_OP_MEM_RELEASE = 0x63,  /* cuMemRelease: the memory goes once nothing maps it. */
    HVGPU_OP_MEM_MAP = 0x64,  /* cuMemMap inside a reservation of this guest. */
    HVGPU_OP_MEM_UNMAP = 0x65,  /* cuMemUnmap of whole mappings. */
    HVGPU_OP_MEM_SET_ACCESS = 0x66,  /* cuMemSetAccess; descs: CUmemAccessDesc array as CUDA lays it out (12 bytes each). Mapped memory becomes copyable by this guest once readable and writable. */
    HVGPU_OP_MEM_GET_ACCESS = 0x67,  /* cuMemGetAccess for this connection's device. */
    HVGPU_OP_MEM_GET_GRANULARITY = 0x68,  /* cuMemGetAllocationGranularity of device memory (option 0: minimum, 1: recommended). */
    HVGPU_OP_MEM_RETAIN_HANDLE = 0x69,  /* cuMemRetainAllocationHandle: the handle mapped at dptr, with one more reference. */
    HVGPU_OP_MEM_HANDLE_INFO = 0x6a,  /* The size of a handle of this guest (cuMemGetAllocationPropertiesFromHandle). */
    HVGPU_OP_MEM_GET_GRANULARITY_OF = 0x6b,  /* cuMemGetAllocationGranularity of device memory made with alloc_flags (as MEM_CREATE's: a compression type in its first byte). */
    HVGPU_OP_MEM_HANDLE_PROPS = 0x6c,  /* cuMemGetAllocationPropertiesFromHandle of a handle of this guest: its size and the allocation flags the driver made it with (compression it was granted). */
    HVGPU_OP_MEM_POOL_CREATE = 0x70,  /* cuMemPoolCreate of a device pool. */
    HVGPU_OP_MEM_POOL_DESTROY = 0x71,
    HVGPU_OP_MEM_POOL_DEFAULT = 0x72,  /* The connection's default pool (cuDeviceGetDefaultMemPool). */
    HVGPU_OP_MEM_ALLOC_ASYNC = 0x73,  /* cuMemAllocFromPoolAsync; the slice is charged what the pool holds. */
    HVGPU_OP_MEM_FREE_ASYNC = 0x74,  /* cuMemFreeAsync. */
    HVGPU_OP_MEM_POOL_SET_ATTRIBUTE = 0x75,  /* cuMemPoolSetAttribute; attrib is CUmemPool_attribute's number. */
    HVGPU_OP_MEM_POOL_GET_ATTRIBUTE = 0x76,
    HVGPU_OP_MEM_POOL_TRIM_TO = 0x77,  /* cuMemPoolTrimTo. */
    HVGPU_OP_REGION_ATTACH = 0x90,  /* kind 1 (memfd): the fd travels with this frame (SCM_RIGHTS), sealed against shrinking, size bytes long; kind 2 (device): the VM's ivshmem region, whose header the executor writes with the token and vGPU device number it replies (size 0: all of it). The region is registered with the driver (DMA) and counts against the VM's region limit. */
    HVGPU_OP_REGION_DETACH = 0x91,  /* Waits for the connection's work, then unregisters and unmaps the region. */
    HVGPU_OP_REGION_ALLOC = 0x92,  /* Room in a region (page-aligned) for this connection: its pinned host memory. */
    HVGPU_OP_REGION_FREE = 0x93,  /* Gives back an REGION_ALLOC after the connection's work on it is done. */
    HVGPU_OP_MEMCPY_HTOD_REGION = 0x94,  /* cuMemcpyHtoDAsync from the region: ordered on the stream, DMA. */
    HVGPU_OP_MEMCPY_DTOH_REGION = 0x95,  /* cuMemcpyDtoHAsync into the region: the bytes are there once a later synchronising op on the stream (or the context) has answered. */
    HVGPU_OP_FUNC_SET_CACHE_CONFIG = 0x80,  /* cuFuncSetCacheConfig; config is CUfunc_cache's number. */
    HVGPU_OP_STREAM_BEGIN_CAPTURE = 0xa0,  /* cuStreamBeginCapture; mode is CUstreamCaptureMode's number. Replies the capture's id and the handle of the graph it builds (the one END_CAPTURE gives). */
    HVGPU_OP_STREAM_END_CAPTURE = 0xa1,  /* cuStreamEndCapture: the graph's handle. A capture that failed replies its error (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, ...) and has ended all the same. Carried out even where an earlier one-way frame's error is owed (a later call reports it); a one-way frame of the capture that failed invalidated it. */
    HVGPU_OP_STREAM_CAPTURE_INFO = 0xa2,  /* cuStreamGetCaptureInfo: status is CUstreamCaptureStatus's number; while active, the graph's handle and, where nodes is 1, the node handles (u64 each) the stream's next captured work will depend on (each node named is given a handle for as long as its graph: nodes 0 where they are not wanted). */
    HVGPU_OP_GRAPH_INSTANTIATE = 0xa3,  /* cuGraphInstantiateWithFlags; flags are CUgraphInstantiate_flags. */
    HVGPU_OP_GRAPH_LAUNCH = 0xa4,  /* cuGraphLaunch. */
    HVGPU_OP_GRAPH_UPLOAD = 0xa5,  /* cuGraphUpload. */
    HVGPU_OP_GRAPH_DESTROY = 0xa6,  /* cuGraphDestroy. */
    HVGPU_OP_GRAPH_EXEC_DESTROY = 0xa7,  /* cuGraphExecDestroy. */
    HVGPU_OP_GRAPH_GET_NODES = 0xa8,  /* cuGraphGetNodes: how many nodes the graph has, and the handles (u64 each) of the first max of them. */
    HVGPU_OP_GRAPH_CREATE = 0xa9,  /* cuGraphCreate. */
    HVGPU_OP_GRAPH_ADD_KERNEL_NODE = 0xaa,  /* cuGraphAddKernelNode; params is the packed parameter buffer, as for a launch. */
    HVGPU_OP_GRAPH_ADD_MEMSET_NODE = 0xab,  /* cuGraphAddMemsetNode: height rows of width elements (1, 2 or 4 bytes), pitch bytes apart. */
    HVGPU_OP_GRAPH_ADD_MEMCPY_NODE = 0xac,  /* cuGraphAddMemcpyNode of size bytes; kind 0: device to device; 1: from the region (src is an offset in it) to the device; 2: from the device to the region (dst is an offset). */
    HVGPU_OP_GRAPH_ADD_EMPTY_NODE = 0xad,  /* cuGraphAddEmptyNode. */
    HVGPU_OP_GRAPH_ADD_EVENT_NODE = 0xae,  /* cuGraphAddEventRecordNode (wait 0) or cuGraphAddEventWaitNode (wait 1). */
    HVGPU_OP_GRAPH_ADD_DEPENDENCIES = 0xaf,  /* cuGraphAddDependencies: edges from_nodes[i] -> to_nodes[i]. */
    HVGPU_OP_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS = 0xb0,  /* cuGraphExecKernelNodeSetParams: the kernel node's parameters in an instantiated graph (node is a node of the graph it was made from). */
    HVGPU_OP_GRAPH_EXEC_UPDATE = 0xb1,  /* cuGraphExecUpdate: result is CUgraphExecUpdateResult's number; the call fails (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) where the graph's shape differs. */
    HVGPU_OP_GRAPH_CLONE = 0xb2,  /* cuGraphClone: a new graph of this connection, a copy of graph. */
    HVGPU_OP_GRAPH_NODE_FIND_IN_CLONE = 0xb3,  /* cuGraphNodeFindInClone: the node of clone that is the copy of node, a node of the graph clone was made from. */
    HVGPU_OP_GRAPH_CONDITIONAL_HANDLE_CREATE = 0xb4,  /* cuGraphConditionalHandleCreate: handle is the driver's CUgraphConditionalHandle value (a kernel sets it, given it as a parameter); flags are CU_GRAPH_COND_ASSIGN_DEFAULT or 0. */
    HVGPU_OP_GRAPH_ADD_CONDITIONAL_NODE = 0xb5,  /* cuGraphAddNode of a conditional node: type is CUgraphConditionalNodeType's number (0 IF, 1 WHILE, 2 SWITCH), size how many body graphs (at most MAX_CONDITIONAL_BODIES), handle one GRAPH_CONDITIONAL_HANDLE_CREATE made for this graph or one it is the body of. bodies: the handles (u64 each) of the node's body graphs, the driver's and the node's own: nodes are added to them, and they go with the node's graph. */
    HVGPU_OP_ARRAY_CREATE = 0xc0,  /* cuArray3DCreate (cuArrayCreate: depth 0, flags 0), charged what it took. */
    HVGPU_OP_ARRAY_DESTROY = 0xc1,  /* cuArrayDestroy. */
    HVGPU_OP_ARRAY_GET_DESCRIPTOR = 0xc2,  /* cuArray3DGetDescriptor of an array of this connection (a mipmap level too). */
    HVGPU_OP_MIPMAPPED_ARRAY_CREATE = 0xc3,  /* cuMipmappedArrayCreate, charged what it took. */
    HVGPU_OP_MIPMAPPED_ARRAY_DESTROY = 0xc4,  /* cuMipmappedArrayDestroy: its levels' handles go with it. */
    HVGPU_OP_MIPMAPPED_ARRAY_GET_LEVEL = 0xc5,  /* cuMipmappedArrayGetLevel: an array handle, not destroyable on its own. */
    HVGPU_OP_TEX_OBJECT_CREATE = 0xc6,  /* cuTexObjectCreate. res_type is CUresourcetype's number: 0 array, 1 mipmapped array (resource: its handle), 2 linear (resource: a device address, width its size in bytes), 3 pitch2D (resource: a device address, width in elements); tex_desc is CUDA_TEXTURE_DESC as cuda.h lays it out (TEX_DESC_SIZE bytes), view_desc CUDA_RESOURCE_VIEW_DESC (VIEW_DESC_SIZE bytes) or empty. object is the driver's CUtexObject value. */
    HVGPU_OP_TEX_OBJECT_DESTROY = 0xc7,  /* cuTexObjectDestroy. */
    HVGPU_OP_SURF_OBJECT_CREATE = 0xc8,  /* cuSurfObjectCreate of an array of this connection (made with CUDA_ARRAY3D_SURFACE_LDST); object is the driver's CUsurfObject value. */
    HVGPU_OP_SURF_OBJECT_DESTROY = 0xc9,  /* cuSurfObjectDestroy. */
    HVGPU_OP_MEMCPY_3D = 0xca,  /* cuMemcpy3DAsync between device memory and arrays of this connection: depth slices of height rows of width bytes. */
    HVGPU_OP_MEMCPY_3D_TO = 0xcb,  /* cuMemcpy3DAsync from the guest's memory: the payload is the rows, width bytes each, packed (width * height * depth bytes, at most MAX_COPY_3D). */
    HVGPU_OP_MEMCPY_3D_FROM = 0xcc,  /* cuMemcpy3DAsync to the guest's memory, after the stream's earlier work: the reply payload is the rows, width bytes each, packed (at most MAX_COPY_3D). */
    HVGPU_OP_IPC_GET_MEM_HANDLE = 0xe0,  /* cuIpcGetMemHandle of the cuMemAlloc allocation dptr lies in: its token, the same each time while the allocation lives. */
    HVGPU_OP_IPC_OPEN_MEM_HANDLE = 0xe1,  /* cuIpcOpenMemHandle: the allocation's base and size, copyable by this connection until it closes it as often as it opened it; refused (CUDA_ERROR_INVALID_CONTEXT) in the connection that exported it. */
    HVGPU_OP_IPC_CLOSE_MEM_HANDLE = 0xe2,  /* cuIpcCloseMemHandle of a base this connection opened: left is how many opens of it are still held (0: no longer copyable by this connection). */
    HVGPU_OP_IPC_GET_EVENT_HANDLE = 0xe3,  /* cuIpcGetEventHandle of an event made with CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING. */
    HVGPU_OP_IPC_OPEN_EVENT_HANDLE = 0xe4,  /* cuIpcOpenEventHandle: a handle of this connection for the exported event (EVENT_DESTROY lets it go). */
    HVGPU_OP_MEM_EXPORT = 0xe5,  /* cuMemExportToShareableHandle of memory made exportable as a POSIX file descriptor (handle_type 1): the token (IPC_HANDLE_SIZE bytes) the guest library puts in the descriptor it gives the program. */
    HVGPU_OP_MEM_IMPORT = 0xe6,  /* cuMemImportFromShareableHandle: a handle of this connection for the memory a MEM_EXPORT token names (any connection of the VM's vGPU, this one too). */
    HVGPU_OP_HOST_MAP = 0xf0,  /* Maps pinned memory of this connection (a memfd region whole: offset 0, its size; or a room of the VM's region: its offset and the size REGION_ALLOC took) a second time in the executor, at addr, the address the guest maps it at (page-aligned, in user space, where nothing is mapped), and registers it with the driver device-mapped: dptr is its device address, addr itself. Unmapped when the room is freed or the region detached. CUDA_ERROR_NOT_SUPPORTED where it cannot be mapped there. */
    HVGPU_OP_STREAM_MEMOP = 0xf1,  /* cuStreamBatchMemOp (call 0, _v2; 1: the deprecated v1) or one cuStreamWaitValue32/64 or cuStreamWriteValue32/64 (call 2: _v2; 3: v1; ops holds one): ops is count records of MEMOP_SIZE bytes (u32 operation, u32 flags, u64 address, u64 value), CUstreamBatchMemOpType's operations, at most MAX_MEMOPS; every address lies in device memory of this connection or in its device-mapped pinned memory (HOST_MAP). */
    HVGPU_OP_MEM_POOL_EXPORT = 0xe7,  /* cuMemPoolExportToShareableHandle of a pool made exportable as a POSIX file descriptor (handle_type 1): its token, the same each time while the pool lives. */
    HVGPU_OP_MEM_POOL_IMPORT = 0xe8,  /* cuMemPoolImportFromShareableHandle: a pool handle of this connection for the pool a MEM_POOL_EXPORT token names; nothing is allocated from it. */
    HVGPU_OP_MEM_POOL_EXPORT_POINTER = 0xe9,  /* cuMemPoolExportPointer of an allocation (its base) from an exportable pool of this connection: the token CUmemPoolPtrExportData carries (IPC_HANDLE_SIZE bytes), withdrawn when the allocation is freed. */
    HVGPU_OP_MEM_POOL_IMPORT_POINTER = 0xea,  /* cuMemPoolImportPointer into a pool this connection imported: the allocation's base and size, copyable by this connection until it frees it (MEM_FREE_ASYNC). */
};

/* 1 when the op is one-way (pipelined, never answered). */
static inline int hvgpu_op_is_oneway(uint16_t op) {
    switch (op) {
    case HVGPU_OP_MEMCPY_HTOD:
    case HVGPU_OP_MEMCPY_DTOD:
    case HVGPU_OP_MEMSET:
    case HVGPU_OP_LAUNCH_KERNEL:
    case HVGPU_OP_FUNC_SET_ATTRIBUTE:
    case HVGPU_OP_LAUNCH_KERNEL_EX:
    case HVGPU_OP_STREAM_WAIT_EVENT:
    case HVGPU_OP_EVENT_RECORD:
    case HVGPU_OP_MEM_FREE_ASYNC:
    case HVGPU_OP_MEMCPY_HTOD_REGION:
    case HVGPU_OP_MEMCPY_DTOH_REGION:
    case HVGPU_OP_FUNC_SET_CACHE_CONFIG:
    case HVGPU_OP_GRAPH_LAUNCH:
    case HVGPU_OP_GRAPH_UPLOAD:
    case HVGPU_OP_MEMCPY_3D:
    case HVGPU_OP_MEMCPY_3D_TO:
    case HVGPU_OP_STREAM_MEMOP:
        return 1;
    default:
        return 0;
    }
}

/* The op's name in the protocol table; NULL for codes it does not have. */
static inline const char *hvgpu_op_name(uint16_t op) {
    switch (op) {
    case HVGPU_OP_HELLO: return "HELLO";
    case HVGPU_OP_PING: return "PING";
    case HVGPU_OP_CTX_EVENT: return "CTX_EVENT";
    case HVGPU_OP_CTX_RESET_PERSISTING_L2: return "CTX_RESET_PERSISTING_L2";
    case HVGPU_OP_DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH: return "DEVICE_TEXTURE_1D_LINEAR_MAX_WIDTH";
    case HVGPU_OP_DEVICE_HOST_ATOMIC_CAPS: return "DEVICE_HOST_ATOMIC_CAPS";
    case HVGPU_OP_ARRAY_MEMORY_REQUIREMENTS: return "ARRAY_MEMORY_REQUIREMENTS";
    case HVGPU_OP_TENSOR_MAP_ENCODE_IM2COL: return "TENSOR_MAP_ENCODE_IM2COL";
    case HVGPU_OP_TENSOR_MAP_REPLACE_ADDRESS: return "TENSOR_MAP_REPLACE_ADDRESS";
    case HVGPU_OP_DRIVER_GET_VERSION: return "DRIVER_GET_VERSION";
    case HVGPU_OP_DEVICE_GET_COUNT: return "DEVICE_GET_COUNT";
    case HVGPU_OP_DEVICE_GET_ATTRIBUTE: return "DEVICE_GET_ATTRIBUTE";
    case HVGPU_OP_DEVICE_GET_NAME: return "DEVICE_GET_NAME";
    case HVGPU_OP_DEVICE_GET_UUID: return "DEVICE_GET_UUID";
    case HVGPU_OP_DEVICE_TOTAL_MEM: return "DEVICE_TOTAL_MEM";
    case HVGPU_OP_SLICE_INFO: return "SLICE_INFO";
    case HVGPU_OP_DEVICE_GET_ATTRIBUTES: return "DEVICE_GET_ATTRIBUTES";
    case HVGPU_OP_VGPU_PROCESSES: return "VGPU_PROCESSES";
    case HVGPU_OP_VGPU_UTILIZATION: return "VGPU_UTILIZATION";
    case HVGPU_OP_CTX_SYNCHRONIZE: return "CTX_SYNCHRONIZE";
    case HVGPU_OP_MEM_GET_INFO: return "MEM_GET_INFO";
    case HVGPU_OP_CTX_GET_LIMIT: return "CTX_GET_LIMIT";
    case HVGPU_OP_CTX_SET_LIMIT: return "CTX_SET_LIMIT";
    case HVGPU_OP_LINK: return "LINK";
    case HVGPU_OP_LINK_IMAGE: return "LINK_IMAGE";
    case HVGPU_OP_MODULE_FUNCTION_NAMES: return "MODULE_FUNCTION_NAMES";
    case HVGPU_OP_LAUNCH_COOPERATIVE: return "LAUNCH_COOPERATIVE";
    case HVGPU_OP_MEM_ALLOC: return "MEM_ALLOC";
    case HVGPU_OP_MEM_FREE: return "MEM_FREE";
    case HVGPU_OP_MEMCPY_HTOD: return "MEMCPY_HTOD";
    case HVGPU_OP_MEMCPY_DTOH: return "MEMCPY_DTOH";
    case HVGPU_OP_MEMCPY_DTOD: return "MEMCPY_DTOD";
    case HVGPU_OP_MEMSET: return "MEMSET";
    case HVGPU_OP_MODULE_LOAD_DATA: return "MODULE_LOAD_DATA";
    case HVGPU_OP_MODULE_COMPILE: return "MODULE_COMPILE";
    case HVGPU_OP_MODULE_COMPILE_HEADERS: return "MODULE_COMPILE_HEADERS";
    case HVGPU_OP_MODULE_UNLOAD: return "MODULE_UNLOAD";
    case HVGPU_OP_MODULE_GET_FUNCTION: return "MODULE_GET_FUNCTION";
    case HVGPU_OP_FUNC_GET_PARAM_INFO: return "FUNC_GET_PARAM_INFO";
    case HVGPU_OP_LAUNCH_KERNEL: return "LAUNCH_KERNEL";
    case HVGPU_OP_MODULE_GET_GLOBAL: return "MODULE_GET_GLOBAL";
    case HVGPU_OP_FUNC_GET_ATTRIBUTE: return "FUNC_GET_ATTRIBUTE";
    case HVGPU_OP_FUNC_SET_ATTRIBUTE: return "FUNC_SET_ATTRIBUTE";
    case HVGPU_OP_OCCUPANCY_MAX_BLOCKS: return "OCCUPANCY_MAX_BLOCKS";
    case HVGPU_OP_OCCUPANCY_AVAILABLE_SMEM: return "OCCUPANCY_AVAILABLE_SMEM";
    case HVGPU_OP_LAUNCH_KERNEL_EX: return "LAUNCH_KERNEL_EX";
    case HVGPU_OP_TENSOR_MAP_ENCODE_TILED: return "TENSOR_MAP_ENCODE_TILED";
    case HVGPU_OP_OCCUPANCY_CLUSTERS: return "OCCUPANCY_CLUSTERS";
    case HVGPU_OP_FUNC_GET_ATTRIBUTES: return "FUNC_GET_ATTRIBUTES";
    case HVGPU_OP_STREAM_CREATE: return "STREAM_CREATE";
    case HVGPU_OP_STREAM_DESTROY: return "STREAM_DESTROY";
    case HVGPU_OP_STREAM_SYNCHRONIZE: return "STREAM_SYNCHRONIZE";
    case HVGPU_OP_STREAM_QUERY: return "STREAM_QUERY";
    case HVGPU_OP_STREAM_WAIT_EVENT: return "STREAM_WAIT_EVENT";
    case HVGPU_OP_STREAM_CREATE_PRIORITY: return "STREAM_CREATE_PRIORITY";
    case HVGPU_OP_STREAM_PRIORITY_RANGE: return "STREAM_PRIORITY_RANGE";
    case HVGPU_OP_STREAM_SET_ATTRIBUTE: return "STREAM_SET_ATTRIBUTE";
    case HVGPU_OP_STREAM_GET_ATTRIBUTE: return "STREAM_GET_ATTRIBUTE";
    case HVGPU_OP_STREAM_COPY_ATTRIBUTES: return "STREAM_COPY_ATTRIBUTES";
    case HVGPU_OP_EVENT_CREATE: return "EVENT_CREATE";
    case HVGPU_OP_EVENT_DESTROY: return "EVENT_DESTROY";
    case HVGPU_OP_EVENT_RECORD: return "EVENT_RECORD";
    case HVGPU_OP_EVENT_QUERY: return "EVENT_QUERY";
    case HVGPU_OP_EVENT_SYNCHRONIZE: return "EVENT_SYNCHRONIZE";
    case HVGPU_OP_EVENT_ELAPSED_TIME: return "EVENT_ELAPSED_TIME";
    case HVGPU_OP_GRAPH_ADD_MEM_ALLOC_NODE: return "GRAPH_ADD_MEM_ALLOC_NODE";
    case HVGPU_OP_GRAPH_ADD_MEM_FREE_NODE: return "GRAPH_ADD_MEM_FREE_NODE";
    case HVGPU_OP_GRAPH_NODE_GET_TYPE: return "GRAPH_NODE_GET_TYPE";
    case HVGPU_OP_DEVICE_GRAPH_MEM_TRIM: return "DEVICE_GRAPH_MEM_TRIM";
    case HVGPU_OP_DEVICE_GRAPH_MEM_ATTRIBUTE: return "DEVICE_GRAPH_MEM_ATTRIBUTE";
    case HVGPU_OP_MEM_ADDRESS_RESERVE: return "MEM_ADDRESS_RESERVE";
    case HVGPU_OP_MEM_ADDRESS_FREE: return "MEM_ADDRESS_FREE";
    case HVGPU_OP_MEM_CREATE: return "MEM_CREATE";
    case HVGPU_OP_MEM_RELEASE: return "MEM_RELEASE";
    case HVGPU_OP_MEM_MAP: return "MEM_MAP";
    case HVGPU_OP_MEM_UNMAP: return "MEM_UNMAP";
    case HVGPU_OP_MEM_SET_ACCESS: return "MEM_SET_ACCESS";
    case HVGPU_OP_MEM_GET_ACCESS: return "MEM_GET_ACCESS";
    case HVGPU_OP_MEM_GET_GRANULARITY: return "MEM_GET_GRANULARITY";
    case HVGPU_OP_MEM_RETAIN_HANDLE: return "MEM_RETAIN_HANDLE";
    case HVGPU_OP_MEM_HANDLE_INFO: return "MEM_HANDLE_INFO";
    case HVGPU_OP_MEM_GET_GRANULARITY_OF: return "MEM_GET_GRANULARITY_OF";
    case HVGPU_OP_MEM_HANDLE_PROPS: return "MEM_HANDLE_PROPS";
    case HVGPU_OP_MEM_POOL_CREATE: return "MEM_POOL_CREATE";
    case HVGPU_OP_MEM_POOL_DESTROY: return "MEM_POOL_DESTROY";
    case HVGPU_OP_MEM_POOL_DEFAULT: return "MEM_POOL_DEFAULT";
    case HVGPU_OP_MEM_ALLOC_ASYNC: return "MEM_ALLOC_ASYNC";
    case HVGPU_OP_MEM_FREE_ASYNC: return "MEM_FREE_ASYNC";
    case HVGPU_OP_MEM_POOL_SET_ATTRIBUTE: return "MEM_POOL_SET_ATTRIBUTE";
    case HVGPU_OP_MEM_POOL_GET_ATTRIBUTE: return "MEM_POOL_GET_ATTRIBUTE";
    case HVGPU_OP_MEM_POOL_TRIM_TO: return "MEM_POOL_TRIM_TO";
    case HVGPU_OP_REGION_ATTACH: return "REGION_ATTACH";
    case HVGPU_OP_REGION_DETACH: return "REGION_DETACH";
    case HVGPU_OP_REGION_ALLOC: return "REGION_ALLOC";
    case HVGPU_OP_REGION_FREE: return "REGION_FREE";
    case HVGPU_OP_MEMCPY_HTOD_REGION: return "MEMCPY_HTOD_REGION";
    case HVGPU_OP_MEMCPY_DTOH_REGION: return "MEMCPY_DTOH_REGION";
    case HVGPU_OP_FUNC_SET_CACHE_CONFIG: return "FUNC_SET_CACHE_CONFIG";
    case HVGPU_OP_STREAM_BEGIN_CAPTURE: return "STREAM_BEGIN_CAPTURE";
    case HVGPU_OP_STREAM_END_CAPTURE: return "STREAM_END_CAPTURE";
    case HVGPU_OP_STREAM_CAPTURE_INFO: return "STREAM_CAPTURE_INFO";
    case HVGPU_OP_GRAPH_INSTANTIATE: return "GRAPH_INSTANTIATE";
    case HVGPU_OP_GRAPH_LAUNCH: return "GRAPH_LAUNCH";
    case HVGPU_OP_GRAPH_UPLOAD: return "GRAPH_UPLOAD";
    case HVGPU_OP_GRAPH_DESTROY: return "GRAPH_DESTROY";
    case HVGPU_OP_GRAPH_EXEC_DESTROY: return "GRAPH_EXEC_DESTROY";
    case HVGPU_OP_GRAPH_GET_NODES: return "GRAPH_GET_NODES";
    case HVGPU_OP_GRAPH_CREATE: return "GRAPH_CREATE";
    case HVGPU_OP_GRAPH_ADD_KERNEL_NODE: return "GRAPH_ADD_KERNEL_NODE";
    case HVGPU_OP_GRAPH_ADD_MEMSET_NODE: return "GRAPH_ADD_MEMSET_NODE";
    case HVGPU_OP_GRAPH_ADD_MEMCPY_NODE: return "GRAPH_ADD_MEMCPY_NODE";
    case HVGPU_OP_GRAPH_ADD_EMPTY_NODE: return "GRAPH_ADD_EMPTY_NODE";
    case HVGPU_OP_GRAPH_ADD_EVENT_NODE: return "GRAPH_ADD_EVENT_NODE";
    case HVGPU_OP_GRAPH_ADD_DEPENDENCIES: return "GRAPH_ADD_DEPENDENCIES";
    case HVGPU_OP_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS: return "GRAPH_EXEC_KERNEL_NODE_SET_PARAMS";
    case HVGPU_OP_GRAPH_EXEC_UPDATE: return "GRAPH_EXEC_UPDATE";
    case HVGPU_OP_GRAPH_CLONE: return "GRAPH_CLONE";
    case HVGPU_OP_GRAPH_NODE_FIND_IN_CLONE: return "GRAPH_NODE_FIND_IN_CLONE";
    case HVGPU_OP_GRAPH_CONDITIONAL_HANDLE_CREATE: return "GRAPH_CONDITIONAL_HANDLE_CREATE";
    case HVGPU_OP_GRAPH_ADD_CONDITIONAL_NODE: return "GRAPH_ADD_CONDITIONAL_NODE";
    case HVGPU_OP_ARRAY_CREATE: return "ARRAY_CREATE";
    case HVGPU_OP_ARRAY_DESTROY: return "ARRAY_DESTROY";
    case HVGPU_OP_ARRAY_GET_DESCRIPTOR: return "ARRAY_GET_DESCRIPTOR";
    case HVGPU_OP_MIPMAPPED_ARRAY_CREATE: return "MIPMAPPED_ARRAY_CREATE";
    case HVGPU_OP_MIPMAPPED_ARRAY_DESTROY: return "MIPMAPPED_ARRAY_DESTROY";
    case HVGPU_OP_MIPMAPPED_ARRAY_GET_LEVEL: return "MIPMAPPED_ARRAY_GET_LEVEL";
    case HVGPU_OP_TEX_OBJECT_CREATE: return "TEX_OBJECT_CREATE";
    case HVGPU_OP_TEX_OBJECT_DESTROY: return "TEX_OBJECT_DESTROY";
    case HVGPU_OP_SURF_OBJECT_CREATE: return "SURF_OBJECT_CREATE";
    case HVGPU_OP_SURF_OBJECT_DESTROY: return "SURF_OBJECT_DESTROY";
    case HVGPU_OP_MEMCPY_3D: return "MEMCPY_3D";
    case HVGPU_OP_MEMCPY_3D_TO: return "MEMCPY_3D_TO";
    case HVGPU_OP_MEMCPY_3D_FROM: return "MEMCPY_3D_FROM";
    case HVGPU_OP_IPC_GET_MEM_HANDLE: return "IPC_GET_MEM_HANDLE";
    case HVGPU_OP_IPC_OPEN_MEM_HANDLE: return "IPC_OPEN_MEM_HANDLE";
    case HVGPU_OP_IPC_CLOSE_MEM_HANDLE: return "IPC_CLOSE_MEM_HANDLE";
    case HVGPU_OP_IPC_GET_EVENT_HANDLE: return "IPC_GET_EVENT_HANDLE";
    case HVGPU_OP_IPC_OPEN_EVENT_HANDLE: return "IPC_OPEN_EVENT_HANDLE";
    case HVGPU_OP_MEM_EXPORT: return "MEM_EXPORT";
    case HVGPU_OP_MEM_IMPORT: return "MEM_IMPORT";
    case HVGPU_OP_HOST_MAP: return "HOST_MAP";
    case HVGPU_OP_STREAM_MEMOP: return "STREAM_MEMOP";
    case HVGPU_OP_MEM_POOL_EXPORT: return "MEM_POOL_EXPORT";
    case HVGPU_OP_MEM_POOL_IMPORT: return "MEM_POOL_IMPORT";
    case HVGPU_OP_MEM_POOL_EXPORT_POINTER: return "MEM_POOL_EXPORT_POINTER";
    case HVGPU_OP_MEM_POOL_IMPORT_POINTER: return "MEM_POOL_IMPORT_POINTER";
    default:
        return 0;
    }
}

typedef struct __attribute__((packed)) hvgpu_hello_req {
    uint32_t version;
    uint32_t min_version;
    uint64_t caps;
    uint32_t client_len;
} hvgpu_hello_req_t;
_Static_assert(sizeof(hvgpu_hello_req_t) == 20, "hvgpu_hello_req_t");

typedef struct __attribute__((packed)) hvgpu_hello_rep {
    uint32_t version;
    uint32_t reserved;
    uint64_t caps;
    uint64_t max_payload;
    uint32_t max_body;
    uint32_t peer_len;
    uint32_t agent_len;
} hvgpu_hello_rep_t;
_Static_assert(sizeof(hvgpu_hello_rep_t) == 36, "hvgpu_hello_rep_t");

typedef struct __attribute__((packed)) hvgpu_ctx_event_req {
    uint64_t event;
    uint32_t wait;
} hvgpu_ctx_event_req_t;
_Static_assert(sizeof(hvgpu_ctx_event_req_t) == 12, "hvgpu_ctx_event_req_t");

typedef struct __attribute__((packed)) hvgpu_device_texture_1d_linear_max_width_req {
    uint32_t format;
    uint32_t channels;
} hvgpu_device_texture_1d_linear_max_width_req_t;
_Static_assert(sizeof(hvgpu_device_texture_1d_linear_max_width_req_t) == 8, "hvgpu_device_texture_1d_linear_max_width_req_t");

typedef struct __attribute__((packed)) hvgpu_device_texture_1d_linear_max_width_rep {
    uint64_t width;
} hvgpu_device_texture_1d_linear_max_width_rep_t;
_Static_assert(sizeof(hvgpu_device_texture_1d_linear_max_width_rep_t) == 8, "hvgpu_device_texture_1d_linear_max_width_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_host_atomic_caps_req {
    uint32_t operations_len;
} hvgpu_device_host_atomic_caps_req_t;
_Static_assert(sizeof(hvgpu_device_host_atomic_caps_req_t) == 4, "hvgpu_device_host_atomic_caps_req_t");

typedef struct __attribute__((packed)) hvgpu_device_host_atomic_caps_rep {
    uint32_t caps_len;
} hvgpu_device_host_atomic_caps_rep_t;
_Static_assert(sizeof(hvgpu_device_host_atomic_caps_rep_t) == 4, "hvgpu_device_host_atomic_caps_rep_t");

typedef struct __attribute__((packed)) hvgpu_array_memory_requirements_req {
    uint64_t array;
    uint32_t mipmapped;
} hvgpu_array_memory_requirements_req_t;
_Static_assert(sizeof(hvgpu_array_memory_requirements_req_t) == 12, "hvgpu_array_memory_requirements_req_t");

typedef struct __attribute__((packed)) hvgpu_array_memory_requirements_rep {
    uint64_t size;
    uint64_t alignment;
} hvgpu_array_memory_requirements_rep_t;
_Static_assert(sizeof(hvgpu_array_memory_requirements_rep_t) == 16, "hvgpu_array_memory_requirements_rep_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_encode_im2col_req {
    uint32_t dtype;
    uint32_t rank;
    uint64_t address;
    uint32_t dims_len;
    uint32_t strides_len;
    uint32_t lower_len;
    uint32_t upper_len;
    uint32_t channels;
    uint32_t pixels;
    uint32_t element_strides_len;
    uint32_t interleave;
    uint32_t swizzle;
    uint32_t l2_promotion;
    uint32_t oob_fill;
    uint32_t wide;
    uint32_t mode;
} hvgpu_tensor_map_encode_im2col_req_t;
_Static_assert(sizeof(hvgpu_tensor_map_encode_im2col_req_t) == 68, "hvgpu_tensor_map_encode_im2col_req_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_encode_im2col_rep {
    uint32_t map_len;
} hvgpu_tensor_map_encode_im2col_rep_t;
_Static_assert(sizeof(hvgpu_tensor_map_encode_im2col_rep_t) == 4, "hvgpu_tensor_map_encode_im2col_rep_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_replace_address_req {
    uint32_t map_len;
    uint64_t address;
} hvgpu_tensor_map_replace_address_req_t;
_Static_assert(sizeof(hvgpu_tensor_map_replace_address_req_t) == 12, "hvgpu_tensor_map_replace_address_req_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_replace_address_rep {
    uint32_t map_len;
} hvgpu_tensor_map_replace_address_rep_t;
_Static_assert(sizeof(hvgpu_tensor_map_replace_address_rep_t) == 4, "hvgpu_tensor_map_replace_address_rep_t");

typedef struct __attribute__((packed)) hvgpu_driver_get_version_rep {
    int32_t version;
} hvgpu_driver_get_version_rep_t;
_Static_assert(sizeof(hvgpu_driver_get_version_rep_t) == 4, "hvgpu_driver_get_version_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_get_count_rep {
    int32_t count;
} hvgpu_device_get_count_rep_t;
_Static_assert(sizeof(hvgpu_device_get_count_rep_t) == 4, "hvgpu_device_get_count_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_get_attribute_req {
    int32_t attrib;
    int32_t device;
} hvgpu_device_get_attribute_req_t;
_Static_assert(sizeof(hvgpu_device_get_attribute_req_t) == 8, "hvgpu_device_get_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_device_get_attribute_rep {
    int32_t value;
} hvgpu_device_get_attribute_rep_t;
_Static_assert(sizeof(hvgpu_device_get_attribute_rep_t) == 4, "hvgpu_device_get_attribute_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_get_name_req {
    int32_t device;
} hvgpu_device_get_name_req_t;
_Static_assert(sizeof(hvgpu_device_get_name_req_t) == 4, "hvgpu_device_get_name_req_t");

typedef struct __attribute__((packed)) hvgpu_device_get_name_rep {
    uint32_t name_len;
} hvgpu_device_get_name_rep_t;
_Static_assert(sizeof(hvgpu_device_get_name_rep_t) == 4, "hvgpu_device_get_name_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_get_uuid_req {
    int32_t device;
} hvgpu_device_get_uuid_req_t;
_Static_assert(sizeof(hvgpu_device_get_uuid_req_t) == 4, "hvgpu_device_get_uuid_req_t");

typedef struct __attribute__((packed)) hvgpu_device_get_uuid_rep {
    uint32_t uuid_len;
} hvgpu_device_get_uuid_rep_t;
_Static_assert(sizeof(hvgpu_device_get_uuid_rep_t) == 4, "hvgpu_device_get_uuid_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_total_mem_req {
    int32_t device;
} hvgpu_device_total_mem_req_t;
_Static_assert(sizeof(hvgpu_device_total_mem_req_t) == 4, "hvgpu_device_total_mem_req_t");

typedef struct __attribute__((packed)) hvgpu_device_total_mem_rep {
    uint64_t bytes;
} hvgpu_device_total_mem_rep_t;
_Static_assert(sizeof(hvgpu_device_total_mem_rep_t) == 8, "hvgpu_device_total_mem_rep_t");

typedef struct __attribute__((packed)) hvgpu_slice_info_rep {
    uint32_t vm_len;
    uint64_t mem;
    uint64_t mem_used;
    uint32_t compute;
} hvgpu_slice_info_rep_t;
_Static_assert(sizeof(hvgpu_slice_info_rep_t) == 24, "hvgpu_slice_info_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_get_attributes_req {
    int32_t device;
    uint32_t count;
} hvgpu_device_get_attributes_req_t;
_Static_assert(sizeof(hvgpu_device_get_attributes_req_t) == 8, "hvgpu_device_get_attributes_req_t");

typedef struct __attribute__((packed)) hvgpu_device_get_attributes_rep {
    uint32_t values_len;
} hvgpu_device_get_attributes_rep_t;
_Static_assert(sizeof(hvgpu_device_get_attributes_rep_t) == 4, "hvgpu_device_get_attributes_rep_t");

typedef struct __attribute__((packed)) hvgpu_vgpu_processes_rep {
    uint32_t count;
    uint32_t pids_len;
    uint32_t used_len;
    uint32_t names_len;
} hvgpu_vgpu_processes_rep_t;
_Static_assert(sizeof(hvgpu_vgpu_processes_rep_t) == 16, "hvgpu_vgpu_processes_rep_t");

typedef struct __attribute__((packed)) hvgpu_vgpu_utilization_rep {
    uint32_t known;
    uint32_t gpu;
} hvgpu_vgpu_utilization_rep_t;
_Static_assert(sizeof(hvgpu_vgpu_utilization_rep_t) == 8, "hvgpu_vgpu_utilization_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_info_rep {
    uint64_t free;
    uint64_t total;
} hvgpu_mem_get_info_rep_t;
_Static_assert(sizeof(hvgpu_mem_get_info_rep_t) == 16, "hvgpu_mem_get_info_rep_t");

typedef struct __attribute__((packed)) hvgpu_ctx_get_limit_req {
    int32_t limit;
} hvgpu_ctx_get_limit_req_t;
_Static_assert(sizeof(hvgpu_ctx_get_limit_req_t) == 4, "hvgpu_ctx_get_limit_req_t");

typedef struct __attribute__((packed)) hvgpu_ctx_get_limit_rep {
    uint64_t value;
} hvgpu_ctx_get_limit_rep_t;
_Static_assert(sizeof(hvgpu_ctx_get_limit_rep_t) == 8, "hvgpu_ctx_get_limit_rep_t");

typedef struct __attribute__((packed)) hvgpu_ctx_set_limit_req {
    int32_t limit;
    uint64_t value;
} hvgpu_ctx_set_limit_req_t;
_Static_assert(sizeof(hvgpu_ctx_set_limit_req_t) == 12, "hvgpu_ctx_set_limit_req_t");

typedef struct __attribute__((packed)) hvgpu_ctx_set_limit_rep {
    uint64_t value;
} hvgpu_ctx_set_limit_rep_t;
_Static_assert(sizeof(hvgpu_ctx_set_limit_rep_t) == 8, "hvgpu_ctx_set_limit_rep_t");

typedef struct __attribute__((packed)) hvgpu_link_req {
    uint32_t options_len;
    uint32_t inputs_len;
    uint32_t names_len;
} hvgpu_link_req_t;
_Static_assert(sizeof(hvgpu_link_req_t) == 12, "hvgpu_link_req_t");

typedef struct __attribute__((packed)) hvgpu_link_rep {
    uint32_t status;
    float wall_ms;
    uint64_t image;
    uint64_t size;
    uint32_t info_log_len;
    uint32_t error_log_len;
} hvgpu_link_rep_t;
_Static_assert(sizeof(hvgpu_link_rep_t) == 32, "hvgpu_link_rep_t");

typedef struct __attribute__((packed)) hvgpu_link_image_req {
    uint64_t image;
} hvgpu_link_image_req_t;
_Static_assert(sizeof(hvgpu_link_image_req_t) == 8, "hvgpu_link_image_req_t");

typedef struct __attribute__((packed)) hvgpu_module_function_names_req {
    uint64_t module;
} hvgpu_module_function_names_req_t;
_Static_assert(sizeof(hvgpu_module_function_names_req_t) == 8, "hvgpu_module_function_names_req_t");

typedef struct __attribute__((packed)) hvgpu_module_function_names_rep {
    uint32_t names_len;
} hvgpu_module_function_names_rep_t;
_Static_assert(sizeof(hvgpu_module_function_names_rep_t) == 4, "hvgpu_module_function_names_rep_t");

typedef struct __attribute__((packed)) hvgpu_launch_cooperative_req {
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint64_t stream;
    uint32_t params_len;
    uint32_t attrs_len;
} hvgpu_launch_cooperative_req_t;
_Static_assert(sizeof(hvgpu_launch_cooperative_req_t) == 52, "hvgpu_launch_cooperative_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_alloc_req {
    uint64_t size;
} hvgpu_mem_alloc_req_t;
_Static_assert(sizeof(hvgpu_mem_alloc_req_t) == 8, "hvgpu_mem_alloc_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_alloc_rep {
    uint64_t dptr;
} hvgpu_mem_alloc_rep_t;
_Static_assert(sizeof(hvgpu_mem_alloc_rep_t) == 8, "hvgpu_mem_alloc_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_free_req {
    uint64_t dptr;
} hvgpu_mem_free_req_t;
_Static_assert(sizeof(hvgpu_mem_free_req_t) == 8, "hvgpu_mem_free_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_htod_req {
    uint64_t dst;
    uint64_t stream;
} hvgpu_memcpy_htod_req_t;
_Static_assert(sizeof(hvgpu_memcpy_htod_req_t) == 16, "hvgpu_memcpy_htod_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_dtoh_req {
    uint64_t src;
    uint64_t size;
    uint64_t stream;
} hvgpu_memcpy_dtoh_req_t;
_Static_assert(sizeof(hvgpu_memcpy_dtoh_req_t) == 24, "hvgpu_memcpy_dtoh_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_dtod_req {
    uint64_t dst;
    uint64_t src;
    uint64_t size;
    uint64_t stream;
} hvgpu_memcpy_dtod_req_t;
_Static_assert(sizeof(hvgpu_memcpy_dtod_req_t) == 32, "hvgpu_memcpy_dtod_req_t");

typedef struct __attribute__((packed)) hvgpu_memset_req {
    uint64_t dst;
    uint64_t count;
    uint32_t value;
    uint32_t width;
    uint64_t stream;
} hvgpu_memset_req_t;
_Static_assert(sizeof(hvgpu_memset_req_t) == 32, "hvgpu_memset_req_t");

typedef struct __attribute__((packed)) hvgpu_module_load_data_rep {
    uint64_t module;
} hvgpu_module_load_data_rep_t;
_Static_assert(sizeof(hvgpu_module_load_data_rep_t) == 8, "hvgpu_module_load_data_rep_t");

typedef struct __attribute__((packed)) hvgpu_module_compile_req {
    uint32_t name_len;
    uint32_t options_len;
} hvgpu_module_compile_req_t;
_Static_assert(sizeof(hvgpu_module_compile_req_t) == 8, "hvgpu_module_compile_req_t");

typedef struct __attribute__((packed)) hvgpu_module_compile_rep {
    uint64_t module;
    uint32_t log_len;
} hvgpu_module_compile_rep_t;
_Static_assert(sizeof(hvgpu_module_compile_rep_t) == 12, "hvgpu_module_compile_rep_t");

typedef struct __attribute__((packed)) hvgpu_module_compile_headers_req {
    uint32_t name_len;
    uint32_t options_len;
    uint32_t header_names_len;
    uint32_t sizes_len;
} hvgpu_module_compile_headers_req_t;
_Static_assert(sizeof(hvgpu_module_compile_headers_req_t) == 16, "hvgpu_module_compile_headers_req_t");

typedef struct __attribute__((packed)) hvgpu_module_compile_headers_rep {
    uint64_t module;
    uint32_t log_len;
} hvgpu_module_compile_headers_rep_t;
_Static_assert(sizeof(hvgpu_module_compile_headers_rep_t) == 12, "hvgpu_module_compile_headers_rep_t");

typedef struct __attribute__((packed)) hvgpu_module_unload_req {
    uint64_t module;
} hvgpu_module_unload_req_t;
_Static_assert(sizeof(hvgpu_module_unload_req_t) == 8, "hvgpu_module_unload_req_t");

typedef struct __attribute__((packed)) hvgpu_module_get_function_req {
    uint64_t module;
    uint32_t name_len;
} hvgpu_module_get_function_req_t;
_Static_assert(sizeof(hvgpu_module_get_function_req_t) == 12, "hvgpu_module_get_function_req_t");

typedef struct __attribute__((packed)) hvgpu_module_get_function_rep {
    uint64_t function;
} hvgpu_module_get_function_rep_t;
_Static_assert(sizeof(hvgpu_module_get_function_rep_t) == 8, "hvgpu_module_get_function_rep_t");

typedef struct __attribute__((packed)) hvgpu_func_get_param_info_req {
    uint64_t function;
} hvgpu_func_get_param_info_req_t;
_Static_assert(sizeof(hvgpu_func_get_param_info_req_t) == 8, "hvgpu_func_get_param_info_req_t");

typedef struct __attribute__((packed)) hvgpu_func_get_param_info_rep {
    uint32_t layout_len;
} hvgpu_func_get_param_info_rep_t;
_Static_assert(sizeof(hvgpu_func_get_param_info_rep_t) == 4, "hvgpu_func_get_param_info_rep_t");

typedef struct __attribute__((packed)) hvgpu_launch_kernel_req {
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint64_t stream;
    uint32_t params_len;
} hvgpu_launch_kernel_req_t;
_Static_assert(sizeof(hvgpu_launch_kernel_req_t) == 48, "hvgpu_launch_kernel_req_t");

typedef struct __attribute__((packed)) hvgpu_module_get_global_req {
    uint64_t module;
    uint32_t name_len;
} hvgpu_module_get_global_req_t;
_Static_assert(sizeof(hvgpu_module_get_global_req_t) == 12, "hvgpu_module_get_global_req_t");

typedef struct __attribute__((packed)) hvgpu_module_get_global_rep {
    uint64_t dptr;
    uint64_t size;
} hvgpu_module_get_global_rep_t;
_Static_assert(sizeof(hvgpu_module_get_global_rep_t) == 16, "hvgpu_module_get_global_rep_t");

typedef struct __attribute__((packed)) hvgpu_func_get_attribute_req {
    uint64_t function;
    int32_t attrib;
} hvgpu_func_get_attribute_req_t;
_Static_assert(sizeof(hvgpu_func_get_attribute_req_t) == 12, "hvgpu_func_get_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_func_get_attribute_rep {
    int32_t value;
} hvgpu_func_get_attribute_rep_t;
_Static_assert(sizeof(hvgpu_func_get_attribute_rep_t) == 4, "hvgpu_func_get_attribute_rep_t");

typedef struct __attribute__((packed)) hvgpu_func_set_attribute_req {
    uint64_t function;
    int32_t attrib;
    int32_t value;
} hvgpu_func_set_attribute_req_t;
_Static_assert(sizeof(hvgpu_func_set_attribute_req_t) == 16, "hvgpu_func_set_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_max_blocks_req {
    uint64_t function;
    int32_t block_size;
    uint64_t shared_mem;
    uint32_t flags;
} hvgpu_occupancy_max_blocks_req_t;
_Static_assert(sizeof(hvgpu_occupancy_max_blocks_req_t) == 24, "hvgpu_occupancy_max_blocks_req_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_max_blocks_rep {
    int32_t blocks;
} hvgpu_occupancy_max_blocks_rep_t;
_Static_assert(sizeof(hvgpu_occupancy_max_blocks_rep_t) == 4, "hvgpu_occupancy_max_blocks_rep_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_available_smem_req {
    uint64_t function;
    int32_t blocks;
    int32_t block_size;
} hvgpu_occupancy_available_smem_req_t;
_Static_assert(sizeof(hvgpu_occupancy_available_smem_req_t) == 16, "hvgpu_occupancy_available_smem_req_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_available_smem_rep {
    uint64_t bytes;
} hvgpu_occupancy_available_smem_rep_t;
_Static_assert(sizeof(hvgpu_occupancy_available_smem_rep_t) == 8, "hvgpu_occupancy_available_smem_rep_t");

typedef struct __attribute__((packed)) hvgpu_launch_kernel_ex_req {
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint64_t stream;
    uint32_t params_len;
    uint32_t attrs_len;
} hvgpu_launch_kernel_ex_req_t;
_Static_assert(sizeof(hvgpu_launch_kernel_ex_req_t) == 52, "hvgpu_launch_kernel_ex_req_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_encode_tiled_req {
    uint32_t dtype;
    uint32_t rank;
    uint64_t address;
    uint32_t dims_len;
    uint32_t strides_len;
    uint32_t box_len;
    uint32_t element_strides_len;
    uint32_t interleave;
    uint32_t swizzle;
    uint32_t l2_promotion;
    uint32_t oob_fill;
} hvgpu_tensor_map_encode_tiled_req_t;
_Static_assert(sizeof(hvgpu_tensor_map_encode_tiled_req_t) == 48, "hvgpu_tensor_map_encode_tiled_req_t");

typedef struct __attribute__((packed)) hvgpu_tensor_map_encode_tiled_rep {
    uint32_t map_len;
} hvgpu_tensor_map_encode_tiled_rep_t;
_Static_assert(sizeof(hvgpu_tensor_map_encode_tiled_rep_t) == 4, "hvgpu_tensor_map_encode_tiled_rep_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_clusters_req {
    uint32_t which;
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint32_t attrs_len;
} hvgpu_occupancy_clusters_req_t;
_Static_assert(sizeof(hvgpu_occupancy_clusters_req_t) == 44, "hvgpu_occupancy_clusters_req_t");

typedef struct __attribute__((packed)) hvgpu_occupancy_clusters_rep {
    int32_t value;
} hvgpu_occupancy_clusters_rep_t;
_Static_assert(sizeof(hvgpu_occupancy_clusters_rep_t) == 4, "hvgpu_occupancy_clusters_rep_t");

typedef struct __attribute__((packed)) hvgpu_func_get_attributes_req {
    uint64_t function;
    uint32_t count;
} hvgpu_func_get_attributes_req_t;
_Static_assert(sizeof(hvgpu_func_get_attributes_req_t) == 12, "hvgpu_func_get_attributes_req_t");

typedef struct __attribute__((packed)) hvgpu_func_get_attributes_rep {
    uint32_t known;
    uint32_t values_len;
} hvgpu_func_get_attributes_rep_t;
_Static_assert(sizeof(hvgpu_func_get_attributes_rep_t) == 8, "hvgpu_func_get_attributes_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_create_req {
    uint32_t flags;
} hvgpu_stream_create_req_t;
_Static_assert(sizeof(hvgpu_stream_create_req_t) == 4, "hvgpu_stream_create_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_create_rep {
    uint64_t stream;
} hvgpu_stream_create_rep_t;
_Static_assert(sizeof(hvgpu_stream_create_rep_t) == 8, "hvgpu_stream_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_destroy_req {
    uint64_t stream;
} hvgpu_stream_destroy_req_t;
_Static_assert(sizeof(hvgpu_stream_destroy_req_t) == 8, "hvgpu_stream_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_synchronize_req {
    uint64_t stream;
} hvgpu_stream_synchronize_req_t;
_Static_assert(sizeof(hvgpu_stream_synchronize_req_t) == 8, "hvgpu_stream_synchronize_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_query_req {
    uint64_t stream;
} hvgpu_stream_query_req_t;
_Static_assert(sizeof(hvgpu_stream_query_req_t) == 8, "hvgpu_stream_query_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_wait_event_req {
    uint64_t stream;
    uint64_t event;
    uint32_t flags;
} hvgpu_stream_wait_event_req_t;
_Static_assert(sizeof(hvgpu_stream_wait_event_req_t) == 20, "hvgpu_stream_wait_event_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_create_priority_req {
    uint32_t flags;
    int32_t priority;
} hvgpu_stream_create_priority_req_t;
_Static_assert(sizeof(hvgpu_stream_create_priority_req_t) == 8, "hvgpu_stream_create_priority_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_create_priority_rep {
    uint64_t stream;
} hvgpu_stream_create_priority_rep_t;
_Static_assert(sizeof(hvgpu_stream_create_priority_rep_t) == 8, "hvgpu_stream_create_priority_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_priority_range_rep {
    int32_t least;
    int32_t greatest;
} hvgpu_stream_priority_range_rep_t;
_Static_assert(sizeof(hvgpu_stream_priority_range_rep_t) == 8, "hvgpu_stream_priority_range_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_set_attribute_req {
    uint64_t stream;
    uint32_t attr;
    uint32_t value_len;
} hvgpu_stream_set_attribute_req_t;
_Static_assert(sizeof(hvgpu_stream_set_attribute_req_t) == 16, "hvgpu_stream_set_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_get_attribute_req {
    uint64_t stream;
    uint32_t attr;
} hvgpu_stream_get_attribute_req_t;
_Static_assert(sizeof(hvgpu_stream_get_attribute_req_t) == 12, "hvgpu_stream_get_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_get_attribute_rep {
    uint32_t value_len;
} hvgpu_stream_get_attribute_rep_t;
_Static_assert(sizeof(hvgpu_stream_get_attribute_rep_t) == 4, "hvgpu_stream_get_attribute_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_copy_attributes_req {
    uint64_t dst;
    uint64_t src;
} hvgpu_stream_copy_attributes_req_t;
_Static_assert(sizeof(hvgpu_stream_copy_attributes_req_t) == 16, "hvgpu_stream_copy_attributes_req_t");

typedef struct __attribute__((packed)) hvgpu_event_create_req {
    uint32_t flags;
} hvgpu_event_create_req_t;
_Static_assert(sizeof(hvgpu_event_create_req_t) == 4, "hvgpu_event_create_req_t");

typedef struct __attribute__((packed)) hvgpu_event_create_rep {
    uint64_t event;
} hvgpu_event_create_rep_t;
_Static_assert(sizeof(hvgpu_event_create_rep_t) == 8, "hvgpu_event_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_event_destroy_req {
    uint64_t event;
} hvgpu_event_destroy_req_t;
_Static_assert(sizeof(hvgpu_event_destroy_req_t) == 8, "hvgpu_event_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_event_record_req {
    uint64_t event;
    uint64_t stream;
} hvgpu_event_record_req_t;
_Static_assert(sizeof(hvgpu_event_record_req_t) == 16, "hvgpu_event_record_req_t");

typedef struct __attribute__((packed)) hvgpu_event_query_req {
    uint64_t event;
} hvgpu_event_query_req_t;
_Static_assert(sizeof(hvgpu_event_query_req_t) == 8, "hvgpu_event_query_req_t");

typedef struct __attribute__((packed)) hvgpu_event_synchronize_req {
    uint64_t event;
} hvgpu_event_synchronize_req_t;
_Static_assert(sizeof(hvgpu_event_synchronize_req_t) == 8, "hvgpu_event_synchronize_req_t");

typedef struct __attribute__((packed)) hvgpu_event_elapsed_time_req {
    uint64_t start;
    uint64_t end;
} hvgpu_event_elapsed_time_req_t;
_Static_assert(sizeof(hvgpu_event_elapsed_time_req_t) == 16, "hvgpu_event_elapsed_time_req_t");

typedef struct __attribute__((packed)) hvgpu_event_elapsed_time_rep {
    float ms;
} hvgpu_event_elapsed_time_rep_t;
_Static_assert(sizeof(hvgpu_event_elapsed_time_rep_t) == 4, "hvgpu_event_elapsed_time_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_mem_alloc_node_req {
    uint64_t graph;
    uint64_t size;
    uint32_t location_type;
    int32_t location_id;
    uint32_t deps_len;
} hvgpu_graph_add_mem_alloc_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_mem_alloc_node_req_t) == 28, "hvgpu_graph_add_mem_alloc_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_mem_alloc_node_rep {
    uint64_t node;
    uint64_t dptr;
} hvgpu_graph_add_mem_alloc_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_mem_alloc_node_rep_t) == 16, "hvgpu_graph_add_mem_alloc_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_mem_free_node_req {
    uint64_t graph;
    uint64_t dptr;
    uint32_t deps_len;
} hvgpu_graph_add_mem_free_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_mem_free_node_req_t) == 20, "hvgpu_graph_add_mem_free_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_mem_free_node_rep {
    uint64_t node;
} hvgpu_graph_add_mem_free_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_mem_free_node_rep_t) == 8, "hvgpu_graph_add_mem_free_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_node_get_type_req {
    uint64_t node;
} hvgpu_graph_node_get_type_req_t;
_Static_assert(sizeof(hvgpu_graph_node_get_type_req_t) == 8, "hvgpu_graph_node_get_type_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_node_get_type_rep {
    uint32_t type;
    uint32_t reserved;
    uint64_t dptr;
    uint64_t size;
} hvgpu_graph_node_get_type_rep_t;
_Static_assert(sizeof(hvgpu_graph_node_get_type_rep_t) == 24, "hvgpu_graph_node_get_type_rep_t");

typedef struct __attribute__((packed)) hvgpu_device_graph_mem_attribute_req {
    uint32_t attr;
    uint32_t set;
    uint64_t value;
} hvgpu_device_graph_mem_attribute_req_t;
_Static_assert(sizeof(hvgpu_device_graph_mem_attribute_req_t) == 16, "hvgpu_device_graph_mem_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_device_graph_mem_attribute_rep {
    uint64_t value;
} hvgpu_device_graph_mem_attribute_rep_t;
_Static_assert(sizeof(hvgpu_device_graph_mem_attribute_rep_t) == 8, "hvgpu_device_graph_mem_attribute_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_address_reserve_req {
    uint64_t size;
    uint64_t alignment;
    uint64_t addr;
    uint64_t flags;
} hvgpu_mem_address_reserve_req_t;
_Static_assert(sizeof(hvgpu_mem_address_reserve_req_t) == 32, "hvgpu_mem_address_reserve_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_address_reserve_rep {
    uint64_t dptr;
} hvgpu_mem_address_reserve_rep_t;
_Static_assert(sizeof(hvgpu_mem_address_reserve_rep_t) == 8, "hvgpu_mem_address_reserve_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_address_free_req {
    uint64_t dptr;
    uint64_t size;
} hvgpu_mem_address_free_req_t;
_Static_assert(sizeof(hvgpu_mem_address_free_req_t) == 16, "hvgpu_mem_address_free_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_create_req {
    uint64_t size;
    uint32_t type;
    uint32_t handle_types;
    uint32_t location_type;
    int32_t location_id;
    uint32_t alloc_flags;
} hvgpu_mem_create_req_t;
_Static_assert(sizeof(hvgpu_mem_create_req_t) == 28, "hvgpu_mem_create_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_create_rep {
    uint64_t handle;
} hvgpu_mem_create_rep_t;
_Static_assert(sizeof(hvgpu_mem_create_rep_t) == 8, "hvgpu_mem_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_release_req {
    uint64_t handle;
} hvgpu_mem_release_req_t;
_Static_assert(sizeof(hvgpu_mem_release_req_t) == 8, "hvgpu_mem_release_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_map_req {
    uint64_t dptr;
    uint64_t size;
    uint64_t offset;
    uint64_t handle;
    uint64_t flags;
} hvgpu_mem_map_req_t;
_Static_assert(sizeof(hvgpu_mem_map_req_t) == 40, "hvgpu_mem_map_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_unmap_req {
    uint64_t dptr;
    uint64_t size;
} hvgpu_mem_unmap_req_t;
_Static_assert(sizeof(hvgpu_mem_unmap_req_t) == 16, "hvgpu_mem_unmap_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_set_access_req {
    uint64_t dptr;
    uint64_t size;
    uint32_t descs_len;
} hvgpu_mem_set_access_req_t;
_Static_assert(sizeof(hvgpu_mem_set_access_req_t) == 20, "hvgpu_mem_set_access_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_access_req {
    uint64_t dptr;
} hvgpu_mem_get_access_req_t;
_Static_assert(sizeof(hvgpu_mem_get_access_req_t) == 8, "hvgpu_mem_get_access_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_access_rep {
    uint64_t flags;
} hvgpu_mem_get_access_rep_t;
_Static_assert(sizeof(hvgpu_mem_get_access_rep_t) == 8, "hvgpu_mem_get_access_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_granularity_req {
    uint32_t option;
} hvgpu_mem_get_granularity_req_t;
_Static_assert(sizeof(hvgpu_mem_get_granularity_req_t) == 4, "hvgpu_mem_get_granularity_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_granularity_rep {
    uint64_t granularity;
} hvgpu_mem_get_granularity_rep_t;
_Static_assert(sizeof(hvgpu_mem_get_granularity_rep_t) == 8, "hvgpu_mem_get_granularity_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_retain_handle_req {
    uint64_t dptr;
} hvgpu_mem_retain_handle_req_t;
_Static_assert(sizeof(hvgpu_mem_retain_handle_req_t) == 8, "hvgpu_mem_retain_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_retain_handle_rep {
    uint64_t handle;
} hvgpu_mem_retain_handle_rep_t;
_Static_assert(sizeof(hvgpu_mem_retain_handle_rep_t) == 8, "hvgpu_mem_retain_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_handle_info_req {
    uint64_t handle;
} hvgpu_mem_handle_info_req_t;
_Static_assert(sizeof(hvgpu_mem_handle_info_req_t) == 8, "hvgpu_mem_handle_info_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_handle_info_rep {
    uint64_t size;
} hvgpu_mem_handle_info_rep_t;
_Static_assert(sizeof(hvgpu_mem_handle_info_rep_t) == 8, "hvgpu_mem_handle_info_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_granularity_of_req {
    uint32_t option;
    uint32_t alloc_flags;
} hvgpu_mem_get_granularity_of_req_t;
_Static_assert(sizeof(hvgpu_mem_get_granularity_of_req_t) == 8, "hvgpu_mem_get_granularity_of_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_get_granularity_of_rep {
    uint64_t granularity;
} hvgpu_mem_get_granularity_of_rep_t;
_Static_assert(sizeof(hvgpu_mem_get_granularity_of_rep_t) == 8, "hvgpu_mem_get_granularity_of_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_handle_props_req {
    uint64_t handle;
} hvgpu_mem_handle_props_req_t;
_Static_assert(sizeof(hvgpu_mem_handle_props_req_t) == 8, "hvgpu_mem_handle_props_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_handle_props_rep {
    uint64_t size;
    uint32_t alloc_flags;
} hvgpu_mem_handle_props_rep_t;
_Static_assert(sizeof(hvgpu_mem_handle_props_rep_t) == 12, "hvgpu_mem_handle_props_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_create_req {
    uint32_t type;
    uint32_t handle_types;
    uint32_t location_type;
    int32_t location_id;
    uint64_t max_size;
    uint32_t usage;
} hvgpu_mem_pool_create_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_create_req_t) == 28, "hvgpu_mem_pool_create_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_create_rep {
    uint64_t pool;
} hvgpu_mem_pool_create_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_create_rep_t) == 8, "hvgpu_mem_pool_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_destroy_req {
    uint64_t pool;
} hvgpu_mem_pool_destroy_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_destroy_req_t) == 8, "hvgpu_mem_pool_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_default_rep {
    uint64_t pool;
} hvgpu_mem_pool_default_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_default_rep_t) == 8, "hvgpu_mem_pool_default_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_alloc_async_req {
    uint64_t size;
    uint64_t pool;
    uint64_t stream;
} hvgpu_mem_alloc_async_req_t;
_Static_assert(sizeof(hvgpu_mem_alloc_async_req_t) == 24, "hvgpu_mem_alloc_async_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_alloc_async_rep {
    uint64_t dptr;
} hvgpu_mem_alloc_async_rep_t;
_Static_assert(sizeof(hvgpu_mem_alloc_async_rep_t) == 8, "hvgpu_mem_alloc_async_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_free_async_req {
    uint64_t dptr;
    uint64_t stream;
} hvgpu_mem_free_async_req_t;
_Static_assert(sizeof(hvgpu_mem_free_async_req_t) == 16, "hvgpu_mem_free_async_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_set_attribute_req {
    uint64_t pool;
    int32_t attrib;
    uint64_t value;
} hvgpu_mem_pool_set_attribute_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_set_attribute_req_t) == 20, "hvgpu_mem_pool_set_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_get_attribute_req {
    uint64_t pool;
    int32_t attrib;
} hvgpu_mem_pool_get_attribute_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_get_attribute_req_t) == 12, "hvgpu_mem_pool_get_attribute_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_get_attribute_rep {
    uint64_t value;
} hvgpu_mem_pool_get_attribute_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_get_attribute_rep_t) == 8, "hvgpu_mem_pool_get_attribute_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_trim_to_req {
    uint64_t pool;
    uint64_t keep;
} hvgpu_mem_pool_trim_to_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_trim_to_req_t) == 16, "hvgpu_mem_pool_trim_to_req_t");

typedef struct __attribute__((packed)) hvgpu_region_attach_req {
    uint32_t kind;
    uint32_t flags;
    uint64_t size;
} hvgpu_region_attach_req_t;
_Static_assert(sizeof(hvgpu_region_attach_req_t) == 16, "hvgpu_region_attach_req_t");

typedef struct __attribute__((packed)) hvgpu_region_attach_rep {
    uint32_t region;
    uint32_t device;
    uint64_t size;
    uint32_t token_len;
} hvgpu_region_attach_rep_t;
_Static_assert(sizeof(hvgpu_region_attach_rep_t) == 20, "hvgpu_region_attach_rep_t");

typedef struct __attribute__((packed)) hvgpu_region_detach_req {
    uint32_t region;
} hvgpu_region_detach_req_t;
_Static_assert(sizeof(hvgpu_region_detach_req_t) == 4, "hvgpu_region_detach_req_t");

typedef struct __attribute__((packed)) hvgpu_region_alloc_req {
    uint32_t region;
    uint32_t reserved;
    uint64_t size;
} hvgpu_region_alloc_req_t;
_Static_assert(sizeof(hvgpu_region_alloc_req_t) == 16, "hvgpu_region_alloc_req_t");

typedef struct __attribute__((packed)) hvgpu_region_alloc_rep {
    uint64_t offset;
} hvgpu_region_alloc_rep_t;
_Static_assert(sizeof(hvgpu_region_alloc_rep_t) == 8, "hvgpu_region_alloc_rep_t");

typedef struct __attribute__((packed)) hvgpu_region_free_req {
    uint32_t region;
    uint32_t reserved;
    uint64_t offset;
} hvgpu_region_free_req_t;
_Static_assert(sizeof(hvgpu_region_free_req_t) == 16, "hvgpu_region_free_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_htod_region_req {
    uint64_t dst;
    uint32_t region;
    uint32_t reserved;
    uint64_t offset;
    uint64_t size;
    uint64_t stream;
} hvgpu_memcpy_htod_region_req_t;
_Static_assert(sizeof(hvgpu_memcpy_htod_region_req_t) == 40, "hvgpu_memcpy_htod_region_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_dtoh_region_req {
    uint32_t region;
    uint32_t reserved;
    uint64_t offset;
    uint64_t src;
    uint64_t size;
    uint64_t stream;
} hvgpu_memcpy_dtoh_region_req_t;
_Static_assert(sizeof(hvgpu_memcpy_dtoh_region_req_t) == 40, "hvgpu_memcpy_dtoh_region_req_t");

typedef struct __attribute__((packed)) hvgpu_func_set_cache_config_req {
    uint64_t function;
    uint32_t config;
} hvgpu_func_set_cache_config_req_t;
_Static_assert(sizeof(hvgpu_func_set_cache_config_req_t) == 12, "hvgpu_func_set_cache_config_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_begin_capture_req {
    uint64_t stream;
    uint32_t mode;
} hvgpu_stream_begin_capture_req_t;
_Static_assert(sizeof(hvgpu_stream_begin_capture_req_t) == 12, "hvgpu_stream_begin_capture_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_begin_capture_rep {
    uint64_t id;
    uint64_t graph;
} hvgpu_stream_begin_capture_rep_t;
_Static_assert(sizeof(hvgpu_stream_begin_capture_rep_t) == 16, "hvgpu_stream_begin_capture_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_end_capture_req {
    uint64_t stream;
} hvgpu_stream_end_capture_req_t;
_Static_assert(sizeof(hvgpu_stream_end_capture_req_t) == 8, "hvgpu_stream_end_capture_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_end_capture_rep {
    uint64_t graph;
} hvgpu_stream_end_capture_rep_t;
_Static_assert(sizeof(hvgpu_stream_end_capture_rep_t) == 8, "hvgpu_stream_end_capture_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_capture_info_req {
    uint64_t stream;
    uint32_t nodes;
} hvgpu_stream_capture_info_req_t;
_Static_assert(sizeof(hvgpu_stream_capture_info_req_t) == 12, "hvgpu_stream_capture_info_req_t");

typedef struct __attribute__((packed)) hvgpu_stream_capture_info_rep {
    uint32_t status;
    uint32_t reserved;
    uint64_t id;
    uint64_t graph;
    uint32_t nodes_len;
} hvgpu_stream_capture_info_rep_t;
_Static_assert(sizeof(hvgpu_stream_capture_info_rep_t) == 28, "hvgpu_stream_capture_info_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_instantiate_req {
    uint64_t graph;
    uint64_t flags;
} hvgpu_graph_instantiate_req_t;
_Static_assert(sizeof(hvgpu_graph_instantiate_req_t) == 16, "hvgpu_graph_instantiate_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_instantiate_rep {
    uint64_t exec;
} hvgpu_graph_instantiate_rep_t;
_Static_assert(sizeof(hvgpu_graph_instantiate_rep_t) == 8, "hvgpu_graph_instantiate_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_launch_req {
    uint64_t exec;
    uint64_t stream;
} hvgpu_graph_launch_req_t;
_Static_assert(sizeof(hvgpu_graph_launch_req_t) == 16, "hvgpu_graph_launch_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_upload_req {
    uint64_t exec;
    uint64_t stream;
} hvgpu_graph_upload_req_t;
_Static_assert(sizeof(hvgpu_graph_upload_req_t) == 16, "hvgpu_graph_upload_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_destroy_req {
    uint64_t graph;
} hvgpu_graph_destroy_req_t;
_Static_assert(sizeof(hvgpu_graph_destroy_req_t) == 8, "hvgpu_graph_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_exec_destroy_req {
    uint64_t exec;
} hvgpu_graph_exec_destroy_req_t;
_Static_assert(sizeof(hvgpu_graph_exec_destroy_req_t) == 8, "hvgpu_graph_exec_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_get_nodes_req {
    uint64_t graph;
    uint32_t max;
} hvgpu_graph_get_nodes_req_t;
_Static_assert(sizeof(hvgpu_graph_get_nodes_req_t) == 12, "hvgpu_graph_get_nodes_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_get_nodes_rep {
    uint64_t count;
    uint32_t nodes_len;
} hvgpu_graph_get_nodes_rep_t;
_Static_assert(sizeof(hvgpu_graph_get_nodes_rep_t) == 12, "hvgpu_graph_get_nodes_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_create_req {
    uint32_t flags;
} hvgpu_graph_create_req_t;
_Static_assert(sizeof(hvgpu_graph_create_req_t) == 4, "hvgpu_graph_create_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_create_rep {
    uint64_t graph;
} hvgpu_graph_create_rep_t;
_Static_assert(sizeof(hvgpu_graph_create_rep_t) == 8, "hvgpu_graph_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_kernel_node_req {
    uint64_t graph;
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint32_t deps_len;
    uint32_t params_len;
} hvgpu_graph_add_kernel_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_kernel_node_req_t) == 52, "hvgpu_graph_add_kernel_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_kernel_node_rep {
    uint64_t node;
} hvgpu_graph_add_kernel_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_kernel_node_rep_t) == 8, "hvgpu_graph_add_kernel_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_memset_node_req {
    uint64_t graph;
    uint64_t dst;
    uint64_t pitch;
    uint32_t value;
    uint32_t element_size;
    uint64_t width;
    uint64_t height;
    uint32_t deps_len;
} hvgpu_graph_add_memset_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_memset_node_req_t) == 52, "hvgpu_graph_add_memset_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_memset_node_rep {
    uint64_t node;
} hvgpu_graph_add_memset_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_memset_node_rep_t) == 8, "hvgpu_graph_add_memset_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_memcpy_node_req {
    uint64_t graph;
    uint32_t kind;
    uint32_t region;
    uint64_t dst;
    uint64_t src;
    uint64_t size;
    uint32_t deps_len;
} hvgpu_graph_add_memcpy_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_memcpy_node_req_t) == 44, "hvgpu_graph_add_memcpy_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_memcpy_node_rep {
    uint64_t node;
} hvgpu_graph_add_memcpy_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_memcpy_node_rep_t) == 8, "hvgpu_graph_add_memcpy_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_empty_node_req {
    uint64_t graph;
    uint32_t deps_len;
} hvgpu_graph_add_empty_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_empty_node_req_t) == 12, "hvgpu_graph_add_empty_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_empty_node_rep {
    uint64_t node;
} hvgpu_graph_add_empty_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_empty_node_rep_t) == 8, "hvgpu_graph_add_empty_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_event_node_req {
    uint64_t graph;
    uint32_t wait;
    uint32_t reserved;
    uint64_t event;
    uint32_t deps_len;
} hvgpu_graph_add_event_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_event_node_req_t) == 28, "hvgpu_graph_add_event_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_event_node_rep {
    uint64_t node;
} hvgpu_graph_add_event_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_event_node_rep_t) == 8, "hvgpu_graph_add_event_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_dependencies_req {
    uint64_t graph;
    uint32_t from_nodes_len;
    uint32_t to_nodes_len;
} hvgpu_graph_add_dependencies_req_t;
_Static_assert(sizeof(hvgpu_graph_add_dependencies_req_t) == 16, "hvgpu_graph_add_dependencies_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_exec_kernel_node_set_params_req {
    uint64_t exec;
    uint64_t node;
    uint64_t function;
    uint32_t grid_x;
    uint32_t grid_y;
    uint32_t grid_z;
    uint32_t block_x;
    uint32_t block_y;
    uint32_t block_z;
    uint32_t shared_mem;
    uint32_t params_len;
} hvgpu_graph_exec_kernel_node_set_params_req_t;
_Static_assert(sizeof(hvgpu_graph_exec_kernel_node_set_params_req_t) == 56, "hvgpu_graph_exec_kernel_node_set_params_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_exec_update_req {
    uint64_t exec;
    uint64_t graph;
} hvgpu_graph_exec_update_req_t;
_Static_assert(sizeof(hvgpu_graph_exec_update_req_t) == 16, "hvgpu_graph_exec_update_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_exec_update_rep {
    uint32_t result;
    uint32_t reserved;
    uint64_t error_node;
} hvgpu_graph_exec_update_rep_t;
_Static_assert(sizeof(hvgpu_graph_exec_update_rep_t) == 16, "hvgpu_graph_exec_update_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_clone_req {
    uint64_t graph;
} hvgpu_graph_clone_req_t;
_Static_assert(sizeof(hvgpu_graph_clone_req_t) == 8, "hvgpu_graph_clone_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_clone_rep {
    uint64_t clone;
} hvgpu_graph_clone_rep_t;
_Static_assert(sizeof(hvgpu_graph_clone_rep_t) == 8, "hvgpu_graph_clone_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_node_find_in_clone_req {
    uint64_t clone;
    uint64_t node;
} hvgpu_graph_node_find_in_clone_req_t;
_Static_assert(sizeof(hvgpu_graph_node_find_in_clone_req_t) == 16, "hvgpu_graph_node_find_in_clone_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_node_find_in_clone_rep {
    uint64_t node;
} hvgpu_graph_node_find_in_clone_rep_t;
_Static_assert(sizeof(hvgpu_graph_node_find_in_clone_rep_t) == 8, "hvgpu_graph_node_find_in_clone_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_conditional_handle_create_req {
    uint64_t graph;
    uint32_t default_value;
    uint32_t flags;
} hvgpu_graph_conditional_handle_create_req_t;
_Static_assert(sizeof(hvgpu_graph_conditional_handle_create_req_t) == 16, "hvgpu_graph_conditional_handle_create_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_conditional_handle_create_rep {
    uint64_t handle;
} hvgpu_graph_conditional_handle_create_rep_t;
_Static_assert(sizeof(hvgpu_graph_conditional_handle_create_rep_t) == 8, "hvgpu_graph_conditional_handle_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_conditional_node_req {
    uint64_t graph;
    uint64_t handle;
    uint32_t type;
    uint32_t size;
    uint32_t deps_len;
} hvgpu_graph_add_conditional_node_req_t;
_Static_assert(sizeof(hvgpu_graph_add_conditional_node_req_t) == 28, "hvgpu_graph_add_conditional_node_req_t");

typedef struct __attribute__((packed)) hvgpu_graph_add_conditional_node_rep {
    uint64_t node;
    uint32_t bodies_len;
} hvgpu_graph_add_conditional_node_rep_t;
_Static_assert(sizeof(hvgpu_graph_add_conditional_node_rep_t) == 12, "hvgpu_graph_add_conditional_node_rep_t");

typedef struct __attribute__((packed)) hvgpu_array_create_req {
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint32_t format;
    uint32_t channels;
    uint32_t flags;
} hvgpu_array_create_req_t;
_Static_assert(sizeof(hvgpu_array_create_req_t) == 36, "hvgpu_array_create_req_t");

typedef struct __attribute__((packed)) hvgpu_array_create_rep {
    uint64_t array;
} hvgpu_array_create_rep_t;
_Static_assert(sizeof(hvgpu_array_create_rep_t) == 8, "hvgpu_array_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_array_destroy_req {
    uint64_t array;
} hvgpu_array_destroy_req_t;
_Static_assert(sizeof(hvgpu_array_destroy_req_t) == 8, "hvgpu_array_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_array_get_descriptor_req {
    uint64_t array;
} hvgpu_array_get_descriptor_req_t;
_Static_assert(sizeof(hvgpu_array_get_descriptor_req_t) == 8, "hvgpu_array_get_descriptor_req_t");

typedef struct __attribute__((packed)) hvgpu_array_get_descriptor_rep {
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint32_t format;
    uint32_t channels;
    uint32_t flags;
} hvgpu_array_get_descriptor_rep_t;
_Static_assert(sizeof(hvgpu_array_get_descriptor_rep_t) == 36, "hvgpu_array_get_descriptor_rep_t");

typedef struct __attribute__((packed)) hvgpu_mipmapped_array_create_req {
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint32_t format;
    uint32_t channels;
    uint32_t flags;
    uint32_t levels;
} hvgpu_mipmapped_array_create_req_t;
_Static_assert(sizeof(hvgpu_mipmapped_array_create_req_t) == 40, "hvgpu_mipmapped_array_create_req_t");

typedef struct __attribute__((packed)) hvgpu_mipmapped_array_create_rep {
    uint64_t mipmap;
} hvgpu_mipmapped_array_create_rep_t;
_Static_assert(sizeof(hvgpu_mipmapped_array_create_rep_t) == 8, "hvgpu_mipmapped_array_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_mipmapped_array_destroy_req {
    uint64_t mipmap;
} hvgpu_mipmapped_array_destroy_req_t;
_Static_assert(sizeof(hvgpu_mipmapped_array_destroy_req_t) == 8, "hvgpu_mipmapped_array_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_mipmapped_array_get_level_req {
    uint64_t mipmap;
    uint32_t level;
} hvgpu_mipmapped_array_get_level_req_t;
_Static_assert(sizeof(hvgpu_mipmapped_array_get_level_req_t) == 12, "hvgpu_mipmapped_array_get_level_req_t");

typedef struct __attribute__((packed)) hvgpu_mipmapped_array_get_level_rep {
    uint64_t array;
} hvgpu_mipmapped_array_get_level_rep_t;
_Static_assert(sizeof(hvgpu_mipmapped_array_get_level_rep_t) == 8, "hvgpu_mipmapped_array_get_level_rep_t");

typedef struct __attribute__((packed)) hvgpu_tex_object_create_req {
    uint32_t res_type;
    uint32_t format;
    uint64_t resource;
    uint64_t width;
    uint64_t height;
    uint64_t pitch;
    uint32_t channels;
    uint32_t res_flags;
    uint32_t tex_desc_len;
    uint32_t view_desc_len;
} hvgpu_tex_object_create_req_t;
_Static_assert(sizeof(hvgpu_tex_object_create_req_t) == 56, "hvgpu_tex_object_create_req_t");

typedef struct __attribute__((packed)) hvgpu_tex_object_create_rep {
    uint64_t object;
} hvgpu_tex_object_create_rep_t;
_Static_assert(sizeof(hvgpu_tex_object_create_rep_t) == 8, "hvgpu_tex_object_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_tex_object_destroy_req {
    uint64_t object;
} hvgpu_tex_object_destroy_req_t;
_Static_assert(sizeof(hvgpu_tex_object_destroy_req_t) == 8, "hvgpu_tex_object_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_surf_object_create_req {
    uint64_t array;
} hvgpu_surf_object_create_req_t;
_Static_assert(sizeof(hvgpu_surf_object_create_req_t) == 8, "hvgpu_surf_object_create_req_t");

typedef struct __attribute__((packed)) hvgpu_surf_object_create_rep {
    uint64_t object;
} hvgpu_surf_object_create_rep_t;
_Static_assert(sizeof(hvgpu_surf_object_create_rep_t) == 8, "hvgpu_surf_object_create_rep_t");

typedef struct __attribute__((packed)) hvgpu_surf_object_destroy_req {
    uint64_t object;
} hvgpu_surf_object_destroy_req_t;
_Static_assert(sizeof(hvgpu_surf_object_destroy_req_t) == 8, "hvgpu_surf_object_destroy_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_3d_req {
    uint32_t src_kind;
    uint32_t dst_kind;
    uint64_t src;
    uint64_t src_x;
    uint64_t src_y;
    uint64_t src_z;
    uint64_t src_pitch;
    uint64_t src_height;
    uint64_t dst;
    uint64_t dst_x;
    uint64_t dst_y;
    uint64_t dst_z;
    uint64_t dst_pitch;
    uint64_t dst_height;
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint64_t stream;
} hvgpu_memcpy_3d_req_t;
_Static_assert(sizeof(hvgpu_memcpy_3d_req_t) == 136, "hvgpu_memcpy_3d_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_3d_to_req {
    uint32_t dst_kind;
    uint32_t reserved;
    uint64_t dst;
    uint64_t dst_x;
    uint64_t dst_y;
    uint64_t dst_z;
    uint64_t dst_pitch;
    uint64_t dst_height;
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint64_t stream;
} hvgpu_memcpy_3d_to_req_t;
_Static_assert(sizeof(hvgpu_memcpy_3d_to_req_t) == 88, "hvgpu_memcpy_3d_to_req_t");

typedef struct __attribute__((packed)) hvgpu_memcpy_3d_from_req {
    uint32_t src_kind;
    uint32_t reserved;
    uint64_t src;
    uint64_t src_x;
    uint64_t src_y;
    uint64_t src_z;
    uint64_t src_pitch;
    uint64_t src_height;
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint64_t stream;
} hvgpu_memcpy_3d_from_req_t;
_Static_assert(sizeof(hvgpu_memcpy_3d_from_req_t) == 88, "hvgpu_memcpy_3d_from_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_get_mem_handle_req {
    uint64_t dptr;
} hvgpu_ipc_get_mem_handle_req_t;
_Static_assert(sizeof(hvgpu_ipc_get_mem_handle_req_t) == 8, "hvgpu_ipc_get_mem_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_get_mem_handle_rep {
    uint32_t handle_len;
} hvgpu_ipc_get_mem_handle_rep_t;
_Static_assert(sizeof(hvgpu_ipc_get_mem_handle_rep_t) == 4, "hvgpu_ipc_get_mem_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_ipc_open_mem_handle_req {
    uint32_t flags;
    uint32_t handle_len;
} hvgpu_ipc_open_mem_handle_req_t;
_Static_assert(sizeof(hvgpu_ipc_open_mem_handle_req_t) == 8, "hvgpu_ipc_open_mem_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_open_mem_handle_rep {
    uint64_t dptr;
    uint64_t size;
} hvgpu_ipc_open_mem_handle_rep_t;
_Static_assert(sizeof(hvgpu_ipc_open_mem_handle_rep_t) == 16, "hvgpu_ipc_open_mem_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_ipc_close_mem_handle_req {
    uint64_t dptr;
} hvgpu_ipc_close_mem_handle_req_t;
_Static_assert(sizeof(hvgpu_ipc_close_mem_handle_req_t) == 8, "hvgpu_ipc_close_mem_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_close_mem_handle_rep {
    uint32_t left;
} hvgpu_ipc_close_mem_handle_rep_t;
_Static_assert(sizeof(hvgpu_ipc_close_mem_handle_rep_t) == 4, "hvgpu_ipc_close_mem_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_ipc_get_event_handle_req {
    uint64_t event;
} hvgpu_ipc_get_event_handle_req_t;
_Static_assert(sizeof(hvgpu_ipc_get_event_handle_req_t) == 8, "hvgpu_ipc_get_event_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_get_event_handle_rep {
    uint32_t handle_len;
} hvgpu_ipc_get_event_handle_rep_t;
_Static_assert(sizeof(hvgpu_ipc_get_event_handle_rep_t) == 4, "hvgpu_ipc_get_event_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_ipc_open_event_handle_req {
    uint32_t handle_len;
} hvgpu_ipc_open_event_handle_req_t;
_Static_assert(sizeof(hvgpu_ipc_open_event_handle_req_t) == 4, "hvgpu_ipc_open_event_handle_req_t");

typedef struct __attribute__((packed)) hvgpu_ipc_open_event_handle_rep {
    uint64_t event;
} hvgpu_ipc_open_event_handle_rep_t;
_Static_assert(sizeof(hvgpu_ipc_open_event_handle_rep_t) == 8, "hvgpu_ipc_open_event_handle_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_export_req {
    uint64_t handle;
    uint32_t handle_type;
    uint32_t flags;
} hvgpu_mem_export_req_t;
_Static_assert(sizeof(hvgpu_mem_export_req_t) == 16, "hvgpu_mem_export_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_export_rep {
    uint32_t token_len;
} hvgpu_mem_export_rep_t;
_Static_assert(sizeof(hvgpu_mem_export_rep_t) == 4, "hvgpu_mem_export_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_import_req {
    uint32_t handle_type;
    uint32_t token_len;
} hvgpu_mem_import_req_t;
_Static_assert(sizeof(hvgpu_mem_import_req_t) == 8, "hvgpu_mem_import_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_import_rep {
    uint64_t handle;
} hvgpu_mem_import_rep_t;
_Static_assert(sizeof(hvgpu_mem_import_rep_t) == 8, "hvgpu_mem_import_rep_t");

typedef struct __attribute__((packed)) hvgpu_host_map_req {
    uint32_t region;
    uint32_t reserved;
    uint64_t offset;
    uint64_t size;
    uint64_t addr;
} hvgpu_host_map_req_t;
_Static_assert(sizeof(hvgpu_host_map_req_t) == 32, "hvgpu_host_map_req_t");

typedef struct __attribute__((packed)) hvgpu_host_map_rep {
    uint64_t dptr;
} hvgpu_host_map_rep_t;
_Static_assert(sizeof(hvgpu_host_map_rep_t) == 8, "hvgpu_host_map_rep_t");

typedef struct __attribute__((packed)) hvgpu_stream_memop_req {
    uint64_t stream;
    uint32_t flags;
    uint32_t call;
    uint32_t count;
    uint32_t ops_len;
} hvgpu_stream_memop_req_t;
_Static_assert(sizeof(hvgpu_stream_memop_req_t) == 24, "hvgpu_stream_memop_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_export_req {
    uint64_t pool;
    uint32_t handle_type;
    uint32_t flags;
} hvgpu_mem_pool_export_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_export_req_t) == 16, "hvgpu_mem_pool_export_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_export_rep {
    uint32_t token_len;
} hvgpu_mem_pool_export_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_export_rep_t) == 4, "hvgpu_mem_pool_export_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_import_req {
    uint32_t handle_type;
    uint32_t flags;
    uint32_t token_len;
} hvgpu_mem_pool_import_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_import_req_t) == 12, "hvgpu_mem_pool_import_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_import_rep {
    uint64_t pool;
} hvgpu_mem_pool_import_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_import_rep_t) == 8, "hvgpu_mem_pool_import_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_export_pointer_req {
    uint64_t dptr;
} hvgpu_mem_pool_export_pointer_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_export_pointer_req_t) == 8, "hvgpu_mem_pool_export_pointer_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_export_pointer_rep {
    uint32_t token_len;
} hvgpu_mem_pool_export_pointer_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_export_pointer_rep_t) == 4, "hvgpu_mem_pool_export_pointer_rep_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_import_pointer_req {
    uint64_t pool;
    uint32_t token_len;
} hvgpu_mem_pool_import_pointer_req_t;
_Static_assert(sizeof(hvgpu_mem_pool_import_pointer_req_t) == 12, "hvgpu_mem_pool_import_pointer_req_t");

typedef struct __attribute__((packed)) hvgpu_mem_pool_import_pointer_rep {
    uint64_t dptr;
    uint64_t size;
} hvgpu_mem_pool_import_pointer_rep_t;
_Static_assert(sizeof(hvgpu_mem_pool_import_pointer_rep_t) == 16, "hvgpu_mem_pool_import_pointer_rep_t");

/* The body of every reply whose status is not 0. */
typedef struct __attribute__((packed)) hvgpu_error_rep {
    uint16_t op;
    uint16_t reserved;
    uint32_t seq;
    uint32_t message_len;
} hvgpu_error_rep_t;

/* Limits and layouts inside the ops' fields (hvgpu/virtio/protocol.py). */
#define HVGPU_MAX_PARAMS 32764
#define HVGPU_LAUNCH_ATTR_SIZE 72
#define HVGPU_MAX_LAUNCH_ATTRS 32
#define HVGPU_LAUNCH_ATTR_PROGRAMMATIC_EVENT 7
#define HVGPU_LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT 12
#define HVGPU_MAX_DEVICE_ATTRIBUTES 1024
#define HVGPU_LAUNCH_ATTR_COOPERATIVE 2
#define HVGPU_LAUNCH_ATTR_VALUE_SIZE 64
#define HVGPU_MAX_FUNC_ATTRIBUTES 32
#define HVGPU_UUID_SIZE 16
#define HVGPU_TENSOR_MAP_SIZE 128
#define HVGPU_MAX_ATOMIC_OPERATIONS 64
#define HVGPU_ACCESS_DESC_SIZE 12
#define HVGPU_MAX_ACCESS_DESCS 64
#define HVGPU_MAX_QUERY_NODES 4096
#define HVGPU_MAX_GRAPH_NODES 65536
#define HVGPU_MAX_CONDITIONAL_BODIES 1024
#define HVGPU_FIRST_HANDLE 16
#define HVGPU_MEMCPY_NODE_DEVICE 0
#define HVGPU_MEMCPY_NODE_FROM_REGION 1
#define HVGPU_MEMCPY_NODE_TO_REGION 2
#define HVGPU_MAX_VGPUS 8
#define HVGPU_CLIENT_FORMAT "%s; pid %d; %s"
#define HVGPU_MEMORY_DEVICE 2
#define HVGPU_MEMORY_ARRAY 3
#define HVGPU_MAX_COPY_3D 8388608
#define HVGPU_TEX_DESC_SIZE 104
#define HVGPU_VIEW_DESC_SIZE 112
#define HVGPU_IPC_HANDLE_SIZE 64
#define HVGPU_LINK_OPTION_SIZE 16
#define HVGPU_LINK_INPUT_SIZE 16
#define HVGPU_MAX_LINK_OPTIONS 64
#define HVGPU_MAX_LINK_INPUTS 256
#define HVGPU_MAX_LINK_BYTES 268435456
#define HVGPU_MAX_LINK_LOG 65536
#define HVGPU_MAX_FUNCTION_NAMES 524288
#define HVGPU_MEMOP_SIZE 24
#define HVGPU_MAX_MEMOPS 256
#define HVGPU_MEMOP_BATCH 0
#define HVGPU_MEMOP_BATCH_V1 1
#define HVGPU_MEMOP_ONE 2
#define HVGPU_MEMOP_ONE_V1 3

/* -- replies with variable-length fields -------------------------------------------- */

/* A variable-length field of a body received: its bytes, inside that body. */
typedef struct hvgpu_span {
    const uint8_t *data;
    uint32_t len;
} hvgpu_span_t;

/* The field of len bytes at p, cut at end where the body received stops first
   (counted in *cut); returns where the next field starts. */
static inline const uint8_t *hvgpu_span_take(hvgpu_span_t *s, const uint8_t *p,
                                             const uint8_t *end, uint32_t len, int *cut) {
    size_t left = (size_t)(end - p);
    s->data = p;
    s->len = len <= left ? len : (uint32_t)left;
    *cut += s->len < len;
    return p + s->len;
}

/* Each reply below is decoded from the n bytes of its body that were received (a
   reply longer than the caller's buffer is received in part) by its _decode: -1
   where even its fixed part is not all there (the fixed part then reads all zero,
   each span empty); else how many variable fields were cut short by the end of
   those bytes, each span holding what there is of its field (0: every field whole).
   A span's data points into body (at its end when empty), never NULL. */

typedef struct hvgpu_hello_rep_view {
    hvgpu_hello_rep_t fixed;
    hvgpu_span_t peer;
    hvgpu_span_t agent;
} hvgpu_hello_rep_view_t;

static inline int hvgpu_hello_rep_decode(const void *body, uint32_t n, hvgpu_hello_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    p = hvgpu_span_take(&v->peer, p, end, v->fixed.peer_len, &cut);
    hvgpu_span_take(&v->agent, p, end, v->fixed.agent_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_device_host_atomic_caps_rep_view {
    hvgpu_device_host_atomic_caps_rep_t fixed;
    hvgpu_span_t caps;
} hvgpu_device_host_atomic_caps_rep_view_t;

static inline int hvgpu_device_host_atomic_caps_rep_decode(const void *body, uint32_t n, hvgpu_device_host_atomic_caps_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->caps, p, end, v->fixed.caps_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_tensor_map_encode_im2col_rep_view {
    hvgpu_tensor_map_encode_im2col_rep_t fixed;
    hvgpu_span_t map;
} hvgpu_tensor_map_encode_im2col_rep_view_t;

static inline int hvgpu_tensor_map_encode_im2col_rep_decode(const void *body, uint32_t n, hvgpu_tensor_map_encode_im2col_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->map, p, end, v->fixed.map_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_tensor_map_replace_address_rep_view {
    hvgpu_tensor_map_replace_address_rep_t fixed;
    hvgpu_span_t map;
} hvgpu_tensor_map_replace_address_rep_view_t;

static inline int hvgpu_tensor_map_replace_address_rep_decode(const void *body, uint32_t n, hvgpu_tensor_map_replace_address_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->map, p, end, v->fixed.map_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_device_get_name_rep_view {
    hvgpu_device_get_name_rep_t fixed;
    hvgpu_span_t name;
} hvgpu_device_get_name_rep_view_t;

static inline int hvgpu_device_get_name_rep_decode(const void *body, uint32_t n, hvgpu_device_get_name_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->name, p, end, v->fixed.name_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_device_get_uuid_rep_view {
    hvgpu_device_get_uuid_rep_t fixed;
    hvgpu_span_t uuid;
} hvgpu_device_get_uuid_rep_view_t;

static inline int hvgpu_device_get_uuid_rep_decode(const void *body, uint32_t n, hvgpu_device_get_uuid_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->uuid, p, end, v->fixed.uuid_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_slice_info_rep_view {
    hvgpu_slice_info_rep_t fixed;
    hvgpu_span_t vm;
} hvgpu_slice_info_rep_view_t;

static inline int hvgpu_slice_info_rep_decode(const void *body, uint32_t n, hvgpu_slice_info_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->vm, p, end, v->fixed.vm_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_device_get_attributes_rep_view {
    hvgpu_device_get_attributes_rep_t fixed;
    hvgpu_span_t values;
} hvgpu_device_get_attributes_rep_view_t;

static inline int hvgpu_device_get_attributes_rep_decode(const void *body, uint32_t n, hvgpu_device_get_attributes_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->values, p, end, v->fixed.values_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_vgpu_processes_rep_view {
    hvgpu_vgpu_processes_rep_t fixed;
    hvgpu_span_t pids;
    hvgpu_span_t used;
    hvgpu_span_t names;
} hvgpu_vgpu_processes_rep_view_t;

static inline int hvgpu_vgpu_processes_rep_decode(const void *body, uint32_t n, hvgpu_vgpu_processes_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    p = hvgpu_span_take(&v->pids, p, end, v->fixed.pids_len, &cut);
    p = hvgpu_span_take(&v->used, p, end, v->fixed.used_len, &cut);
    hvgpu_span_take(&v->names, p, end, v->fixed.names_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_link_rep_view {
    hvgpu_link_rep_t fixed;
    hvgpu_span_t info_log;
    hvgpu_span_t error_log;
} hvgpu_link_rep_view_t;

static inline int hvgpu_link_rep_decode(const void *body, uint32_t n, hvgpu_link_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    p = hvgpu_span_take(&v->info_log, p, end, v->fixed.info_log_len, &cut);
    hvgpu_span_take(&v->error_log, p, end, v->fixed.error_log_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_module_function_names_rep_view {
    hvgpu_module_function_names_rep_t fixed;
    hvgpu_span_t names;
} hvgpu_module_function_names_rep_view_t;

static inline int hvgpu_module_function_names_rep_decode(const void *body, uint32_t n, hvgpu_module_function_names_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->names, p, end, v->fixed.names_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_module_compile_rep_view {
    hvgpu_module_compile_rep_t fixed;
    hvgpu_span_t log;
} hvgpu_module_compile_rep_view_t;

static inline int hvgpu_module_compile_rep_decode(const void *body, uint32_t n, hvgpu_module_compile_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->log, p, end, v->fixed.log_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_module_compile_headers_rep_view {
    hvgpu_module_compile_headers_rep_t fixed;
    hvgpu_span_t log;
} hvgpu_module_compile_headers_rep_view_t;

static inline int hvgpu_module_compile_headers_rep_decode(const void *body, uint32_t n, hvgpu_module_compile_headers_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->log, p, end, v->fixed.log_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_func_get_param_info_rep_view {
    hvgpu_func_get_param_info_rep_t fixed;
    hvgpu_span_t layout;
} hvgpu_func_get_param_info_rep_view_t;

static inline int hvgpu_func_get_param_info_rep_decode(const void *body, uint32_t n, hvgpu_func_get_param_info_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->layout, p, end, v->fixed.layout_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_tensor_map_encode_tiled_rep_view {
    hvgpu_tensor_map_encode_tiled_rep_t fixed;
    hvgpu_span_t map;
} hvgpu_tensor_map_encode_tiled_rep_view_t;

static inline int hvgpu_tensor_map_encode_tiled_rep_decode(const void *body, uint32_t n, hvgpu_tensor_map_encode_tiled_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->map, p, end, v->fixed.map_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_func_get_attributes_rep_view {
    hvgpu_func_get_attributes_rep_t fixed;
    hvgpu_span_t values;
} hvgpu_func_get_attributes_rep_view_t;

static inline int hvgpu_func_get_attributes_rep_decode(const void *body, uint32_t n, hvgpu_func_get_attributes_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->values, p, end, v->fixed.values_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_stream_get_attribute_rep_view {
    hvgpu_stream_get_attribute_rep_t fixed;
    hvgpu_span_t value;
} hvgpu_stream_get_attribute_rep_view_t;

static inline int hvgpu_stream_get_attribute_rep_decode(const void *body, uint32_t n, hvgpu_stream_get_attribute_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->value, p, end, v->fixed.value_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_region_attach_rep_view {
    hvgpu_region_attach_rep_t fixed;
    hvgpu_span_t token;
} hvgpu_region_attach_rep_view_t;

static inline int hvgpu_region_attach_rep_decode(const void *body, uint32_t n, hvgpu_region_attach_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->token, p, end, v->fixed.token_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_stream_capture_info_rep_view {
    hvgpu_stream_capture_info_rep_t fixed;
    hvgpu_span_t nodes;
} hvgpu_stream_capture_info_rep_view_t;

static inline int hvgpu_stream_capture_info_rep_decode(const void *body, uint32_t n, hvgpu_stream_capture_info_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->nodes, p, end, v->fixed.nodes_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_graph_get_nodes_rep_view {
    hvgpu_graph_get_nodes_rep_t fixed;
    hvgpu_span_t nodes;
} hvgpu_graph_get_nodes_rep_view_t;

static inline int hvgpu_graph_get_nodes_rep_decode(const void *body, uint32_t n, hvgpu_graph_get_nodes_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->nodes, p, end, v->fixed.nodes_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_graph_add_conditional_node_rep_view {
    hvgpu_graph_add_conditional_node_rep_t fixed;
    hvgpu_span_t bodies;
} hvgpu_graph_add_conditional_node_rep_view_t;

static inline int hvgpu_graph_add_conditional_node_rep_decode(const void *body, uint32_t n, hvgpu_graph_add_conditional_node_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->bodies, p, end, v->fixed.bodies_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_ipc_get_mem_handle_rep_view {
    hvgpu_ipc_get_mem_handle_rep_t fixed;
    hvgpu_span_t handle;
} hvgpu_ipc_get_mem_handle_rep_view_t;

static inline int hvgpu_ipc_get_mem_handle_rep_decode(const void *body, uint32_t n, hvgpu_ipc_get_mem_handle_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->handle, p, end, v->fixed.handle_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_ipc_get_event_handle_rep_view {
    hvgpu_ipc_get_event_handle_rep_t fixed;
    hvgpu_span_t handle;
} hvgpu_ipc_get_event_handle_rep_view_t;

static inline int hvgpu_ipc_get_event_handle_rep_decode(const void *body, uint32_t n, hvgpu_ipc_get_event_handle_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->handle, p, end, v->fixed.handle_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_mem_export_rep_view {
    hvgpu_mem_export_rep_t fixed;
    hvgpu_span_t token;
} hvgpu_mem_export_rep_view_t;

static inline int hvgpu_mem_export_rep_decode(const void *body, uint32_t n, hvgpu_mem_export_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->token, p, end, v->fixed.token_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_mem_pool_export_rep_view {
    hvgpu_mem_pool_export_rep_t fixed;
    hvgpu_span_t token;
} hvgpu_mem_pool_export_rep_view_t;

static inline int hvgpu_mem_pool_export_rep_decode(const void *body, uint32_t n, hvgpu_mem_pool_export_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->token, p, end, v->fixed.token_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_mem_pool_export_pointer_rep_view {
    hvgpu_mem_pool_export_pointer_rep_t fixed;
    hvgpu_span_t token;
} hvgpu_mem_pool_export_pointer_rep_view_t;

static inline int hvgpu_mem_pool_export_pointer_rep_decode(const void *body, uint32_t n, hvgpu_mem_pool_export_pointer_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->token, p, end, v->fixed.token_len, &cut);
    return whole ? cut : -1;
}

typedef struct hvgpu_error_rep_view {
    hvgpu_error_rep_t fixed;
    hvgpu_span_t message;
} hvgpu_error_rep_view_t;

static inline int hvgpu_error_rep_decode(const void *body, uint32_t n, hvgpu_error_rep_view_t *v) {
    const uint8_t *p = (const uint8_t *)body, *end = p + n;
    int cut = 0, whole = n >= sizeof v->fixed;
    memset(v, 0, sizeof *v);
    if (whole) memcpy(&v->fixed, p, sizeof v->fixed);
    p += whole ? sizeof v->fixed : n;
    hvgpu_span_take(&v->message, p, end, v->fixed.message_len, &cut);
    return whole ? cut : -1;
}

/* -- the region (hvgpu/virtio/region.py) ------------------------------ */

#define HVGPU_REGION_MAGIC "HVGPUSHM"
#define HVGPU_REGION_VERSION 1
#define HVGPU_REGION_DATA_OFFSET 4096ull
#define HVGPU_REGION_TOKEN_SIZE 16
#define HVGPU_REGION_ALIGN 4096ull
#define HVGPU_REGION_KIND_MEMFD 1
#define HVGPU_REGION_KIND_DEVICE 2
#define HVGPU_REGION_PCI_VENDOR 6900
#define HVGPU_REGION_PCI_DEVICE 4368
#define HVGPU_REGION_PCI_BAR 2

/* The header at a region's start: advisory, for picking the device alone. */
typedef struct __attribute__((packed)) hvgpu_region_header {
    uint8_t magic[8];
    uint32_t version;
    uint32_t data_offset;
    uint64_t size;
    uint8_t token[16];
    uint32_t device;
} hvgpu_region_header_t;
_Static_assert(sizeof(hvgpu_region_header_t) == 44, "hvgpu_region_header_t");
_Static_assert(offsetof(hvgpu_region_header_t, magic) == 0, "hvgpu_region_header_t.magic");
_Static_assert(offsetof(hvgpu_region_header_t, version) == 8, "hvgpu_region_header_t.version");
_Static_assert(offsetof(hvgpu_region_header_t, data_offset) == 12, "hvgpu_region_header_t.data_offset");
_Static_assert(offsetof(hvgpu_region_header_t, size) == 16, "hvgpu_region_header_t.size");
_Static_assert(offsetof(hvgpu_region_header_t, token) == 24, "hvgpu_region_header_t.token");
_Static_assert(offsetof(hvgpu_region_header_t, device) == 40, "hvgpu_region_header_t.device");

/* -- how guests use the wire (hvgpu/virtio/tuning.py): the shim as the Python client */

#define HVGPU_ENV_AGENT "HVGPU_AGENT"
#define HVGPU_ENV_TIMEOUT "HVGPU_TIMEOUT"
#define HVGPU_ENV_COPY_THREADS "HVGPU_COPY_THREADS"
#define HVGPU_ENV_SYSFS_ROOT "HVGPU_SYSFS_ROOT"
#define HVGPU_DEFAULT_TIMEOUT 60.0
#define HVGPU_MIN_TIMEOUT 2.0
#define HVGPU_BATCH_BYTES 65536
#define HVGPU_STAGE_MIN 1048576ull
#define HVGPU_STAGE_CHUNK 8388608ull
#define HVGPU_STAGE_SLOTS 2
#define HVGPU_PARALLEL_COPY_MIN 2097152ull
#define HVGPU_PARALLEL_COPY_ALIGN 4096ull
#define HVGPU_PARALLEL_COPY_THREADS 4
#define HVGPU_PARALLEL_COPY_MAX_THREADS 16

/* Statuses: CUDA's CUresult numbers, then hvgpu's own from HVGPU_STATUS_OWN_BASE. */
#define HVGPU_STATUS_OWN_BASE 10000
enum hvgpu_status {
    HVGPU_STATUS_CUDA_SUCCESS = 0,
    HVGPU_STATUS_CUDA_ERROR_INVALID_VALUE = 1,
    HVGPU_STATUS_CUDA_ERROR_OUT_OF_MEMORY = 2,
    HVGPU_STATUS_CUDA_ERROR_NOT_INITIALIZED = 3,
    HVGPU_STATUS_CUDA_ERROR_DEINITIALIZED = 4,
    HVGPU_STATUS_CUDA_ERROR_STUB_LIBRARY = 34,
    HVGPU_STATUS_CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    HVGPU_STATUS_CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    HVGPU_STATUS_CUDA_ERROR_NO_DEVICE = 100,
    HVGPU_STATUS_CUDA_ERROR_INVALID_DEVICE = 101,
    HVGPU_STATUS_CUDA_ERROR_INVALID_IMAGE = 200,
    HVGPU_STATUS_CUDA_ERROR_INVALID_CONTEXT = 201,
    HVGPU_STATUS_CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    HVGPU_STATUS_CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    HVGPU_STATUS_CUDA_ERROR_INVALID_PTX = 218,
    HVGPU_STATUS_CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    HVGPU_STATUS_CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224,
    HVGPU_STATUS_CUDA_ERROR_INVALID_SOURCE = 300,
    HVGPU_STATUS_CUDA_ERROR_FILE_NOT_FOUND = 301,
    HVGPU_STATUS_CUDA_ERROR_INVALID_HANDLE = 400,
    HVGPU_STATUS_CUDA_ERROR_ILLEGAL_STATE = 401,
    HVGPU_STATUS_CUDA_ERROR_NOT_FOUND = 500,
    HVGPU_STATUS_CUDA_ERROR_NOT_READY = 600,
    HVGPU_STATUS_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    HVGPU_STATUS_CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    HVGPU_STATUS_CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    HVGPU_STATUS_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    HVGPU_STATUS_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    HVGPU_STATUS_CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    HVGPU_STATUS_CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    HVGPU_STATUS_CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    HVGPU_STATUS_CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    HVGPU_STATUS_CUDA_ERROR_INVALID_PC = 718,
    HVGPU_STATUS_CUDA_ERROR_LAUNCH_FAILED = 719,
    HVGPU_STATUS_CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    HVGPU_STATUS_CUDA_ERROR_NOT_PERMITTED = 800,
    HVGPU_STATUS_CUDA_ERROR_NOT_SUPPORTED = 801,
    HVGPU_STATUS_CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    HVGPU_STATUS_CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    HVGPU_STATUS_CUDA_ERROR_CAPTURED_EVENT = 907,
    HVGPU_STATUS_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    HVGPU_STATUS_CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    HVGPU_STATUS_CUDA_ERROR_UNKNOWN = 999,
    HVGPU_STATUS_HVGPU_ERROR_BAD_FRAME = 10001,
    HVGPU_STATUS_HVGPU_ERROR_UNKNOWN_OP = 10002,
    HVGPU_STATUS_HVGPU_ERROR_VERSION = 10003,
    HVGPU_STATUS_HVGPU_ERROR_OVERSIZE = 10004,
    HVGPU_STATUS_HVGPU_ERROR_HANDSHAKE = 10005,
    HVGPU_STATUS_HVGPU_ERROR_INTERNAL = 10006,
    HVGPU_STATUS_HVGPU_ERROR_NO_GPU = 10007,
    HVGPU_STATUS_HVGPU_ERROR_NO_SLICE = 10008,
    HVGPU_STATUS_HVGPU_ERROR_TOO_MANY_CONNECTIONS = 10009,
};

/* CUDA's own names for the statuses, for C that has no cuda.h of its own (the
 * guest's shim defines HVGPU_WIRE_CUDA_NAMES; host C that sits beside the real
 * driver's headers does not). */
#ifdef HVGPU_WIRE_CUDA_NAMES
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_UNSUPPORTED_LIMIT = 215,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY = 224,
    CUDA_ERROR_INVALID_SOURCE = 300,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_MPS_CONNECTION_FAILED = 805,
    CUDA_ERROR_MPS_SERVER_NOT_READY = 807,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
    CUDA_ERROR_UNKNOWN = 999,
};
#endif

/* A status's name and description; 0 for numbers the table does not name. */
static inline int hvgpu_status_text(int status, const char **name, const char **text) {
    switch (status) {
    case 0: *name = "CUDA_SUCCESS"; *text = "no error"; return 1;
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; *text = "an argument is out of range"; return 1;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; *text = "out of device memory"; return 1;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; *text = "the driver is not initialised"; return 1;
    case 4: *name = "CUDA_ERROR_DEINITIALIZED"; *text = "the driver is shutting down"; return 1;
    case 34: *name = "CUDA_ERROR_STUB_LIBRARY"; *text = "the driver found is a stub library"; return 1;
    case 35: *name = "CUDA_ERROR_INSUFFICIENT_DRIVER"; *text = "the installed driver is older than the runtime"; return 1;
    case 46: *name = "CUDA_ERROR_DEVICE_UNAVAILABLE"; *text = "the device is unavailable (the connection to the hvgpu agent was lost)"; return 1;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; *text = "no CUDA-capable device is available"; return 1;
    case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; *text = "invalid device ordinal"; return 1;
    case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; *text = "the module image is not valid"; return 1;
    case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; *text = "invalid context"; return 1;
    case 209: *name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; *text = "no kernel image for this GPU"; return 1;
    case 215: *name = "CUDA_ERROR_UNSUPPORTED_LIMIT"; *text = "the context limit is not supported by the device"; return 1;
    case 218: *name = "CUDA_ERROR_INVALID_PTX"; *text = "the PTX could not be compiled"; return 1;
    case 222: *name = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; *text = "the PTX version is newer than the driver"; return 1;
    case 224: *name = "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY"; *text = "the execution affinity is not supported"; return 1;
    case 300: *name = "CUDA_ERROR_INVALID_SOURCE"; *text = "the source could not be compiled"; return 1;
    case 301: *name = "CUDA_ERROR_FILE_NOT_FOUND"; *text = "file not found"; return 1;
    case 400: *name = "CUDA_ERROR_INVALID_HANDLE"; *text = "invalid resource handle"; return 1;
    case 401: *name = "CUDA_ERROR_ILLEGAL_STATE"; *text = "the resource is not in a state the operation allows"; return 1;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; *text = "named symbol not found"; return 1;
    case 600: *name = "CUDA_ERROR_NOT_READY"; *text = "work is still pending"; return 1;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; *text = "a kernel accessed an illegal address"; return 1;
    case 701: *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; *text = "too many resources requested for launch"; return 1;
    case 702: *name = "CUDA_ERROR_LAUNCH_TIMEOUT"; *text = "the launch timed out"; return 1;
    case 712: *name = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; *text = "the host memory is already registered"; return 1;
    case 713: *name = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"; *text = "the host memory is not registered"; return 1;
    case 714: *name = "CUDA_ERROR_HARDWARE_STACK_ERROR"; *text = "a kernel's call stack overflowed"; return 1;
    case 715: *name = "CUDA_ERROR_ILLEGAL_INSTRUCTION"; *text = "a kernel executed an illegal instruction"; return 1;
    case 716: *name = "CUDA_ERROR_MISALIGNED_ADDRESS"; *text = "a kernel accessed a misaligned address"; return 1;
    case 717: *name = "CUDA_ERROR_INVALID_ADDRESS_SPACE"; *text = "a kernel accessed an invalid address space"; return 1;
    case 718: *name = "CUDA_ERROR_INVALID_PC"; *text = "a kernel's program counter became invalid"; return 1;
    case 719: *name = "CUDA_ERROR_LAUNCH_FAILED"; *text = "unspecified launch failure"; return 1;
    case 720: *name = "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"; *text = "a cooperative launch has more blocks than can be resident at once"; return 1;
    case 800: *name = "CUDA_ERROR_NOT_PERMITTED"; *text = "operation not permitted"; return 1;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; *text = "operation not supported"; return 1;
    case 805: *name = "CUDA_ERROR_MPS_CONNECTION_FAILED"; *text = "the MPS client could not reach the MPS server"; return 1;
    case 807: *name = "CUDA_ERROR_MPS_SERVER_NOT_READY"; *text = "the MPS server takes no new client yet"; return 1;
    case 900: *name = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; *text = "the operation is not permitted while the stream is capturing"; return 1;
    case 901: *name = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; *text = "the stream capture failed because of an earlier error"; return 1;
    case 902: *name = "CUDA_ERROR_STREAM_CAPTURE_MERGE"; *text = "the operation would merge two capture sequences"; return 1;
    case 903: *name = "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"; *text = "the capture was not begun on this stream"; return 1;
    case 904: *name = "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"; *text = "a stream forked from the capture was not joined back"; return 1;
    case 905: *name = "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"; *text = "a dependency would cross the capture's boundary"; return 1;
    case 906: *name = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; *text = "the legacy stream would join a capture"; return 1;
    case 907: *name = "CUDA_ERROR_CAPTURED_EVENT"; *text = "the event was last recorded in a capture"; return 1;
    case 908: *name = "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"; *text = "the capture was begun on another thread"; return 1;
    case 910: *name = "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"; *text = "the graph cannot update the instantiated graph (its shape differs)"; return 1;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; *text = "unknown error"; return 1;
    case 10001: *name = "HVGPU_ERROR_BAD_FRAME"; *text = "the frame is malformed"; return 1;
    case 10002: *name = "HVGPU_ERROR_UNKNOWN_OP"; *text = "the operation is not part of this protocol"; return 1;
    case 10003: *name = "HVGPU_ERROR_VERSION"; *text = "no protocol version in common"; return 1;
    case 10004: *name = "HVGPU_ERROR_OVERSIZE"; *text = "the frame exceeds the agent's limits"; return 1;
    case 10005: *name = "HVGPU_ERROR_HANDSHAKE"; *text = "the connection did not start with HELLO"; return 1;
    case 10006: *name = "HVGPU_ERROR_INTERNAL"; *text = "the executor failed unexpectedly"; return 1;
    case 10007: *name = "HVGPU_ERROR_NO_GPU"; *text = "the host agent cannot reach a GPU"; return 1;
    case 10008: *name = "HVGPU_ERROR_NO_SLICE"; *text = "no GPU slice is attached to this VM"; return 1;
    case 10009: *name = "HVGPU_ERROR_TOO_MANY_CONNECTIONS"; *text = "the VM has as many connections open as the host agent allows"; return 1;
    default:
        return 0;
    }
}

#endif /* HVGPU_WIRE_H */
