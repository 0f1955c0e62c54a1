/* hvgpu libcuda.so.1 shim: declarations shared by its sources.
 *
 * The shim is a CUDA driver library for a machine without a GPU: every entry
 * point it implements forwards over the hvgpu data lane (wire.c) to the
 * agent's executor, which runs the call on the real GPU. It must never call
 * exit() or abort() on behalf of the program, never touch a real
 * libcuda.so.1, and never pretend to have done what it did not: anything it
 * cannot do returns CUDA_ERROR_NOT_SUPPORTED and says so once on stderr.
 */
#ifndef HVGPU_SHIM_H
#define HVGPU_SHIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define HVGPU_WIRE_CUDA_NAMES /* CUDA_SUCCESS, CUDA_ERROR_*: the shim has no cuda.h */
#include "hvgpu_wire.h"

#define HV_EXPORT __attribute__((visibility("default")))
#define HV_API_VERSION 13000 /* the driver API level this shim implements (cuda.h 13.0) */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct hv_ctx *CUcontext;
typedef void *CUmodule;
typedef struct hv_func *CUfunction;
typedef struct hv_func *CUkernel;
typedef struct hv_library *CUlibrary;
typedef void *CUstream;
typedef void *CUevent;

#define HV_MAX_DEVICES 16
_Static_assert(HV_MAX_DEVICES >= HVGPU_MAX_VGPUS, "a VM's every vGPU has a place");
#define HV_ATTR_COUNT 160 /* device attributes fetched at init: 1..HV_ATTR_COUNT */
_Static_assert(HV_ATTR_COUNT <= HVGPU_MAX_DEVICE_ATTRIBUTES, "the agent answers so many");

struct hv_ctx {
    uint32_t magic;
    int device;
    unsigned flags;
    int retained;
};

struct hv_answers; /* occupancy.c: a function's attributes and occupancy on one vGPU */

struct hv_func {
    uint64_t handle;          /* the executor's function handle, on `device` */
    int device;               /* the vGPU whose executor holds it */
    char *name;               /* whole: a library kernel is looked up by it on each vGPU */
    int nparams;              /* -1 until the layout has been fetched */
    uint32_t *offsets, *sizes;
    uint32_t params_size;     /* bytes of the packed parameter buffer */
    struct hv_library *library; /* set when found through cuLibraryGetKernel */
    struct hv_func *next;     /* the library's next kernel */
    uint64_t on[HV_MAX_DEVICES]; /* a library kernel's function on each vGPU; 0: not yet */
    pthread_mutex_t lock;     /* guards answers[] */
    struct hv_answers *answers[HV_MAX_DEVICES]; /* per vGPU, where its handle is valid */
    void *module;             /* the (tagged) module it was found in; NULL: a library's */
    struct hv_legacy *legacy; /* the deprecated launch API's state (launches.c), or NULL */
};

/* CUDA's libraries belong to no context: loaded on each vGPU where they are used. */
struct hv_library {
    uint64_t module[HV_MAX_DEVICES]; /* the executor's module on each vGPU; 0: not yet */
    const void *image;               /* kept (copied) to load it on another vGPU */
    size_t size;
    int owned;                       /* image is our copy */
    struct hv_func *kernels;         /* cuLibraryGetKernel's, one per name */
};

/* Each library that builds wire.c (this shim, the NVML library) says who it is in
   HELLO, and the capabilities it asks for. */
extern const char hv_client_software[];
extern const uint64_t hv_client_caps;

/* wire.c: this process's connections to the agent, one per vGPU. Calls go to the
   device of the thread's current context, or to the one hv_route() names. */
CUresult hv_ensure(void);                 /* connect and handshake once */
int hv_route(int device);                 /* -1: the current context's again; returns the old */
int hv_routed_device(void);               /* where the next call goes */
CUresult hv_call(uint16_t op, const void *body, uint32_t body_len, const void *payload,
                 uint64_t payload_len, void *reply, uint32_t reply_cap, uint32_t *reply_len,
                 void *rpayload, uint64_t rpayload_len);
CUresult hv_oneway(uint16_t op, const void *body, uint32_t body_len, const void *payload,
                   uint64_t payload_len);
CUresult hv_flush(void);
/* How many errors of one-way frames the routed vGPU's agent has reported (each
   surfaced at a later call): what the guest assumed they did may not hold. */
unsigned hv_oneway_failures(void);
/* The routed vGPU's connection held (locked) across several frames: a copy through
   the region lane sends synchronous requests before reading their replies
   (in order). hv_wire_hold connects first; NULL with *r saying why. pass >= 0: a
   descriptor travels with the frame (only where hv_wire_passes_fds). */
struct wire;
struct wire *hv_wire_hold(CUresult *r);
void hv_wire_release(struct wire *w);
int hv_wire_device(const struct wire *w);
uint64_t hv_wire_caps(const struct wire *w);
int hv_wire_passes_fds(const struct wire *w);
unsigned hv_wire_failures(const struct wire *w); /* as hv_oneway_failures() */
CUresult hv_wire_oneway(struct wire *w, uint16_t op, const void *body, uint32_t body_len);
CUresult hv_wire_oneway_payload(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                                const void *payload, uint64_t payload_len);
CUresult hv_wire_call_payload(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                              void *rpayload, uint64_t rpayload_len);
/* A standalone wire (hvgpu_client_open, wire.c's exported API): hv_wire_device is -1
   for it, and region_lane.c keeps its lane in *hv_wire_lane. hv_wire_take locks a wire
   one has, as hv_wire_hold does the routed vGPU's (hv_wire_release lets go), and
   begins an exported call on it. */
int hv_wire_standalone(const struct wire *w);
void **hv_wire_lane(struct wire *w);
CUresult hv_wire_take(struct wire *w);
CUresult hv_wire_send(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                      int pass, uint32_t *seq);
CUresult hv_wire_reply(struct wire *w, uint16_t op, uint32_t seq, void *reply,
                       uint32_t reply_cap, uint32_t *reply_len);
CUresult hv_wire_call(struct wire *w, uint16_t op, const void *body, uint32_t body_len,
                      int pass, void *reply, uint32_t reply_cap, uint32_t *reply_len);
CUresult hv_wire_flush(struct wire *w);

/* graph.c: whether this process has a stream capture under way (no round trip), and
   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED where `stream` is capturing and `what` (named
   in the trace) cannot be replayed by a graph; 0 otherwise. */
int hv_capture_active(void);
/* ... 1 where `stream` is capturing and the call was handled there (*r its status):
   a copy between the device and pageable memory (graph_guest.c keeps it), a host
   function or stream callback (the graph is split around it). */
int hv_capture_copy(CUdeviceptr dptr, void *user, size_t n, int to_host, CUstream stream,
                    CUresult *r);
int hv_capture_host(CUstream stream, void (*fn)(void *),
                    void (*cb)(CUstream, CUresult, void *), void *data, CUresult *r);
/* graph_guest.c: the guest's part of graphs (its docstring says what). Each hv_graph_*
   returns 0 where the graph or instantiation has no record here (the caller goes on
   as for the executor's alone), else 1 with the call's status in *r. */
struct hv_captured;
int hv_captured_copy(struct hv_captured **c, CUdeviceptr dptr, void *user, size_t n,
                     int to_host, CUstream stream, CUresult *r);
int hv_captured_split(struct hv_captured **c, uint64_t part, void (*fn)(void *),
                      void (*cb)(CUstream, CUresult, void *), void *data, CUstream stream);
void hv_captured_drop(struct hv_captured *c, int device);
void *hv_captured_finish(struct hv_captured *c, int device, uint64_t last);
int hv_graph_recorded(void *key, int is_exec, int *parts);
int hv_graph_destroy(void *key, int is_exec, CUresult *r);
int hv_graph_instantiate(void *graph, unsigned long long flags, void **exec, CUresult *r);
int hv_graph_upload(void *exec, CUstream stream, CUresult *r);
int hv_graph_launch(void *exec, CUstream stream, CUresult *r);
int hv_graph_count(void *graph, size_t *count, CUresult *r);
int hv_graph_clone(void *graph, void **clone, CUresult *r);
/* The executor handles of a recorded graph's (or instantiation's) parts, up to most;
   -1: not recorded. */
int hv_graph_parts(void *key, int is_exec, uint64_t *parts, int most);
/* Where node is in a recorded instantiation: the part instantiations that may hold it
   and its handle in each (count returned, 0: none; -1: not recorded). */
int hv_graph_exec_node(void *exec, const void *node, uint64_t *parts, uint64_t *nodes,
                       int most);
/* ... shadows of graphs built node by node, for their host nodes */
struct hv_node_request { uint16_t op; const void *fixed; size_t fixed_len, deps_at;
                         const void *tail; size_t tail_len; };
void hv_shadow_new(void *graph);
void hv_shadow_drop(void *graph);
int hv_shadow_hosts(void *graph); /* host nodes so far; -1: no shadow (not hand-built) */
int hv_shadow_is_host(const void *node);
int hv_shadow_add(void *graph, const struct hv_node_request *q, void *const *deps, size_t ndeps,
                  void **node); /* q NULL: a host node, whose handle is made here */
int hv_shadow_edge(void *graph, const void *from, const void *to);
void hv_shadow_set_host(void *node, void (*fn)(void *), void *data);
int hv_shadow_instantiate(void *graph, unsigned long long flags, void **exec, CUresult *r);
/* cuGraphExecUpdate of an instantiation made in parts from a hand-built graph. */
int hv_shadow_update(void *exec, void *graph, CUresult *r);
int hv_shadow_clone(void *graph, void *clone, CUresult *r); /* 0: failed, *r says why */
/* A clone's node copying node: 1 found, 0 not a node of the original, -1 not a clone
   with a shadow. */
int hv_shadow_find_in_clone(void *clone, const void *node, void **found);
/* ... and the synchronising calls that complete its deliveries */
void hv_graph_synced_stream(CUstream stream);
void hv_graph_synced_device(int device);
void hv_graph_event_recorded(CUevent event, CUstream stream);
void hv_graph_event_done(CUevent event);
/* launches.c: a kernel's vGPU and handle there, and its packed parameters (kernelParams
   or `extra`, as cuLaunchKernel takes them) in buf (HVGPU_MAX_PARAMS bytes). */
CUresult hv_kernel_pack(struct hv_func *f, void **params, void **extra, unsigned char *buf,
                        uint32_t *size, int *device, uint64_t *handle);
CUresult hv_capture_refuse(CUstream stream, const char *what);
/* occupancy.c: a launch configuration the driver would refuse, refused with its status
   (on the function's vGPU, routed there). */
CUresult hv_launch_check(struct hv_func *f, uint64_t handle, const unsigned grid[3],
                         const unsigned block[3], unsigned smem);
/* module.c: where a function runs and its handle there: a module's function on its
   module's vGPU; a library kernel on the routed vGPU (looked up there the first time). */
CUresult hv_func_resolve(struct hv_func *f, int *device, uint64_t *handle);
/* A call about one function, on its vGPU, with its handle there as the first field. */
#define ABOUT_FUNCTION(f, q, call) ({ int dev_; uint64_t h_; \
    CUresult r_ = hv_func_resolve(f, &dev_, &h_); \
    if (!r_) { (q).function = h_; r_ = HV_ON(dev_, call); } r_; })
/* The same, for a function of the caller's file that takes (f, its handle there, ...). */
#define ON_FUNCTION(f, fn, ...) ({ int dev_; uint64_t h_; \
    CUresult r_ = hv_func_resolve(f, &dev_, &h_); \
    r_ ? r_ : HV_ON(dev_, fn(f, h_, __VA_ARGS__)); })
/* launches.c and occupancy.c: CUDA's launch configuration, as cuda.h lays it out. */
typedef struct {
    int id;
    char pad[4];
    char value[64];
} hv_launch_attribute; /* CUlaunchAttribute */
_Static_assert(sizeof(hv_launch_attribute) == HVGPU_LAUNCH_ATTR_SIZE, "cuda.h's layout");
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    hv_launch_attribute *attrs;
    unsigned nattrs;
} hv_launch_config; /* CUlaunchConfig */
/* stream.c: a stream was destroyed, which ends the capture it began on the executor. */
void hv_capture_stream_destroyed(CUstream stream);

/* pcopy.c: memcpy, on a few threads when n is large (the staged copies' guest side). */
void hv_copy(void *dst, const void *src, size_t n);
int hv_trace_enabled(void);
void hv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *hv_agent_address(void);
int hv_driver_version(void);              /* the host driver's, once connected */

/* region.c: the VM's region device (ivshmem BAR 2, mapped through sysfs). */
int hvgpu_region_find(const uint8_t token[HVGPU_REGION_TOKEN_SIZE], uint32_t device, void **base,
                      uint64_t *size);
const char *hvgpu_region_error(void);     /* why the last find failed, in a sentence */

/* state.c: what the guest side keeps (devices, contexts, allocations). */
extern int hv_device_count;
extern int hv_attrs[HV_MAX_DEVICES][HV_ATTR_COUNT + 1];
extern unsigned char hv_uuids[HV_MAX_DEVICES][HVGPU_UUID_SIZE];
struct hv_ctx *hv_primary(int device);
struct hv_ctx *hv_current(void);
struct hv_ctx *hv_current_or_primary(void); /* what a NULL context argument stands for */
void hv_alloc_add(CUdeviceptr ptr, size_t size, int is_global); /* on hv_routed_device() */
int hv_alloc_remove(CUdeviceptr ptr);      /* a cuMemAlloc range only */
/* Kinds of device range: what frees it, and what cuMemFree may not. */
enum { HV_RANGE_ALLOC = 0, HV_RANGE_GLOBAL = 1, HV_RANGE_MAPPED = 2, HV_RANGE_POOL = 4,
       HV_RANGE_IPC = 8 /* opened from another process's IPC handle (ipc.c) */,
       HV_RANGE_GRAPH = 16 /* an allocation node's address (graph_mem.c) */ };
void hv_range_add(CUdeviceptr ptr, size_t size, unsigned kind); /* on hv_routed_device() */
int hv_range_kind(CUdeviceptr ptr);        /* of the range holding ptr; -1: none */
int hv_range_remove(int device, CUdeviceptr ptr, unsigned kind);
void hv_ranges_drop(int device, CUdeviceptr ptr, size_t size, unsigned kind);
/* Freed pool blocks poolcache.c keeps, per vGPU: freed memory to the program, though
   still allocated on the executor, so the guest refuses copies into them itself. */
void hv_kept_add(int device, CUdeviceptr ptr, size_t size);
void hv_kept_remove(int device, CUdeviceptr ptr);
int hv_kept_touches(int device, CUdeviceptr ptr, size_t n); /* [ptr, ptr + n) meets one */
void hv_kept_forget(void);                 /* a forked child's: the parent's are not its */
/* Reserved address ranges (cuMemAddressReserve), per vGPU. */
void hv_reserve_add(int device, CUdeviceptr ptr, size_t size);
int hv_reserve_remove(int device, CUdeviceptr ptr);
int hv_reserve_owner(CUdeviceptr ptr);     /* the routed device's first; -1: none */
int hv_reserve_find(int device, CUdeviceptr ptr, uintptr_t *base, size_t *size);
int hv_alloc_find(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);
/* The device whose allocation holds ptr (the routed device's first: each vGPU's
   executor is its own process, so two devices' addresses may coincide), or -1. */
int hv_alloc_owner(CUdeviceptr ptr);
/* graph_mem.c: allocation nodes' addresses, per graph and instantiation (tagged keys). */
void hv_gm_alloc(void *graph, int device, CUdeviceptr ptr, size_t size);
void hv_gm_free(void *graph, CUdeviceptr ptr);
int hv_gm_has(void *key, int is_exec);      /* it allocates or frees */
void hv_gm_instantiated(void *graph, void *exec);
void hv_gm_launched(void *exec);
int hv_gm_freed(int device, CUdeviceptr ptr); /* freed outside a graph; 0: not graph memory */
void hv_gm_gone(void *key, int is_exec);
int hv_host_find(const void *ptr, void **base, size_t *size);
void hv_host_add(void *ptr, size_t size, unsigned flags);
int hv_host_remove(void *ptr);
unsigned hv_host_flags(const void *ptr);

/* poolcache.c: freed blocks of stream-ordered pools, kept for the next allocation of
   the same pool, size and stream. Pools are the executor's numbers (untagged), streams
   the program's values (tagged). */
size_t hv_pool_block_size(size_t size);    /* what the executor is asked for: rounded */
int hv_pool_take(int device, uint64_t pool, CUstream stream, size_t size, CUdeviceptr *ptr);
void hv_pool_track(int device, uint64_t pool, CUdeviceptr ptr, size_t size); /* allocated */
int hv_pool_keep(int device, CUdeviceptr ptr, CUstream stream); /* 0: free it for real */
/* Really free what the guest keeps of one pool (waiting until the frees have run,
   so that the driver can reuse or release the memory) or of one stream; the first
   error is returned (an earlier one-way frame's may surface here). */
CUresult hv_pool_release(int device, uint64_t pool, int *released);
CUresult hv_pool_release_stream(CUstream stream);
void hv_pool_set_threshold(int device, uint64_t pool, uint64_t threshold);
uint64_t hv_pool_used(int device, uint64_t pool, int high, uint64_t driver);
void hv_pool_reset_high(int device, uint64_t pool);
/* cuMemPoolDestroy: first closing (its kept blocks really freed, nothing kept or taken
   from now), then destroyed (ok) or open again (the executor refused). */
void hv_pool_closing(int device, uint64_t pool);
void hv_pool_destroyed(int device, uint64_t pool, int ok);
/* What a pool is besides: shared (exportable: its blocks are never kept, a freed one's
   export must be withdrawn by the executor at once) or imported from another process. */
enum { HV_POOL_SHARED = 1, HV_POOL_IMPORTED = 2 };
void hv_pool_mark(int device, uint64_t pool, unsigned marks);
unsigned hv_pool_marks(int device, uint64_t pool);
int hv_stats_enabled(void);               /* wire.c: HVGPU_SHIM_STATS is set */

/* region_lane.c: the region lane. Each returns 0 where it did nothing (the caller
   goes on as without a region), else 1 with the call's status in *r. Copies run on
   the routed vGPU; `wait`: the synchronous form (the copy has landed on return). */
int hv_region_host_alloc(void **pp, size_t size, unsigned flags, CUresult *r);
int hv_region_host_free(void *p, CUresult *r);
int hv_region_htod(CUdeviceptr dst, const void *src, size_t n, CUstream stream, int wait,
                CUresult *r);
int hv_region_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream stream, int wait, CUresult *r);
int hv_region_holds(const void *p, size_t n); /* [p, p + n) lies in one region allocation */
/* [p, p + n) lies in one region allocation: 1, *mapped whether the executor maps it at p,
   device-mapped (a kernel reaches it through p); else 0. */
int hv_region_device_map(const void *p, size_t n, int *mapped);
int hv_region_can_map(int device); /* the lane's pinned memory can be device-mapped */
#define HV_HOSTALLOC_DEVICEMAP 0x02u /* CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTREGISTER_DEVICEMAP */
/* ... of vGPU device's lane: 1 with its region and the offset of p there, else 0. */
int hv_region_locate(const void *p, size_t n, int device, uint32_t *region, uint64_t *offset);

/* Run one call on another vGPU's connection. */
#define HV_ON(device, call) ({ int hv_prev_ = hv_route(device); CUresult hv_r_ = (call); \
                               hv_route(hv_prev_); hv_r_; })

/* A call whose request is one u64 handle and whose reply has no fields, on `device`'s
   connection (destroys, synchronisations, queries). */
static inline CUresult hv_call_handle(int device, uint16_t op, uint64_t handle) {
    return HV_ON(device, hv_call(op, &handle, sizeof handle, NULL, 0, NULL, 0, NULL, NULL, 0));
}

/* Streams, events and modules handed to the program carry their vGPU in bits 48+
   (device 0's are the executor's handles unchanged); handles below HVGPU_FIRST_HANDLE
   are CUDA's special streams, which mean the current context's. */
#define HV_TAG_SHIFT 48
static inline void *hv_tag(int device, uint64_t handle) {
    return (void *)(uintptr_t)(handle | ((uint64_t)device << HV_TAG_SHIFT));
}
static inline uint64_t hv_untag(const void *v) {
    return (uint64_t)(uintptr_t)v & ((1ull << HV_TAG_SHIFT) - 1);
}
static inline int hv_created(const void *v) { /* not special */
    return hv_untag(v) >= HVGPU_FIRST_HANDLE;
}
static inline int hv_tag_device(const void *v) {
    return hv_created(v) ? (int)((uint64_t)(uintptr_t)v >> HV_TAG_SHIFT) : hv_routed_device();
}

/* Driver calls the shim's other parts use internally. */
CUresult cuInit(unsigned int flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceGetCount(int *count);
CUresult cuMemFree_v2(CUdeviceptr dptr);

/* device.c: CUDA_ERROR_INVALID_DEVICE (or the reason cuInit failed) unless dev is a
   vGPU of this guest. */
CUresult hv_check_device(CUdevice dev);

/* Unimplemented entry points: log the name once, return NOT_SUPPORTED. */
CUresult hv_unsupported(const char *api, int *once);
/* vmm.c: the vGPU a CUmemLocation names; CUDA_ERROR_NOT_SUPPORTED (hv_unsupported(api,
   once)) for host and NUMA locations, CUDA_ERROR_INVALID_DEVICE for no such vGPU. */
CUresult hv_device_location(const void *location, int *device, const char *api, int *once);
/* vmm.c: a shareable handle the program passes to its other processes, a sealed memfd
   holding `magic` (8 bytes: what it shares), the vGPU and the executor's token
   (HVGPU_IPC_HANDLE_SIZE bytes): the descriptor, or -1; and reading one back (0: read,
   -1: no descriptor of this shim with that magic, or for no vGPU of this VM). */
int hv_shareable_make(const char *magic, int device, const unsigned char *token);
int hv_shareable_read(const char *magic, int fd, int *device, unsigned char *token);

/* array.c: one side of a 2D or 3D copy (CUmemorytype's numbers: host, device, array,
   unified), as CUDA_MEMCPY2D/3D name it, and the copy (wait: the synchronous form). */
struct hv_copy_side {
    int type;
    const void *host;
    CUdeviceptr device;
    void *array;
    size_t x, y, z, pitch, height;
};
CUresult hv_copy3d(const struct hv_copy_side *src, const struct hv_copy_side *dst, size_t width,
                   size_t height, size_t depth, CUstream stream, int wait);
/* managed.c: managed memory (its docstring says how its bytes move). Before GPU work on
   a stream, the guest's changes reach the device; at a synchronisation point (of one
   stream, or of everything on the device), the device's come back. */
int hv_managed_any(void);
int hv_managed_find(CUdeviceptr p, CUdeviceptr *base, size_t *size);
CUresult hv_managed_before(int device, CUstream stream);
CUresult hv_managed_synced(int device, CUstream stream, int everything);
int hv_managed_free(CUdeviceptr ptr, CUresult *r);

#endif
