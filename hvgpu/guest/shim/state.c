/* What the guest side of the shim remembers: devices, contexts, allocations.
 *
 * Device attributes and UUIDs are fetched once at cuInit; contexts are the
 * guest's view of the executor's one context per device; device ranges
 * (cuMemAlloc, module variables, mapped memory, pool allocations) and
 * pinned-host ranges answer pointer queries and give cuMemcpy its direction
 * without a round trip; reserved address ranges say which vGPU a VMM call
 * about an address goes to; the ranges of freed pool blocks the guest keeps
 * (poolcache.c) let copies into them be refused. Nothing here talks to the
 * agent.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int hv_device_count;
int hv_attrs[HV_MAX_DEVICES][HV_ATTR_COUNT + 1];
unsigned char hv_uuids[HV_MAX_DEVICES][HVGPU_UUID_SIZE];

static struct hv_ctx primaries[HV_MAX_DEVICES];

struct hv_ctx *hv_primary(int device) {
    if (device < 0 || device >= HV_MAX_DEVICES) return NULL;
    primaries[device].magic = 0x68766378; /* "hvcx" */
    primaries[device].device = device;
    return &primaries[device];
}

struct range {
    uintptr_t base;
    size_t size;
    unsigned flags;
};

struct ranges {
    pthread_mutex_t lock;
    struct range *v;
    size_t n, cap;
};

/* Per vGPU: their executors are separate processes, so addresses may coincide. */
static struct ranges dev_ranges[HV_MAX_DEVICES] = {
    [0 ... HV_MAX_DEVICES - 1] = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }
};
static struct ranges host_ranges = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 };
static struct ranges reserved[HV_MAX_DEVICES] = {
    [0 ... HV_MAX_DEVICES - 1] = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }
};
static struct ranges kept[HV_MAX_DEVICES] = {
    [0 ... HV_MAX_DEVICES - 1] = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }
};
static size_t kept_count; /* all vGPUs': while 0, a copy looks nothing up */

/* Index of the first range whose base is > p. */
static size_t upper(struct ranges *r, uintptr_t p) {
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->v[mid].base <= p) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static void add(struct ranges *r, uintptr_t base, size_t size, unsigned flags) {
    pthread_mutex_lock(&r->lock);
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        struct range *v = realloc(r->v, cap * sizeof *v);
        if (!v) { pthread_mutex_unlock(&r->lock); return; } /* only lookups degrade */
        r->v = v;
        r->cap = cap;
    }
    size_t i = upper(r, base);
    memmove(r->v + i + 1, r->v + i, (r->n - i) * sizeof *r->v);
    r->v[i] = (struct range){ base, size, flags };
    r->n++;
    pthread_mutex_unlock(&r->lock);
}

static int find(struct ranges *r, uintptr_t p, uintptr_t *base, size_t *size, unsigned *flags) {
    pthread_mutex_lock(&r->lock);
    size_t i = upper(r, p);
    int found = 0;
    if (i > 0) {
        struct range *g = &r->v[i - 1];
        if (p < g->base + (g->size ? g->size : 1)) {
            if (base) *base = g->base;
            if (size) *size = g->size;
            if (flags) *flags = g->flags;
            found = 1;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

static int removed(struct ranges *r, uintptr_t base, int refuse_flag) {
    pthread_mutex_lock(&r->lock);
    size_t i = upper(r, base);
    int ok = i > 0 && r->v[i - 1].base == base && !(r->v[i - 1].flags & refuse_flag);
    if (ok) {
        memmove(r->v + i - 1, r->v + i, (r->n - i) * sizeof *r->v);
        r->n--;
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

/* Every range of exactly `flags` that starts in [base, end). */
static void drop(struct ranges *r, uintptr_t base, uintptr_t end, unsigned flags) {
    pthread_mutex_lock(&r->lock);
    size_t j = base ? upper(r, base - 1) : 0, kept = j; /* j: the first range at or past base */
    for (; j < r->n && r->v[j].base < end; j++)
        if (r->v[j].flags != flags) r->v[kept++] = r->v[j];
    memmove(r->v + kept, r->v + j, (r->n - j) * sizeof *r->v);
    r->n -= j - kept;
    pthread_mutex_unlock(&r->lock);
}

void hv_alloc_add(CUdeviceptr ptr, size_t size, int is_global) {
    hv_range_add(ptr, size, is_global ? HV_RANGE_GLOBAL : HV_RANGE_ALLOC);
}

void hv_range_add(CUdeviceptr ptr, size_t size, unsigned kind) {
    add(&dev_ranges[hv_routed_device()], (uintptr_t)ptr, size, kind);
}

int hv_range_kind(CUdeviceptr ptr) {
    int d = hv_alloc_owner(ptr);
    unsigned flags;
    return d >= 0 && find(&dev_ranges[d], (uintptr_t)ptr, NULL, NULL, &flags) ? (int)flags : -1;
}

int hv_range_remove(int device, CUdeviceptr ptr, unsigned kind) {
    struct ranges *r = &dev_ranges[device];
    pthread_mutex_lock(&r->lock);
    size_t i = upper(r, (uintptr_t)ptr);
    int ok = i > 0 && r->v[i - 1].base == (uintptr_t)ptr && r->v[i - 1].flags == kind;
    if (ok) {
        memmove(r->v + i - 1, r->v + i, (r->n - i) * sizeof *r->v);
        r->n--;
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

void hv_ranges_drop(int device, CUdeviceptr ptr, size_t size, unsigned kind) {
    drop(&dev_ranges[device], (uintptr_t)ptr, (uintptr_t)ptr + size, kind);
}

void hv_kept_add(int device, CUdeviceptr ptr, size_t size) {
    add(&kept[device], (uintptr_t)ptr, size, 0);
    __atomic_add_fetch(&kept_count, 1, __ATOMIC_RELEASE);
}

void hv_kept_remove(int device, CUdeviceptr ptr) {
    if (removed(&kept[device], (uintptr_t)ptr, 0))
        __atomic_sub_fetch(&kept_count, 1, __ATOMIC_RELEASE);
}

int hv_kept_touches(int device, CUdeviceptr ptr, size_t n) {
    if (!n || device < 0 || device >= HV_MAX_DEVICES ||
        !__atomic_load_n(&kept_count, __ATOMIC_ACQUIRE))
        return 0;
    struct ranges *r = &kept[device];
    pthread_mutex_lock(&r->lock);
    uintptr_t last = n - 1 > UINTPTR_MAX - (uintptr_t)ptr ? UINTPTR_MAX : (uintptr_t)ptr + n - 1;
    size_t i = upper(r, last); /* the first range past the last byte */
    int touches = i > 0 && r->v[i - 1].base + r->v[i - 1].size > (uintptr_t)ptr;
    pthread_mutex_unlock(&r->lock);
    return touches;
}

void hv_kept_forget(void) {
    for (int d = 0; d < HV_MAX_DEVICES; d++) {
        pthread_mutex_init(&kept[d].lock, NULL); /* a thread of the parent may have held it */
        kept[d].n = 0;
    }
    kept_count = 0;
}

void hv_reserve_add(int device, CUdeviceptr ptr, size_t size) {
    add(&reserved[device], (uintptr_t)ptr, size, 0);
}

int hv_reserve_remove(int device, CUdeviceptr ptr) {
    return removed(&reserved[device], (uintptr_t)ptr, 0);
}

int hv_reserve_find(int device, CUdeviceptr ptr, uintptr_t *base, size_t *size) {
    return device >= 0 && device < HV_MAX_DEVICES &&
           find(&reserved[device], (uintptr_t)ptr, base, size, NULL);
}

int hv_reserve_owner(CUdeviceptr ptr) {
    int first = hv_routed_device();
    if (find(&reserved[first], (uintptr_t)ptr, NULL, NULL, NULL)) return first;
    for (int d = 0; d < hv_device_count && d < HV_MAX_DEVICES; d++)
        if (d != first && find(&reserved[d], (uintptr_t)ptr, NULL, NULL, NULL)) return d;
    return -1;
}

int hv_alloc_owner(CUdeviceptr ptr) {
    static int warned;
    int first = hv_routed_device(), owner = -1;
    if (find(&dev_ranges[first], (uintptr_t)ptr, NULL, NULL, NULL)) owner = first;
    for (int d = 0; d < hv_device_count && d < HV_MAX_DEVICES; d++) {
        if (d == first || !find(&dev_ranges[d], (uintptr_t)ptr, NULL, NULL, NULL)) continue;
        if (owner < 0) return d;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            hv_log("0x%llx is an address on device %d and on device %d (each vGPU's executor "
                   "is its own process); it is taken as device %d's, the current one. Make a "
                   "pointer's device current before copying to or from it, or use "
                   "cudaMemcpyPeer, which names both (said once)",
                   (unsigned long long)ptr, first, d, first);
        break;
    }
    return owner;
}

int hv_alloc_remove(CUdeviceptr ptr) {
    int d = hv_alloc_owner(ptr);
    return d >= 0 && removed(&dev_ranges[d], (uintptr_t)ptr,
                             HV_RANGE_GLOBAL | HV_RANGE_MAPPED | HV_RANGE_POOL | HV_RANGE_IPC |
                                 HV_RANGE_GRAPH);
}

int hv_alloc_find(CUdeviceptr ptr, CUdeviceptr *base, size_t *size) {
    int d = hv_alloc_owner(ptr);
    uintptr_t b;
    int found = d >= 0 && find(&dev_ranges[d], (uintptr_t)ptr, &b, size, NULL);
    if (found && base) *base = b;
    return found;
}

void hv_host_add(void *ptr, size_t size, unsigned flags) {
    add(&host_ranges, (uintptr_t)ptr, size, flags | 0x80000000u);
}

int hv_host_remove(void *ptr) { return removed(&host_ranges, (uintptr_t)ptr, 0); }

int hv_host_find(const void *ptr, void **base, size_t *size) {
    uintptr_t b;
    int found = find(&host_ranges, (uintptr_t)ptr, &b, size, NULL);
    if (found && base) *base = (void *)b;
    return found;
}

unsigned hv_host_flags(const void *ptr) {
    unsigned flags = 0;
    find(&host_ranges, (uintptr_t)ptr, NULL, NULL, &flags);
    return flags & 0x7fffffffu;
}
