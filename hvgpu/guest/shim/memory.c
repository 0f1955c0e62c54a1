/* Driver entry points for device and host memory and copies.
 *
 * Device memory lives in the executor's context: allocations and frees are
 * calls; host-to-device copies and memsets are one-way frames (the bytes are
 * taken from the program before the call returns, as CUDA's pageable copies
 * do); device-to-host copies wait for their bytes, so the Async forms finish
 * before returning (stronger than CUDA promises, never weaker).
 *
 * Where the agent offers a region (region_lane.c), pinned host memory
 * (cuMemHostAlloc) lies in it: copies from and to it carry offsets, not bytes, and
 * are asynchronous as CUDA's are; large pageable copies are staged through it. The
 * executor maps it at the program's own address, device-mapped, so a kernel reaches
 * it through the program's pointer, which is its device pointer too
 * (cuMemHostGetDevicePointer), as under unified addressing.
 * Elsewhere pinned memory is ordinary guest memory and the bytes travel on the
 * socket. Memory the program registers (cuMemHostRegister) is its own and stays
 * pageable to the host: the executor cannot see it, so registering it device-mapped
 * is refused (CUDA_ERROR_NOT_SUPPORTED) rather than handing out a pointer that faults.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define CHUNK (HVGPU_MAX_PAYLOAD)

HV_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    hvgpu_mem_get_info_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MEM_GET_INFO, NULL, 0, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    if (free_bytes) *free_bytes = (size_t)v.free;
    if (total) *total = (size_t)v.total;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    if (!dptr || !size) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mem_alloc_req_t q = { size };
    hvgpu_mem_alloc_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MEM_ALLOC, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    *dptr = v.dptr;
    hv_alloc_add(v.dptr, size, 0);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                      size_t height, unsigned elem) {
    if (!pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    /* What the driver itself picks: on the H200 (driver 580) a 300-byte row gets a
     * 512-byte pitch, while CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT says 32. */
    size_t p = (width + 511) & ~(size_t)511;
    CUresult r = cuMemAlloc_v2(dptr, p * height);
    if (!r) *pitch = p;
    return r;
}

CUresult hv_pool_free_now(CUdeviceptr dptr); /* pool.c */

HV_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (!dptr) return CUDA_SUCCESS;
    if (hv_range_kind(dptr) == HV_RANGE_POOL) return hv_pool_free_now(dptr);
    if (hv_range_kind(dptr) == HV_RANGE_GRAPH) { /* a graph's allocation, freed outside it */
        int device = hv_alloc_owner(dptr);
        hvgpu_mem_free_req_t q = { dptr };
        CUresult r = HV_ON(device, hv_call(HVGPU_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, 0,
                                           NULL, NULL, 0));
        if (!r) hv_gm_freed(device, dptr);
        return r;
    }
    CUresult managed;
    if (hv_managed_free(dptr, &managed)) return managed;
    int device = hv_alloc_owner(dptr);
    if (device < 0 || !HV_ON(device, hv_alloc_remove(dptr))) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mem_free_req_t q = { dptr };
    return HV_ON(device, hv_call(HVGPU_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0));
}

HV_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
    CUdeviceptr b;
    size_t s;
    if (!hv_alloc_find(dptr, &b, &s)) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = b;
    if (size) *size = s;
    return CUDA_SUCCESS;
}

/* -- host memory ------------------------------------------------------------ */

HV_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags) {
    if (!pp || !size) return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    if (hv_region_host_alloc(pp, size, flags, &r)) return r;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    hv_host_add(p, size, flags);
    *pp = p;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }

HV_EXPORT CUresult cuMemFreeHost(void *p) {
    CUresult r;
    if (hv_region_host_free(p, &r)) return r;
    if (!hv_host_remove(p)) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemHostGetFlags(unsigned *flags, void *p) {
    if (!flags || !hv_host_find(p, NULL, NULL)) return CUDA_ERROR_INVALID_VALUE;
    *flags = hv_host_flags(p);
    return CUDA_SUCCESS;
}

/* The device address of pinned memory at p: p itself where the executor maps it at p
   (region_lane.c); CUDA_ERROR_NOT_SUPPORTED, said once, where it is page-locked
   memory the device cannot reach. */
static CUresult device_pointer(const void *p, CUdeviceptr *d) {
    static int unmapped_once, registered_once;
    int mapped = 0;
    if (hv_region_device_map(p, 1, &mapped)) {
        if (!mapped)
            return hv_unsupported("the device pointer of pinned memory the executor could not "
                                  "map at the program's address (HVGPU_SHIM_TRACE says why)",
                                  &unmapped_once);
        *d = (CUdeviceptr)(uintptr_t)p;
        return CUDA_SUCCESS;
    }
    return hv_unsupported("the device pointer of page-locked memory outside a region "
                          "(registered memory, or an agent that offers no region)",
                          &registered_once);
}

HV_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pd, void *p, unsigned flags) {
    if (!pd || flags || !hv_host_find(p, NULL, NULL)) return CUDA_ERROR_INVALID_VALUE;
    return device_pointer(p, pd);
}

HV_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    static int devicemap_once;
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    if (hv_host_find(p, NULL, NULL) ||
        hv_host_find((const char *)p + size - 1, NULL, NULL)) /* as the driver: pinned once */
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    /* The program's own pages: the executor cannot map them, and they cannot be moved
       into a region (the program owns them, and its other threads may be writing them). */
    if (flags & HV_HOSTALLOC_DEVICEMAP)
        return hv_unsupported("cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP (a kernel "
                              "cannot reach the program's own pages; cuMemHostAlloc memory "
                              "it can)", &devicemap_once);
    hv_host_add(p, size, flags | 0x40000000u); /* registered, not ours to free */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemHostUnregister(void *p) {
    return hv_host_remove(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* -- CU_POINTER_ATTRIBUTE_SYNC_MEMOPS -------------------------------------------
 *
 * Allocations whose synchronous copies must have landed when the call returns: the shim
 * waits for the copy's stream after a synchronous copy into one (its one-way frames would
 * otherwise let the call return first). A few are kept; a program sets it on a handful. */
#define SYNC_MEMOPS_MAX 64
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;
static CUdeviceptr sync_bases[SYNC_MEMOPS_MAX];
static int sync_count;

static int sync_memops(CUdeviceptr ptr) {
    if (!__atomic_load_n(&sync_count, __ATOMIC_ACQUIRE)) return 0;
    CUdeviceptr base;
    if (!hv_alloc_find(ptr, &base, NULL)) return 0;
    pthread_mutex_lock(&sync_lock);
    int found = 0;
    for (int i = 0; i < sync_count && !found; i++) found = sync_bases[i] == base;
    pthread_mutex_unlock(&sync_lock);
    return found;
}

/* -- copies ------------------------------------------------------------------ */

/* Which vGPU a copy or memset runs on: its stream's, else the device pointer's owner,
   else the current context's. */
static int device_for(CUstream stream, CUdeviceptr ptr) {
    if (hv_created(stream)) return hv_tag_device(stream);
    int owner = hv_alloc_owner(ptr);
    return owner >= 0 ? owner : hv_routed_device();
}

/* Page-locked host memory of this program (cuMemHostAlloc, cuMemHostRegister) that
   holds [ptr, ptr + n): with unified addressing a program may hand it to calls that take
   device pointers, and CUDA then reads or writes the host bytes. */
static int host_span(CUdeviceptr ptr, size_t n) {
    void *base;
    size_t size;
    return !hv_alloc_find(ptr, NULL, NULL) && hv_host_find((void *)(uintptr_t)ptr, &base, &size) &&
           ptr - (uintptr_t)base <= size && n <= size - (ptr - (uintptr_t)base);
}

static CUresult htod_on(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
    const char *p = src;
    while (n) {
        size_t k = n < CHUNK ? n : CHUNK;
        hvgpu_memcpy_htod_req_t q = { dst, hv_untag(stream) };
        CUresult r = hv_oneway(HVGPU_OP_MEMCPY_HTOD, &q, sizeof q, p, k);
        if (r) return r;
        dst += k; p += k; n -= k;
    }
    return CUDA_SUCCESS;
}

/* Both sides in this process's memory: copied here after the stream's earlier work. */
static CUresult host_copy(void *dst, const void *src, size_t n, CUstream stream) {
    CUresult r = cuStreamSynchronize(stream);
    if (!r) memmove(dst, src, n);
    return r;
}

/* A pool block the guest keeps for reuse (poolcache.c) is freed memory to the program,
   though still allocated on the executor, which would take the copy: refused here. */
static int kept(int device, CUdeviceptr ptr, size_t n) { return hv_kept_touches(device, ptr, n); }

/* On the routed vGPU: through the region where it takes the copy. */
static CUresult htod_routed(CUdeviceptr dst, const void *src, size_t n, CUstream stream,
                            int wait) {
    CUresult r;
    if (hv_capture_active() && !hv_region_holds(src, n) &&
        hv_capture_copy(dst, (void *)src, n, 0, stream, &r))
        return r;
    if (hv_region_htod(dst, src, n, stream, wait, &r)) return r;
    return htod_on(dst, src, n, stream);
}

/* wait: the synchronous form (cuMemcpyHtoD), which matters for pinned sources only:
   a pageable source's bytes are taken before the call returns either way. */
static CUresult htod(CUdeviceptr dst, const void *src, size_t n, CUstream stream, int wait) {
    if (!n) return CUDA_SUCCESS;
    if (!src) return CUDA_ERROR_INVALID_VALUE;
    if (host_span(dst, n)) return host_copy((void *)(uintptr_t)dst, src, n, stream);
    int device = device_for(stream, dst);
    if (kept(device, dst, n)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_managed_before(device, stream);
    if (!r) r = HV_ON(device, htod_routed(dst, src, n, stream, wait));
    if (!r && wait && sync_memops(dst)) r = HV_ON(device, cuStreamSynchronize(stream));
    return r || !wait ? r : hv_managed_synced(device, stream, 0);
}

static CUresult dtoh_on(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
    char *p = dst;
    while (n) {
        size_t k = n < CHUNK ? n : CHUNK;
        hvgpu_memcpy_dtoh_req_t q = { src, k, hv_untag(stream) };
        CUresult r = hv_call(HVGPU_OP_MEMCPY_DTOH, &q, sizeof q, NULL, 0, NULL, 0, NULL, p, k);
        if (r) return r;
        src += k; p += k; n -= k;
    }
    return CUDA_SUCCESS;
}

static CUresult dtoh_routed(void *dst, CUdeviceptr src, size_t n, CUstream stream, int wait) {
    CUresult r;
    if (hv_capture_active() && !hv_region_holds(dst, n) &&
        hv_capture_copy(src, dst, n, 1, stream, &r))
        return r;
    if (hv_region_dtoh(dst, src, n, stream, wait, &r)) return r;
    return dtoh_on(dst, src, n, stream);
}

/* wait: the synchronous form (cuMemcpyDtoH). Into pinned memory the Async form returns
   at once; into pageable memory both wait for the bytes. */
static CUresult dtoh(void *dst, CUdeviceptr src, size_t n, CUstream stream, int wait) {
    if (!n) return CUDA_SUCCESS;
    if (!dst) return CUDA_ERROR_INVALID_VALUE;
    if (host_span(src, n)) return host_copy(dst, (const void *)(uintptr_t)src, n, stream);
    int device = device_for(stream, src);
    if (kept(device, src, n)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_managed_before(device, stream);
    if (!r) r = HV_ON(device, dtoh_routed(dst, src, n, stream, wait));
    return r || !wait ? r : hv_managed_synced(device, stream, 0);
}

/* Between two vGPUs: their executors are separate processes, so the bytes come
   through this process, a chunk at a time (the read waits for the source's work). */
static CUresult peer(CUdeviceptr dst, int dst_dev, CUdeviceptr src, int src_dev, size_t n,
                     CUstream stream) {
    size_t cap = n < CHUNK ? n : CHUNK;
    char *buf = malloc(cap);
    if (!buf) return CUDA_ERROR_OUT_OF_MEMORY;
    CUstream on_dst = hv_created(stream) && hv_tag_device(stream) == dst_dev ? stream : NULL;
    CUresult r = CUDA_SUCCESS;
    for (size_t done = 0; done < n && !r; done += cap) {
        size_t k = n - done < cap ? n - done : cap;
        r = HV_ON(src_dev, dtoh_on(buf, src + done, k, NULL));
        if (!r) r = HV_ON(dst_dev, htod_on(dst + done, buf, k, on_dst));
    }
    if (!r) r = HV_ON(dst_dev, hv_flush()); /* start it now, not at the next call */
    free(buf);
    return r;
}

static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, int wait) {
    if (!n) return CUDA_SUCCESS;
    if (host_span(dst, n) || host_span(src, n)) { /* a "device" side is host memory */
        if (!host_span(src, n)) return dtoh((void *)(uintptr_t)dst, src, n, stream, wait);
        if (!host_span(dst, n)) return htod(dst, (const void *)(uintptr_t)src, n, stream, wait);
        return host_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, stream);
    }
    int dst_dev = hv_alloc_owner(dst), src_dev = hv_alloc_owner(src);
    if (dst_dev >= 0 && src_dev >= 0 && dst_dev != src_dev)
        return peer(dst, dst_dev, src, src_dev, n, stream);
    int device = device_for(stream, dst);
    if (kept(device, dst, n) || kept(device, src, n)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_managed_before(device, stream);
    if (r) return r;
    hvgpu_memcpy_dtod_req_t q = { dst, src, n, hv_untag(stream) };
    r = HV_ON(device, hv_oneway(HVGPU_OP_MEMCPY_DTOD, &q, sizeof q, NULL, 0));
    if (!r && wait && (sync_memops(dst) || sync_memops(src)))
        r = HV_ON(device, cuStreamSynchronize(stream));
    return r;
}

HV_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return htod(dst, src, n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return htod(dst, src, n, s, 0);
}
HV_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    return dtoh(dst, src, n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return dtoh(dst, src, n, s, 0);
}
HV_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return dtod(dst, src, n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return dtod(dst, src, n, s, 0);
}

/* Unified addressing: the direction follows from which side owns each pointer. */
static CUresult any_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, int wait) {
    int dst_dev = hv_alloc_find(dst, NULL, NULL), src_dev = hv_alloc_find(src, NULL, NULL);
    if (dst_dev && src_dev) return dtod(dst, src, n, stream, wait);
    if (dst_dev) return htod(dst, (const void *)(uintptr_t)src, n, stream, wait);
    if (src_dev) return dtoh((void *)(uintptr_t)dst, src, n, stream, wait);
    CUresult r = cuStreamSynchronize(stream); /* host to host, in stream order */
    if (!r && n) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return r;
}

/* One copy of a batch (array.c): wait, the synchronous form, where its source must have
   been read when the call returns. */
CUresult hv_batch_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, int wait) {
    CUresult r = any_copy(dst, src, n, stream, wait);
    return r || !wait ? r : cuStreamSynchronize(stream);
}

HV_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return any_copy(dst, src, n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    return any_copy(dst, src, n, s, 0);
}
static CUresult copy_peer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                          size_t n, CUstream s) {
    if (!dctx || !sctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (!n) return CUDA_SUCCESS;
    if (dctx->device != sctx->device) return peer(dst, dctx->device, src, sctx->device, n, s);
    if (kept(dctx->device, dst, n) || kept(dctx->device, src, n)) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_memcpy_dtod_req_t q = { dst, src, n, hv_untag(s) };
    return HV_ON(dctx->device, hv_oneway(HVGPU_OP_MEMCPY_DTOD, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                                size_t n) {
    return copy_peer(dst, dctx, src, sctx, n, NULL);
}
HV_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src,
                                     CUcontext sctx, size_t n, CUstream s) {
    return copy_peer(dst, dctx, src, sctx, n, s);
}

/* -- memset ------------------------------------------------------------------ */

static CUresult memset_(CUdeviceptr dst, uint32_t value, uint32_t width, size_t count, CUstream s) {
    if (!count) return CUDA_SUCCESS;
    if (count <= SIZE_MAX / width && host_span(dst, count * width)) {
        /* Page-locked host memory: set here, after the stream's earlier work (which may
           read it), as the GPU would have in stream order. */
        CUresult r = cuStreamSynchronize(s);
        if (r) return r;
        unsigned char *p = (unsigned char *)(uintptr_t)dst;
        if (width == 1) {
            memset(p, (int)value, count);
        } else {
            for (size_t i = 0; i < count; i++) memcpy(p + i * width, &value, width);
        }
        return CUDA_SUCCESS;
    }
    if (hv_trace_enabled() && !hv_alloc_find(dst, NULL, NULL))
        hv_log("cuMemsetD%u: 0x%llx is no allocation this program made through the shim",
               width * 8, (unsigned long long)dst);
    int device = device_for(s, dst);
    if (kept(device, dst, count > SIZE_MAX / width ? SIZE_MAX : count * width))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_managed_before(device, s);
    if (r) return r;
    hvgpu_memset_req_t q = { dst, count, value, width, hv_untag(s) };
    return HV_ON(device, hv_oneway(HVGPU_OP_MEMSET, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return memset_(d, v, 1, n, NULL); }
HV_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return memset_(d, v, 2, n, NULL); }
HV_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return memset_(d, v, 4, n, NULL); }
HV_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return memset_(d, v, 1, n, s); }
HV_EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { return memset_(d, v, 2, n, s); }
HV_EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { return memset_(d, v, 4, n, s); }

/* -- pointer attributes ------------------------------------------------------- */

enum { PA_CONTEXT = 1, PA_MEMORY_TYPE, PA_DEVICE_POINTER, PA_HOST_POINTER, PA_P2P_TOKENS,
       PA_SYNC_MEMOPS, PA_BUFFER_ID, PA_IS_MANAGED, PA_DEVICE_ORDINAL,
       PA_IS_LEGACY_CUDA_IPC_CAPABLE, PA_RANGE_START_ADDR, PA_RANGE_SIZE, PA_MAPPED,
       PA_ALLOWED_HANDLE_TYPES, PA_IS_GPU_DIRECT_RDMA_CAPABLE, PA_ACCESS_FLAGS,
       PA_MEMPOOL_HANDLE, PA_MAPPING_SIZE, PA_MAPPING_BASE_ADDR, PA_MEMORY_BLOCK_ID };

static CUresult attribute(void *data, int attrib, CUdeviceptr ptr, int lenient) {
    CUdeviceptr dbase = 0;
    size_t size = 0;
    void *hbase = NULL;
    int is_dev = hv_alloc_find(ptr, &dbase, &size), owner = is_dev ? hv_alloc_owner(ptr) : 0;
    int is_host = !is_dev && hv_host_find((void *)(uintptr_t)ptr, &hbase, &size);
    if (!is_dev && !is_host && !lenient) return CUDA_ERROR_INVALID_VALUE;
    /* Mapped memory's range is the reservation it lies in; its mapping, the piece one
       cuMemMap made (cuMemGetAddressRange's answer). */
    CUdeviceptr rbase = is_dev ? dbase : (uintptr_t)hbase;
    size_t rsize = size;
    if (is_dev && hv_range_kind(ptr) == HV_RANGE_MAPPED) {
        uintptr_t b;
        if (hv_reserve_find(owner, ptr, &b, &rsize)) rbase = b;
    }
    switch (attrib) {
    case PA_CONTEXT: *(CUcontext *)data = (is_dev || is_host) ? hv_primary(owner) : NULL; break;
    case PA_MEMORY_TYPE: *(unsigned *)data = is_dev ? 2 : is_host ? 1 : 0; break;
    case PA_DEVICE_POINTER: { /* pinned memory: where the device maps it (its own address) */
        CUdeviceptr d = ptr;
        int mapped = 0;
        if (!is_dev && !(is_host && hv_region_device_map((const void *)(uintptr_t)ptr, 1, &mapped) &&
                         mapped))
            return lenient ? (*(CUdeviceptr *)data = 0, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = d; break;
    }
    case PA_HOST_POINTER:
        if (!is_host) return lenient ? (*(void **)data = NULL, CUDA_SUCCESS) : CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr; break;
    case PA_SYNC_MEMOPS: *(unsigned char *)data = (unsigned char)(is_dev && sync_memops(ptr)); break;
    case PA_IS_LEGACY_CUDA_IPC_CAPABLE: case PA_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(unsigned char *)data = 0; break;
    /* Four bytes: cudaPointerGetAttributes hands a slot of that size, uninitialised, and
       reads it whole (cudaMallocHost memory came back as managed with one byte set). */
    case PA_IS_MANAGED: *(unsigned *)data = is_dev && hv_managed_find(ptr, NULL, NULL); break;
    case PA_MAPPED: *(unsigned char *)data = (unsigned char)(is_dev || is_host); break;
    case PA_BUFFER_ID: *(unsigned long long *)data = is_dev ? dbase : (uintptr_t)hbase; break;
    case PA_DEVICE_ORDINAL: *(int *)data = (is_dev || is_host) ? owner : -2; break;
    case PA_RANGE_START_ADDR: *(CUdeviceptr *)data = rbase; break;
    case PA_RANGE_SIZE: *(size_t *)data = rsize; break;
    case PA_MAPPING_BASE_ADDR: *(CUdeviceptr *)data = is_dev ? dbase : (uintptr_t)hbase; break;
    case PA_MAPPING_SIZE: *(size_t *)data = size; break;
    case PA_ALLOWED_HANDLE_TYPES: *(unsigned long long *)data = 0; break;
    case PA_ACCESS_FLAGS: *(unsigned *)data = 3; break; /* read-write */
    case PA_MEMPOOL_HANDLE: *(void **)data = NULL; break;
    case PA_MEMORY_BLOCK_ID: *(unsigned long long *)data = is_dev ? dbase : 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuPointerGetAttribute(void *data, int attrib, CUdeviceptr ptr) {
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    return attribute(data, attrib, ptr, 0);
}

HV_EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attribs, void **data, CUdeviceptr ptr) {
    if (!attribs || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        if (!data[i]) continue;
        CUresult r = attribute(data[i], attribs[i], ptr, 1);
        if (r) return r;
    }
    return CUDA_SUCCESS;
}

/* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS alone can be set (cuda.h), on device memory of the
   program's: set, the synchronous copies pending on its device are waited for first. */
HV_EXPORT CUresult cuPointerSetAttribute(const void *value, int attrib, CUdeviceptr ptr) {
    if (!value || attrib != PA_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr base;
    if (!hv_alloc_find(ptr, &base, NULL)) return CUDA_ERROR_INVALID_VALUE;
    unsigned on;
    memcpy(&on, value, sizeof on);
    int device = hv_alloc_owner(ptr);
    CUresult r = on ? HV_ON(device, cuStreamSynchronize(NULL)) : CUDA_SUCCESS;
    if (r) return r;
    pthread_mutex_lock(&sync_lock);
    int at = -1;
    for (int i = 0; i < sync_count && at < 0; i++) if (sync_bases[i] == base) at = i;
    if (on && at < 0) {
        if (sync_count == SYNC_MEMOPS_MAX) r = CUDA_ERROR_OUT_OF_MEMORY;
        else sync_bases[__atomic_add_fetch(&sync_count, 1, __ATOMIC_RELEASE) - 1] = base;
    } else if (!on && at >= 0) {
        sync_bases[at] = sync_bases[sync_count - 1];
        __atomic_sub_fetch(&sync_count, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&sync_lock);
    return r;
}

/* A dma-buf of GPU memory is a descriptor of the host's kernel, which no guest process can
   hold: refused as on a device without dma-buf support (DMA_BUF_SUPPORTED reads 0). */
HV_EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, size_t size,
                                                 int type, unsigned long long flags) {
    static int once;
    (void)ptr; (void)flags;
    if (!handle || !size) return CUDA_ERROR_INVALID_VALUE;
    if (type != 1) return CUDA_ERROR_INVALID_VALUE; /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */
    return hv_unsupported("cuMemGetHandleForAddressRange (a dma-buf of the GPU's memory is "
                          "the host's descriptor; a guest cannot hold one)", &once);
}

/* -- 2D copies and memsets, row by row (one frame when the rows are contiguous) -- */

typedef struct {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    CUdeviceptr src_dev;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_dev;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
} hv_memcpy2d; /* CUDA_MEMCPY2D */

enum { MT_HOST = 1, MT_DEVICE = 2, MT_ARRAY = 3, MT_UNIFIED = 4 };

static CUresult copy2d(const hv_memcpy2d *c, CUstream stream, int wait) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (c->src_type == MT_ARRAY || c->dst_type == MT_ARRAY) { /* array.c */
        struct hv_copy_side s = { c->src_type, c->src_host, c->src_dev, c->src_array, c->src_x,
                                  c->src_y, 0, c->src_pitch, 0 };
        struct hv_copy_side d = { c->dst_type, c->dst_host, c->dst_dev, c->dst_array, c->dst_x,
                                  c->dst_y, 0, c->dst_pitch, 0 };
        return hv_copy3d(&s, &d, c->width, c->height, 1, stream, wait);
    }
    uintptr_t src = c->src_type == MT_HOST ? (uintptr_t)c->src_host : (uintptr_t)c->src_dev;
    uintptr_t dst = c->dst_type == MT_HOST ? (uintptr_t)c->dst_host : (uintptr_t)c->dst_dev;
    src += c->src_y * c->src_pitch + c->src_x;
    dst += c->dst_y * c->dst_pitch + c->dst_x;
    size_t rows = c->height, width = c->width;
    if (c->src_pitch == width && c->dst_pitch == width) { width *= rows; rows = 1; }
    /* Rows from or to pinned memory are one-way frames: the synchronous form waits
       once, after the last. */
    int pinned = wait && rows > 1 && c->height &&
                 (hv_region_holds((const void *)src, (rows - 1) * c->src_pitch + width) ||
                  hv_region_holds((const void *)dst, (rows - 1) * c->dst_pitch + width));
    for (size_t i = 0; i < rows; i++) {
        CUresult r = any_copy(dst + i * c->dst_pitch, src + i * c->src_pitch, width, stream,
                              wait && !pinned);
        if (r) return r;
    }
    return pinned ? cuStreamSynchronize(stream) : CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemcpy2D_v2(const hv_memcpy2d *c) { return copy2d(c, NULL, 1); }
HV_EXPORT CUresult cuMemcpy2DUnaligned_v2(const hv_memcpy2d *c) { return copy2d(c, NULL, 1); }
HV_EXPORT CUresult cuMemcpy2DAsync_v2(const hv_memcpy2d *c, CUstream s) { return copy2d(c, s, 0); }

static CUresult memset2d(CUdeviceptr d, size_t pitch, uint32_t v, uint32_t width_bytes,
                         size_t w, size_t h, CUstream s) {
    if (pitch == w * width_bytes) return memset_(d, v, width_bytes, w * h, s);
    for (size_t i = 0; i < h; i++) {
        CUresult r = memset_(d + i * pitch, v, width_bytes, w, s);
        if (r) return r;
    }
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) { return memset2d(d, p, v, 1, w, h, NULL); }
HV_EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) { return memset2d(d, p, v, 2, w, h, NULL); }
HV_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h) { return memset2d(d, p, v, 4, w, h, NULL); }
HV_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) { return memset2d(d, p, v, 1, w, h, s); }
HV_EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) { return memset2d(d, p, v, 2, w, h, s); }
HV_EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h, CUstream s) { return memset2d(d, p, v, 4, w, h, s); }

/* Unversioned name with the same arguments as its _v2. */
HV_EXPORT CUresult cuMemHostRegister(void *p, size_t size, unsigned flags) {
    return cuMemHostRegister_v2(p, size, flags);
}
