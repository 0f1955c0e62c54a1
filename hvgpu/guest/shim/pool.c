/* Driver entry points for stream-ordered allocation: cuMemAllocAsync,
 * cuMemFreeAsync and memory pools.
 *
 * The executor gives each connection a default pool of its own (never the
 * device's, which other programs share); cuDeviceSetMemPool's choice is kept
 * here. A freed block is kept in the guest for the next allocation of its
 * pool, size and stream while the pool's release threshold allows
 * (poolcache.c); otherwise an allocation is a round trip, since the program
 * needs the pointer at once, and a free is one-way, ordered on its stream, its
 * error reported by the next synchronising call as CUDA's asynchronous errors
 * are. Pool attributes are the executor's pools' own, but for what the guest
 * keeps: not in use to the program. Pools of host memory, of memory exportable
 * otherwise than as a POSIX file descriptor or with usage flags are refused
 * (CUDA_ERROR_NOT_SUPPORTED, said once), and a pool is reachable from its own vGPU
 * only: peer access between vGPUs is not built.
 *
 * A pool made exportable as a POSIX file descriptor is shared among the VM's
 * processes as VMM memory is (vmm.c): cuMemPoolExportToShareableHandle gives a
 * sealed memfd holding the executor's token for the pool, cuMemPoolExportPointer's
 * 64 bytes are the executor's token for one allocation, and another process of the
 * VM imports both on the same vGPU (hvgpu/host/executor/pools.py). None of a shared
 * pool's blocks is kept here: a free must reach the executor, which withdraws the
 * allocation's export. An imported allocation is a pool range like any other: the
 * importer copies to it and frees it (cuMemFree or cuMemFreeAsync).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "shim.h"

typedef void *CUmemoryPool;
typedef struct { int type, id; } hv_mem_location;           /* CUmemLocation */
typedef struct { hv_mem_location location; int flags; } hv_access_desc; /* CUmemAccessDesc */
typedef struct {                                             /* CUmemPoolProps */
    int alloc_type, handle_types;
    hv_mem_location location;
    void *win32_attributes;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} hv_pool_props;
_Static_assert(sizeof(hv_pool_props) == 88, "cuda.h layout");

typedef struct { unsigned char reserved[HVGPU_IPC_HANDLE_SIZE]; } hv_ptr_export; /* CUmemPoolPtrExportData */
_Static_assert(sizeof(hv_ptr_export) == 64, "cuda.h layout");

enum { POSIX_FD = 1 };
static const char SHAREABLE_MAGIC[8] = "hvgpuPOL"; /* a pool's, never a VMM handle's */

enum { PINNED = 1, ON_DEVICE = 1, READWRITE = 3, LAST_INT_ATTRIBUTE = 3, RELEASE_THRESHOLD = 4,
       USED_CURRENT = 7, USED_HIGH = 8, LAST_ATTRIBUTE = 8 };


static CUmemoryPool defaults[HV_MAX_DEVICES]; /* each vGPU's default pool, once asked */
static CUmemoryPool current[HV_MAX_DEVICES];  /* cuDeviceSetMemPool's; NULL: the default */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A forked child has a connection, so pools, of its own: the parent's numbers name
   nothing there, or another pool. */
static void forget_pools(void) {
    memset(defaults, 0, sizeof defaults);
    memset(current, 0, sizeof current);
}

static void watch_fork(void) { pthread_atfork(NULL, NULL, forget_pools); }

/* The vGPU a pool is of; -1 for what no call of this shim handed out. */
static int pool_device(CUmemoryPool pool) {
    uint64_t d = (uint64_t)(uintptr_t)pool >> HV_TAG_SHIFT;
    return pool && hv_created(pool) && cuInit(0) == CUDA_SUCCESS && d < (uint64_t)hv_device_count
        ? (int)d : -1;
}

static CUresult check_device(CUdevice dev) {
    CUresult r = cuInit(0);
    if (r) return r;
    return dev >= 0 && dev < hv_device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

HV_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_device(dev);
    if (r) return r;
    CUmemoryPool p = __atomic_load_n(&defaults[dev], __ATOMIC_ACQUIRE);
    if (!p) {
        hvgpu_mem_pool_default_rep_t v;
        r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_DEFAULT, NULL, 0, NULL, 0, &v, sizeof v, NULL,
                               NULL, 0));
        if (r) return r;
        p = hv_tag(dev, v.pool);
        pthread_once(&fork_once, watch_fork);
        __atomic_store_n(&defaults[dev], p, __ATOMIC_RELEASE);
    }
    *pool = p;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_device(dev);
    if (r) return r;
    CUmemoryPool p = __atomic_load_n(&current[dev], __ATOMIC_ACQUIRE);
    if (!p) return cuDeviceGetDefaultMemPool(pool, dev);
    *pool = p;
    return CUDA_SUCCESS;
}

/* What the guest keeps is kept per pool, not per device: a pool that stops being the
   current one keeps its blocks (within its threshold, as the driver's pool keeps its
   freed memory) for cuMemAllocFromPoolAsync or for when it is current again. */
HV_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult r = check_device(dev);
    if (r) return r;
    if (pool_device(pool) != dev) return CUDA_ERROR_INVALID_VALUE; /* not a pool of dev */
    if (hv_pool_marks(dev, hv_untag(pool)) & HV_POOL_IMPORTED)
        return CUDA_ERROR_INVALID_VALUE; /* CUDA: an imported pool allocates nothing */
    pthread_once(&fork_once, watch_fork);
    __atomic_store_n(&current[dev], pool, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

/* CUDA 13's forms, by location and allocation type: device pools only. */
static CUresult device_pools(const void *location, int type, int *dev) {
    static int managed, host;
    if (type != PINNED) return hv_unsupported("memory pools of managed memory", &managed);
    return hv_device_location(location, dev, "memory pools of host or NUMA memory", &host);
}

HV_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, void *location, int type) {
    int dev = -1;
    CUresult r = device_pools(location, type, &dev);
    return r ? r : cuDeviceGetDefaultMemPool(pool, dev);
}

HV_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, void *location, int type) {
    int dev = -1;
    CUresult r = device_pools(location, type, &dev);
    return r ? r : cuDeviceGetMemPool(pool, dev);
}

HV_EXPORT CUresult cuMemSetMemPool(void *location, int type, CUmemoryPool pool) {
    int dev = -1;
    CUresult r = device_pools(location, type, &dev);
    return r ? r : cuDeviceSetMemPool(dev, pool);
}

HV_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const hv_pool_props *props) {
    static int managed, host, exportable, usage;
    int dev = -1;
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    if (props->alloc_type != PINNED)
        return hv_unsupported("cuMemPoolCreate of managed memory", &managed);
    CUresult r = hv_device_location(&props->location, &dev, "cuMemPoolCreate of host or NUMA "
                                    "memory", &host);
    if (r) return r;
    if (props->handle_types & ~POSIX_FD)
        return hv_unsupported("cuMemPoolCreate of exportable memory (fabric or Win32 handles)",
                              &exportable);
    if (props->usage) return hv_unsupported("cuMemPoolCreate with usage flags", &usage);
    hvgpu_mem_pool_create_req_t q = { PINNED, (uint32_t)props->handle_types, ON_DEVICE, 0,
                                      props->max_size, 0 };
    hvgpu_mem_pool_create_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_CREATE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                           NULL, 0));
    if (r) return r;
    if (props->handle_types) hv_pool_mark(dev, v.pool, HV_POOL_SHARED);
    *pool = hv_tag(dev, v.pool);
    return CUDA_SUCCESS;
}

/* -- sharing among the VM's processes ------------------------------------------------ */

HV_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle, CUmemoryPool pool, int type,
                                                    unsigned long long flags) {
    int dev = pool_device(pool);
    if (!handle || dev < 0 || flags > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
    /* the executor refuses other types: no pool is made exportable otherwise */
    hvgpu_mem_pool_export_req_t q = { hv_untag(pool), (uint32_t)type, (uint32_t)flags };
    unsigned char rep[sizeof(hvgpu_mem_pool_export_rep_t) + HVGPU_IPC_HANDLE_SIZE];
    uint32_t n = 0;
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_EXPORT, &q, sizeof q, NULL, 0, rep,
                                    sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_mem_pool_export_rep_view_t v;
    if (hvgpu_mem_pool_export_rep_decode(rep, n, &v) || v.token.len != HVGPU_IPC_HANDLE_SIZE)
        return CUDA_ERROR_UNKNOWN;
    int fd = hv_shareable_make(SHAREABLE_MAGIC, dev, v.token.data);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle, int type,
                                                      unsigned long long flags) {
    static int other;
    if (!pool || flags > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (type != POSIX_FD)
        return hv_unsupported("cuMemPoolImportFromShareableHandle of other handle types than "
                              "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", &other);
    CUresult r = cuInit(0);
    if (r) return r;
    struct __attribute__((packed)) {
        hvgpu_mem_pool_import_req_t q;
        unsigned char token[HVGPU_IPC_HANDLE_SIZE];
    } body = { { (uint32_t)type, (uint32_t)flags, HVGPU_IPC_HANDLE_SIZE }, { 0 } };
    int dev = -1;
    if (hv_shareable_read(SHAREABLE_MAGIC, (int)(intptr_t)handle, &dev, body.token))
        return CUDA_ERROR_INVALID_VALUE; /* no pool's descriptor this shim made */
    hvgpu_mem_pool_import_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_IMPORT, &body, sizeof body, NULL, 0, &v, sizeof v,
                           NULL, NULL, 0));
    if (r) return r;
    hv_pool_mark(dev, v.pool, HV_POOL_SHARED | HV_POOL_IMPORTED);
    pthread_once(&fork_once, watch_fork);
    *pool = hv_tag(dev, v.pool);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemPoolExportPointer(hv_ptr_export *out, CUdeviceptr ptr) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    int dev = hv_alloc_owner(ptr);
    if (dev < 0 || hv_range_kind(ptr) != HV_RANGE_POOL)
        return CUDA_ERROR_INVALID_VALUE; /* no pool allocation of this process (or freed) */
    hvgpu_mem_pool_export_pointer_req_t q = { ptr };
    unsigned char rep[sizeof(hvgpu_mem_pool_export_pointer_rep_t) + HVGPU_IPC_HANDLE_SIZE];
    uint32_t n = 0;
    r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_EXPORT_POINTER, &q, sizeof q, NULL, 0, rep,
                           sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_mem_pool_export_pointer_rep_view_t v;
    if (hvgpu_mem_pool_export_pointer_rep_decode(rep, n, &v)
            || v.token.len != HVGPU_IPC_HANDLE_SIZE)
        return CUDA_ERROR_UNKNOWN;
    memcpy(out->reserved, v.token.data, sizeof out->reserved);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr, CUmemoryPool pool,
                                          const hv_ptr_export *data) {
    int dev = pool_device(pool);
    if (!ptr || !data || dev < 0) return CUDA_ERROR_INVALID_VALUE;
    struct __attribute__((packed)) {
        hvgpu_mem_pool_import_pointer_req_t q;
        hv_ptr_export token;
    } body = { { hv_untag(pool), HVGPU_IPC_HANDLE_SIZE }, *data };
    hvgpu_mem_pool_import_pointer_rep_t v;
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_IMPORT_POINTER, &body, sizeof body, NULL, 0,
                                    &v, sizeof v, NULL, NULL, 0));
    if (r) return r;
    HV_ON(dev, (hv_range_add(v.dptr, v.size, HV_RANGE_POOL), CUDA_SUCCESS));
    *ptr = v.dptr;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    int dev = pool_device(pool);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mem_pool_destroy_req_t q = { hv_untag(pool) };
    hv_pool_closing(dev, q.pool); /* else the executor keeps it for the blocks kept here */
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_DESTROY, &q, sizeof q, NULL, 0, NULL, 0,
                                    NULL, NULL, 0));
    hv_pool_destroyed(dev, q.pool, !r);
    if (!r) /* as CUDA: the device's current pool becomes its default again */
        __atomic_compare_exchange_n(&current[dev], &pool, NULL, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    return r;
}

HV_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    int dev = pool_device(pool);
    if (dev < 0 || !value || attr < 1 || attr > LAST_ATTRIBUTE) return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = attr <= LAST_INT_ATTRIBUTE ? (uint64_t)(uint32_t)*(int *)value
                                            : *(uint64_t *)value;
    hvgpu_mem_pool_set_attribute_req_t q = { hv_untag(pool), attr, v };
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_SET_ATTRIBUTE, &q, sizeof q, NULL, 0,
                                    NULL, 0, NULL, NULL, 0));
    if (!r && attr == RELEASE_THRESHOLD) hv_pool_set_threshold(dev, q.pool, v);
    if (!r && attr == USED_HIGH) hv_pool_reset_high(dev, q.pool);
    return r;
}

HV_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    int dev = pool_device(pool);
    if (dev < 0 || !value || attr < 1 || attr > LAST_ATTRIBUTE) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mem_pool_get_attribute_req_t q = { hv_untag(pool), attr };
    hvgpu_mem_pool_get_attribute_rep_t v;
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_GET_ATTRIBUTE, &q, sizeof q, NULL, 0, &v,
                                    sizeof v, NULL, NULL, 0));
    if (r) return r;
    if (attr == USED_CURRENT || attr == USED_HIGH)
        v.value = hv_pool_used(dev, q.pool, attr == USED_HIGH, v.value);
    if (attr <= LAST_INT_ATTRIBUTE) *(int *)value = (int)v.value;
    else *(uint64_t *)value = v.value;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    int dev = pool_device(pool);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mem_pool_trim_to_req_t q = { hv_untag(pool), keep };
    /* What the guest keeps is freed memory the driver would trim: freed for real, and
       waited for, since the driver trims only frees it has seen done. */
    CUresult first = hv_pool_release(dev, q.pool, NULL);
    CUresult r = HV_ON(dev, hv_call(HVGPU_OP_MEM_POOL_TRIM_TO, &q, sizeof q, NULL, 0, NULL, 0,
                                    NULL, NULL, 0));
    return first ? first : r;
}

HV_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const hv_access_desc *map, size_t count) {
    static int host, peers;
    int dev = pool_device(pool);
    if (dev < 0 || (count && !map)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        int on = -1;
        CUresult r = hv_device_location(&map[i].location, &on,
                                        "cuMemPoolSetAccess for host or NUMA locations", &host);
        if (r) return r;
        if (on != dev)
            return hv_unsupported("cuMemPoolSetAccess for another vGPU (peer access between "
                                  "vGPUs)", &peers);
        if (map[i].flags != READWRITE) return CUDA_ERROR_INVALID_VALUE; /* its own device's */
    }
    return CUDA_SUCCESS; /* the pool's device reads and writes it already */
}

HV_EXPORT CUresult cuMemPoolGetAccess(int *flags, CUmemoryPool pool, hv_mem_location *location) {
    static int host;
    int dev = pool_device(pool), on = -1;
    if (!flags || dev < 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_device_location(location, &on, "cuMemPoolGetAccess for host or NUMA "
                                                   "locations", &host);
    if (!r) *flags = on == dev ? READWRITE : 0;
    return r;
}

/* -- allocations -------------------------------------------------------------------- */

HV_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                             void **graph, const void **deps,
                                             const void **edges, size_t *ndeps); /* graph.c */

/* The graph `stream` is capturing into (tagged), in *graph; 0 when it captures none. */
static CUresult capture_graph(CUstream stream, void **graph) {
    int status = 0;
    unsigned long long id;
    *graph = NULL;
    if (!hv_capture_active()) return CUDA_SUCCESS;
    CUresult r = cuStreamGetCaptureInfo_v3(stream, &status, &id, graph, NULL, NULL, NULL);
    if (!r && status != 1) *graph = NULL;
    return r;
}

static CUresult alloc_on(int dev, CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                         CUstream stream) {
    static int once;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (hv_created(stream) && hv_tag_device(stream) != dev)
        return hv_unsupported("cuMemAllocAsync from one vGPU's pool on another's stream", &once);
    CUresult r = pool ? CUDA_SUCCESS : cuDeviceGetDefaultMemPool(&pool, dev); /* asked once */
    if (r) return r;
    void *graph;
    r = capture_graph(stream, &graph);
    if (r) return r;
    if (graph) { /* an allocation node of the capture's graph: graph memory (graph_mem.c) */
        hvgpu_mem_alloc_async_req_t q = { size, hv_untag(pool), hv_untag(stream) };
        hvgpu_mem_alloc_async_rep_t v;
        r = HV_ON(dev, hv_call(HVGPU_OP_MEM_ALLOC_ASYNC, &q, sizeof q, NULL, 0, &v, sizeof v,
                               NULL, NULL, 0));
        if (r) return r;
        hv_gm_alloc(graph, dev, v.dptr, size);
        *dptr = v.dptr;
        return CUDA_SUCCESS;
    }
    size_t n = hv_pool_block_size(size);
    CUdeviceptr ptr;
    /* not while capturing: the executor judges an allocation on a capturing stream */
    if (size && !hv_capture_active() && hv_pool_take(dev, hv_untag(pool), stream, n, &ptr)) {
        HV_ON(dev, (hv_range_add(ptr, size, HV_RANGE_POOL), CUDA_SUCCESS));
        *dptr = ptr;
        return CUDA_SUCCESS;
    }
    hvgpu_mem_alloc_async_req_t q = { n, hv_untag(pool), hv_untag(stream) };
    hvgpu_mem_alloc_async_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_MEM_ALLOC_ASYNC, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                           NULL, 0));
    int released = 0;
    if (r == CUDA_ERROR_OUT_OF_MEMORY) { /* what the guest keeps of the pool may be enough */
        CUresult e = hv_pool_release(dev, q.pool, &released);
        if (e) return e;
        if (released)
            r = HV_ON(dev, hv_call(HVGPU_OP_MEM_ALLOC_ASYNC, &q, sizeof q, NULL, 0, &v, sizeof v,
                                   NULL, NULL, 0));
    }
    if (r) return r;
    hv_pool_track(dev, q.pool, v.dptr, n);
    HV_ON(dev, (hv_range_add(v.dptr, size, HV_RANGE_POOL), CUDA_SUCCESS));
    *dptr = v.dptr;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                           CUstream stream) {
    int dev = pool_device(pool);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_on(dev, dptr, size, pool, stream);
}

HV_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream) {
    CUresult r = cuInit(0);
    if (r) return r;
    int dev = hv_tag_device(stream);
    CUmemoryPool pool = __atomic_load_n(&current[dev], __ATOMIC_ACQUIRE);
    return alloc_on(dev, dptr, size, pool /* NULL: the default */, stream);
}

HV_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    CUresult r = cuInit(0);
    if (r) return r;
    int kind = hv_range_kind(dptr), dev = hv_alloc_owner(dptr);
    if (kind == HV_RANGE_GRAPH) { /* a free node in a capture, or freed on its stream */
        void *graph;
        r = capture_graph(stream, &graph);
        if (r) return r;
        hvgpu_mem_free_async_req_t q = { dptr, hv_untag(stream) };
        r = HV_ON(dev, hv_oneway(HVGPU_OP_MEM_FREE_ASYNC, &q, sizeof q, NULL, 0));
        if (!r && graph) hv_gm_free(graph, dptr);
        else if (!r) hv_gm_freed(dev, dptr);
        return r;
    }
    if (kind == HV_RANGE_ALLOC) { /* cuMemAlloc's memory: freed once the stream is there */
        r = cuStreamSynchronize(stream);
        return r ? r : cuMemFree_v2(dptr);
    }
    if (kind != HV_RANGE_POOL || !HV_ON(dev, hv_range_remove(dev, dptr, HV_RANGE_POOL)))
        return CUDA_ERROR_INVALID_VALUE;
    if (hv_created(stream) && hv_tag_device(stream) != dev) { /* in this process, then */
        r = cuStreamSynchronize(stream);
        if (r) return r;
        stream = NULL;
    }
    if (!hv_capture_active() && hv_pool_keep(dev, dptr, stream)) return CUDA_SUCCESS; /* for the next allocation */
    hvgpu_mem_free_async_req_t q = { dptr, hv_untag(stream) };
    return HV_ON(dev, hv_oneway(HVGPU_OP_MEM_FREE_ASYNC, &q, sizeof q, NULL, 0));
}

/* cuMemFree of a pool allocation: freed in the legacy stream's order, and waited for. */
CUresult hv_pool_free_now(CUdeviceptr dptr) {
    int dev = hv_alloc_owner(dptr);
    CUresult r = HV_ON(dev, cuMemFreeAsync(dptr, NULL));
    return r ? r : HV_ON(dev, cuStreamSynchronize(NULL));
}
