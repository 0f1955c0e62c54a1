/* Managed memory (cuMemAllocManaged) under CUDA's rules for a device without
 * concurrent managed access (CONCURRENT_MANAGED_ACCESS reads 0).
 *
 * A managed allocation is device memory of the executor (MEM_ALLOC, charged to the
 * slice as any allocation) and guest memory mapped at the same address
 * (MAP_FIXED_NOREPLACE), so one pointer means the same bytes to the program and to
 * its kernels. Its size is rounded up to whole 2 MiB pages, which the driver hands
 * out aligned, so that no two allocations share a guest page. An address the guest
 * already uses is refused (CUDA_ERROR_NOT_SUPPORTED, said once) after a few tries.
 *
 * Which bytes move, and when (the scheme: a twin, as page-based shared memory
 * systems keep, not write protection: a write the kernel makes for the program, such
 * as read() into managed memory, would fail with EFAULT on a protected page, and
 * no signal handler of the program's is chained or raced):
 * - each allocation keeps a twin: what the guest and device last agreed on;
 * - before GPU work on a stream (a launch, graph launch, copy or memset), the pages
 *   of the allocations that work may touch (attached globally or to that stream)
 *   where the guest's bytes differ from the twin are copied to the device, in stream
 *   order; global ones are waited for, since other streams' later work may read them;
 * - at a synchronisation point (cuCtxSynchronize, cuStreamSynchronize/Query,
 *   cuEventSynchronize/Query, the blocking copies), the device's bytes of the
 *   allocations it covers come back: each byte the device changed and the guest did
 *   not takes the device's value; a byte the guest wrote since stays the guest's, to
 *   be sent before the next GPU work. Bytes change in the guest's mapping only where
 *   the device changed them, so a host thread writing an allocation of an idle
 *   stream is never overwritten.
 * As on such a device, the program may touch managed memory only while no kernel
 * may be using it; one that does sees the bytes of the last synchronisation.
 * Advice and prefetches are recorded and answered (cuMemRangeGetAttribute); a
 * prefetch to the device sends the guest's changes at once, in stream order.
 *
 * Must not move bytes of an allocation the work at hand cannot touch, nor write
 * a guest byte the device did not change.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "shim.h"

#define PAGE 4096
#define GRAIN (2u << 20)          /* the driver's page for allocations above 1 MiB */
#define CHUNK (64u << 20)         /* bytes one pull or push frame carries at most */
#define TRIES 8                   /* allocations tried before an address is free here */
#define ATTACH_GLOBAL 1
#define ATTACH_HOST 2
#define ATTACH_SINGLE 4
#define CPU (-1)                  /* CU_DEVICE_CPU */

struct managed {
    CUdeviceptr base;
    size_t size;                  /* rounded: what is mapped and allocated */
    int device;
    unsigned attach;              /* ATTACH_* */
    uint64_t stream;              /* ATTACH_SINGLE's stream (untagged) */
    unsigned char *twin;
    int touched;                  /* GPU work that may change it was issued since its pull */
    int read_mostly, preferred, last_prefetch;
    uint32_t accessed_by;         /* bit d: cuMemAdvise SET_ACCESSED_BY device d */
    struct managed *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct managed *all;
static int count;

int hv_managed_any(void) { return __atomic_load_n(&count, __ATOMIC_ACQUIRE) > 0; }

static struct managed *find(CUdeviceptr p) {
    for (struct managed *m = all; m; m = m->next)
        if (p >= m->base && p < m->base + m->size) return m;
    return NULL;
}

int hv_managed_find(CUdeviceptr p, CUdeviceptr *base, size_t *size) {
    if (!hv_managed_any()) return 0;
    pthread_mutex_lock(&lock);
    struct managed *m = find(p);
    if (m && base) *base = m->base;
    if (m && size) *size = m->size;
    pthread_mutex_unlock(&lock);
    return m != NULL;
}

/* Work on `stream` of `device` may touch m. */
static int in_scope(const struct managed *m, int device, uint64_t stream, int everything) {
    if (m->device != device || m->attach == ATTACH_HOST) return 0;
    return everything || m->attach == ATTACH_GLOBAL || m->stream == stream;
}

static CUresult push(struct managed *m, uint64_t stream, int *sent) {
    unsigned char *g = (unsigned char *)(uintptr_t)m->base;
    size_t at = 0;
    while (at < m->size) {
        if (!memcmp(g + at, m->twin + at, PAGE)) { at += PAGE; continue; }
        size_t end = at + PAGE;
        while (end < m->size && end - at < CHUNK && memcmp(g + end, m->twin + end, PAGE))
            end += PAGE;
        memcpy(m->twin + at, g + at, end - at); /* what the device will hold */
        hvgpu_memcpy_htod_req_t q = { m->base + at, stream };
        CUresult r = HV_ON(m->device, hv_oneway(HVGPU_OP_MEMCPY_HTOD, &q, sizeof q,
                                                m->twin + at, end - at));
        if (r) return r;
        *sent = 1;
        at = end;
    }
    return CUDA_SUCCESS;
}

/* Before GPU work on `stream` of `device`: the guest's changes reach the device. */
CUresult hv_managed_before(int device, CUstream stream) {
    if (!hv_managed_any()) return CUDA_SUCCESS;
    uint64_t s = hv_untag(stream);
    CUresult r = CUDA_SUCCESS;
    int global_sent = 0;
    pthread_mutex_lock(&lock);
    for (struct managed *m = all; m && !r; m = m->next) {
        if (!in_scope(m, device, s, 0)) continue;
        int sent = 0;
        r = push(m, s, &sent);
        if (sent && m->attach == ATTACH_GLOBAL) global_sent = 1;
        m->touched = 1;
    }
    pthread_mutex_unlock(&lock);
    if (!r && global_sent) /* other streams' later work may read them: landed first */
        r = hv_call_handle(device, HVGPU_OP_STREAM_SYNCHRONIZE, s);
    return r;
}

static CUresult pull(struct managed *m, uint64_t stream, unsigned char *dev) {
    for (size_t at = 0; at < m->size; at += CHUNK) {
        size_t k = m->size - at < CHUNK ? m->size - at : CHUNK;
        hvgpu_memcpy_dtoh_req_t q = { m->base + at, k, stream };
        CUresult r = HV_ON(m->device, hv_call(HVGPU_OP_MEMCPY_DTOH, &q, sizeof q, NULL, 0, NULL,
                                              0, NULL, dev, k));
        if (r) return r;
        unsigned char *g = (unsigned char *)(uintptr_t)m->base + at, *t = m->twin + at;
        for (size_t p = 0; p < k; p += PAGE) {
            if (!memcmp(dev + p, t + p, PAGE)) continue; /* the device left it as agreed */
            for (size_t i = p; i < p + PAGE; i++) {
                if (dev[i] == t[i]) continue;
                if (g[i] == t[i]) g[i] = dev[i]; /* else the guest's newer byte stays */
                t[i] = dev[i];
            }
        }
    }
    return CUDA_SUCCESS;
}

/* At a synchronisation point of `stream` (everything: the whole device) on `device`:
   the device's bytes come back. Work on other streams may still touch global memory,
   so only a whole-device synchronisation or the stream an allocation is attached to
   says the allocation is done. */
CUresult hv_managed_synced(int device, CUstream stream, int everything) {
    if (!hv_managed_any()) return CUDA_SUCCESS;
    uint64_t s = everything ? 0 : hv_untag(stream);
    unsigned char *dev = NULL;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    for (struct managed *m = all; m && !r; m = m->next) {
        if (!m->touched || !in_scope(m, device, s, everything)) continue;
        if (!dev && !(dev = malloc(CHUNK))) { r = CUDA_ERROR_OUT_OF_MEMORY; break; }
        r = pull(m, s, dev);
        if (!r && (everything || m->attach == ATTACH_SINGLE)) m->touched = 0;
    }
    pthread_mutex_unlock(&lock);
    free(dev);
    return r;
}

HV_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags) {
    static int once;
    if (!dptr || !size || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    if (size > SIZE_MAX - GRAIN) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    size_t rounded = (size + GRAIN - 1) / GRAIN * GRAIN;
    struct managed *m = calloc(1, sizeof *m);
    unsigned char *twin = calloc(1, rounded);
    if (!m || !twin) { free(m); free(twin); return CUDA_ERROR_OUT_OF_MEMORY; }
    CUdeviceptr taken[TRIES];
    int tries = 0, device = hv_routed_device();
    CUresult r = CUDA_SUCCESS;
    void *at = MAP_FAILED;
    while (tries < TRIES) {
        hvgpu_mem_alloc_req_t q = { rounded };
        hvgpu_mem_alloc_rep_t v;
        r = hv_call(HVGPU_OP_MEM_ALLOC, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
        if (r) break;
        taken[tries++] = v.dptr;
        if (v.dptr % PAGE) continue; /* not whole pages here: no mapping can match */
        at = mmap((void *)(uintptr_t)v.dptr, rounded, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (at == (void *)(uintptr_t)v.dptr) break;
        if (at != MAP_FAILED) munmap(at, rounded); /* a kernel without NOREPLACE */
        at = MAP_FAILED;
    }
    /* the tries whose address this process already uses go back */
    for (int i = 0; i < tries - (at != MAP_FAILED); i++) {
        hvgpu_mem_free_req_t q = { taken[i] };
        hv_call(HVGPU_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0);
    }
    if (at == MAP_FAILED) {
        free(m); free(twin);
        if (r) return r;
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
            hv_log("cuMemAllocManaged refused: none of the %d device addresses the GPU gave "
                   "(0x%llx, ...) could be mapped in this process at the same address (in "
                   "use, or not page-aligned; errno %d)", tries,
                   (unsigned long long)taken[0], errno);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)at;
    /* both sides start from the same (zero) bytes */
    hvgpu_memset_req_t z = { ptr, rounded / 4, 0, 4, 0 };
    r = hv_oneway(HVGPU_OP_MEMSET, &z, sizeof z, NULL, 0);
    if (r) {
        munmap(at, rounded);
        hvgpu_mem_free_req_t q = { ptr };
        hv_call(HVGPU_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0);
        free(m); free(twin);
        return r;
    }
    m->base = ptr; m->size = rounded; m->device = device; m->attach = flags;
    m->twin = twin; m->preferred = -2; m->last_prefetch = -2;
    hv_alloc_add(ptr, rounded, 0);
    pthread_mutex_lock(&lock);
    m->next = all;
    all = m;
    __atomic_add_fetch(&count, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    *dptr = ptr;
    return CUDA_SUCCESS;
}

/* cuMemFree of a managed allocation: 1 with *r its status, 0 where ptr is none. The
   device's side goes first (its work is done by then, as cuMemFree waits). */
int hv_managed_free(CUdeviceptr ptr, CUresult *r) {
    if (!hv_managed_any()) return 0;
    pthread_mutex_lock(&lock);
    struct managed **pm = &all;
    while (*pm && (*pm)->base != ptr) pm = &(*pm)->next;
    struct managed *m = *pm;
    if (m) {
        *pm = m->next;
        __atomic_sub_fetch(&count, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    if (!m) return 0;
    HV_ON(m->device, hv_alloc_remove(ptr));
    hvgpu_mem_free_req_t q = { ptr };
    *r = HV_ON(m->device, hv_call(HVGPU_OP_MEM_FREE, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0));
    munmap((void *)(uintptr_t)m->base, m->size);
    free(m->twin);
    free(m);
    return 1;
}

HV_EXPORT CUresult cuStreamAttachMemAsync(CUstream stream, CUdeviceptr ptr, size_t length,
                                          unsigned flags) {
    if (flags != ATTACH_GLOBAL && flags != ATTACH_HOST && flags != ATTACH_SINGLE)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags == ATTACH_SINGLE && !hv_created(stream)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct managed *m = find(ptr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (m && m->base == ptr && (!length || length <= m->size)) {
        /* the guest's changes so far belong to the work the memory was attached to */
        m->attach = flags;
        m->stream = hv_untag(stream);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* -- advice, prefetches and what a range answers -------------------------------- */

enum { ADV_SET_READ_MOSTLY = 1, ADV_UNSET_READ_MOSTLY, ADV_SET_PREFERRED, ADV_UNSET_PREFERRED,
       ADV_SET_ACCESSED_BY, ADV_UNSET_ACCESSED_BY };

static CUresult advise(CUdeviceptr p, size_t n, int advice, int device) {
    if (advice < ADV_SET_READ_MOSTLY || advice > ADV_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    if ((advice == ADV_SET_PREFERRED || advice == ADV_SET_ACCESSED_BY) && device != CPU &&
        hv_check_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    struct managed *m = find(p);
    CUresult r = m && n <= m->base + m->size - p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        switch (advice) { /* hints: the bytes move as the rules above say, whatever they are */
        case ADV_SET_READ_MOSTLY: m->read_mostly = 1; break;
        case ADV_UNSET_READ_MOSTLY: m->read_mostly = 0; break;
        case ADV_SET_PREFERRED: m->preferred = device; break;
        case ADV_UNSET_PREFERRED: m->preferred = -2; break;
        case ADV_SET_ACCESSED_BY: if (device >= 0) m->accessed_by |= 1u << device; break;
        case ADV_UNSET_ACCESSED_BY: if (device >= 0) m->accessed_by &= ~(1u << device); break;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

HV_EXPORT CUresult cuMemAdvise(CUdeviceptr p, size_t n, int advice, CUdevice device) {
    return advise(p, n, advice, device);
}

/* CUmemLocation: {type, id}; type 1 device, 2 host (and 3, 4: host NUMA). */
typedef struct { int type, id; } hv_location;

static int location_device(hv_location l) { return l.type == 1 ? l.id : CPU; }

HV_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, hv_location l) {
    if (l.type < 1 || l.type > 4) return CUDA_ERROR_INVALID_VALUE;
    return advise(p, n, advice, location_device(l));
}

static CUresult prefetch(CUdeviceptr p, size_t n, int device, CUstream stream) {
    if (device != CPU && hv_check_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    struct managed *m = find(p);
    int ok = m && n <= m->base + m->size - p, owner = m ? m->device : 0;
    if (ok) m->last_prefetch = device;
    pthread_mutex_unlock(&lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    if (device == CPU) return CUDA_SUCCESS; /* the bytes come at the next synchronisation */
    if (device != owner) return CUDA_SUCCESS; /* another vGPU cannot hold this one's memory */
    return hv_managed_before(owner, stream);
}

HV_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice device, CUstream s) {
    return prefetch(p, n, device, s);
}

HV_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, hv_location l, unsigned flags,
                                         CUstream s) {
    if (flags || l.type < 1 || l.type > 4) return CUDA_ERROR_INVALID_VALUE;
    return prefetch(p, n, location_device(l), s);
}

enum { RA_READ_MOSTLY = 1, RA_PREFERRED_LOCATION, RA_ACCESSED_BY, RA_LAST_PREFETCH_LOCATION,
       RA_PREFERRED_LOCATION_TYPE, RA_PREFERRED_LOCATION_ID, RA_LAST_PREFETCH_LOCATION_TYPE,
       RA_LAST_PREFETCH_LOCATION_ID };

static void location_of(int device, int *type, int *id) {
    /* CUmemLocationType: 0 invalid, 1 device, 2 host */
    *type = device == -2 ? 0 : device == CPU ? 2 : 1;
    *id = device >= 0 ? device : 0;
}

HV_EXPORT CUresult cuMemRangeGetAttribute(void *data, size_t size, int attribute,
                                          CUdeviceptr p, size_t n) {
    if (!data || !size || size % 4) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct managed *m = find(p);
    CUresult r = m && n && n <= m->base + m->size - p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    int *out = data, type, id;
    if (!r) {
        switch (attribute) {
        case RA_READ_MOSTLY: *out = m->read_mostly; break;
        case RA_PREFERRED_LOCATION: *out = m->preferred; break;
        case RA_LAST_PREFETCH_LOCATION: *out = m->last_prefetch; break;
        case RA_ACCESSED_BY: {
            size_t k = 0;
            for (int d = 0; d < 32 && k < size / 4; d++)
                if (m->accessed_by & (1u << d)) out[k++] = d;
            while (k < size / 4) out[k++] = -2; /* CU_DEVICE_INVALID */
            break;
        }
        case RA_PREFERRED_LOCATION_TYPE: location_of(m->preferred, out, &id); break;
        case RA_PREFERRED_LOCATION_ID: location_of(m->preferred, &type, out); break;
        case RA_LAST_PREFETCH_LOCATION_TYPE: location_of(m->last_prefetch, out, &id); break;
        case RA_LAST_PREFETCH_LOCATION_ID: location_of(m->last_prefetch, &type, out); break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

HV_EXPORT CUresult cuMemRangeGetAttributes(void **data, size_t *sizes, int *attributes,
                                           size_t n_attributes, CUdeviceptr p, size_t n) {
    if (!data || !sizes || !attributes || !n_attributes) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n_attributes; i++) {
        CUresult r = cuMemRangeGetAttribute(data[i], sizes[i], attributes[i], p, n);
        if (r) return r;
    }
    return CUDA_SUCCESS;
}

/* -- batches of prefetches and discards (CUDA 13) ------------------------------------
 *
 * cuda.h asks of them a device with concurrent managed access, which the shim's is not
 * (above): they are served all the same under this file's rules, since each is a hint
 * whose effect a program cannot tell apart from the driver's but by timing. A prefetch
 * is cuMemPrefetchAsync's. A discard leaves the bytes as they are: a discarded range
 * reads as indeterminate values until written or prefetched, which the old bytes are. */

/* Not the legacy NULL stream, as cuda.h says of the three. */
static int batch_stream(CUstream stream) { return hv_created(stream) || hv_untag(stream) == 2; }

static CUresult batch_ranges(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                             unsigned long long flags, CUstream stream) {
    if (!ptrs || !sizes || !count || flags || !batch_stream(stream))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < count && !r; i++) {
        struct managed *m = find(ptrs[i]);
        if (!m || !sizes[i] || sizes[i] > m->base + m->size - ptrs[i]) r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult batch_locations(size_t count, hv_location *locs, size_t *idxs, size_t n) {
    if (!locs || !idxs || !n || n > count || idxs[0] != 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < n; k++)
        if ((k && idxs[k] <= idxs[k - 1]) || idxs[k] >= count || locs[k].type < 1 ||
            locs[k].type > 4)
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult prefetch_batch(CUdeviceptr *ptrs, size_t *sizes, size_t count, hv_location *locs,
                               size_t *idxs, size_t n, unsigned long long flags,
                               CUstream stream) {
    CUresult r = batch_ranges(ptrs, sizes, count, flags, stream);
    if (!r) r = batch_locations(count, locs, idxs, n);
    size_t k = 0;
    for (size_t i = 0; i < count && !r; i++) {
        while (k + 1 < n && idxs[k + 1] <= i) k++;
        r = prefetch(ptrs[i], sizes[i], location_device(locs[k]), stream);
    }
    return r;
}

HV_EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                           hv_location *locs, size_t *idxs, size_t n,
                                           unsigned long long flags, CUstream stream) {
    return prefetch_batch(ptrs, sizes, count, locs, idxs, n, flags, stream);
}

HV_EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                          unsigned long long flags, CUstream stream) {
    return batch_ranges(ptrs, sizes, count, flags, stream);
}

HV_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes,
                                                     size_t count, hv_location *locs,
                                                     size_t *idxs, size_t n,
                                                     unsigned long long flags, CUstream stream) {
    return prefetch_batch(ptrs, sizes, count, locs, idxs, n, flags, stream);
}
