/* The region lane: pinned host memory, and copies that name offsets in a
 * region the guest and its executor both map (hvgpu/virtio/region.py), for the shim
 * and for the Python API alike.
 *
 * A connection (one per vGPU) whose agent offers a region gets one on its first
 * pinned allocation or pageable copy of HVGPU_STAGE_MIN bytes or more:
 * - the VM's device region (HELLO's CAP_REGION_DEVICE): REGION_ATTACH kind 2 answers a
 *   token and vGPU number, and hvgpu_region_find (region.c) maps the ivshmem BAR
 *   whose header carries them; the staging slots and pinned memory are room in it
 *   (REGION_ALLOC);
 * - otherwise (no such device, or one the guest cannot map: it is detached again),
 *   on a unix socket to the agent (CAP_REGION_MEMFD), sealed memfds passed with
 *   REGION_ATTACH kind 1: one for the staging slots, one per pinned allocation.
 * The staging slots are made on the first copy that needs them.
 * A copy from or to pinned memory is a one-way frame naming (region, offset): the
 * executor's DMA moves the bytes, and a device-to-host copy's are there once a
 * later synchronising call on its stream or context has answered. A pageable copy
 * of HVGPU_STAGE_MIN bytes or more goes through two slots of HVGPU_STAGE_CHUNK: the guest
 * fills (or empties) one while the executor moves the other, and a slot is reused
 * only after the STREAM_SYNCHRONIZE fence sent behind its chunk has answered. The
 * connection's lock is held across a whole copy: the slots are the connection's.
 * The guest's side of each chunk is hv_copy (pcopy.c): a few threads share it.
 *
 * Each pinned allocation is mapped by the executor a second time at this process's
 * address of it, device-mapped (HOST_MAP), as the driver maps page-locked memory under
 * unified addressing: a kernel reads and writes its bytes through the program's own
 * pointer, which is also its device pointer. Where that address is taken in the
 * executor, a memfd allocation is moved to another address here (it is not handed out
 * yet) and asked again, a few times; room in the VM's region cannot move. An
 * allocation the executor did not map is pinned memory for copies alone:
 * hv_region_device_map says which.
 *
 * Where no region can be had (an agent without the lane, no device found, a VM
 * over vsock without a device, a full budget), this file does nothing and the
 * caller carries the bytes on the socket; pinned memory is ordinary memory then.
 * HVGPU_SHIM_TRACE says once per vGPU why.
 *
 * The same lane serves a standalone wire (wire.c's hvgpu_client_*, the Python
 * API's connections): hvgpu_client_upload, _download and _pinned_* below.
 *
 * Must not map anything but its own memfds and what region.c found, and must not
 * read anything from a region but the bytes of a copy (the header is advisory).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

/* The region's numbers (HVGPU_REGION_*) and the staging (HVGPU_STAGE_*) are
   hvgpu/virtio/region.py's and tuning.py's. */
/* region.c: the VM's region device whose header carries token; 0 when found.
   Weak: a shim built without it finds none, and uses a memfd or the socket. */
int hvgpu_region_find(const uint8_t token[HVGPU_REGION_TOKEN_SIZE], uint32_t device, void **base,
                      uint64_t *size)
    __attribute__((weak));
const char *hvgpu_region_error(void) __attribute__((weak));
typedef int (*region_finder)(const uint8_t *, uint32_t, void **, uint64_t *);
typedef const char *(*region_error_fn)(void);

/* The finder a program or a preloaded library puts first (a test stands in for the
   ivshmem BAR so), else region.c's. Looked up by name because a build that binds a
   library's own calls inside it (-Bsymbolic-functions, as some distributions' Python
   links extensions) would never reach an interposed one. */
static region_finder finder(region_error_fn *error) {
    region_finder f = (region_finder)dlsym(RTLD_DEFAULT, "hvgpu_region_find");
    region_error_fn e = (region_error_fn)dlsym(RTLD_DEFAULT, "hvgpu_region_error");
    if (!f) {
        f = hvgpu_region_find;
        e = hvgpu_region_error;
    }
    *error = e;
    return f;
}
/* state.c's table of the program's page-locked memory: the shim's alone (weak: the
   Python API's library keeps none). */
void hv_host_add(void *ptr, size_t size, unsigned flags) __attribute__((weak));
int hv_host_remove(void *ptr) __attribute__((weak));

enum { LANE_NONE, LANE_DEVICE, LANE_MEMFD };

/* One connection's regions; guarded by the connection's lock (hv_wire_hold). */
struct lane {
    int tried;                /* the region: mode says which */
    int mode;
    uint32_t device_region;   /* LANE_DEVICE: the VM's region, mapped at device_base */
    char *device_base;
    uint64_t device_size;
    int stage_tried;          /* the slots, made on the first staged copy */
    int staged;               /* ... and there */
    uint32_t stage_region;
    uint64_t stage_offset;    /* of slot 0 in stage_region */
    char *stage;              /* slot 0 in this process */
    int device;               /* the vGPU, for what the trace says; -1: a standalone wire's */
    char why[512];            /* why there is no region, once tried without one */
};

static struct lane lanes[HV_MAX_DEVICES];
/* Bumped in a forked child: its connections are new, the parent's regions not theirs. */
static unsigned epoch;

/* Pinned allocations in regions, sorted by address. */
struct block {
    uintptr_t addr;
    size_t size;
    size_t mapped;     /* whole: the memfd mapping's length, unmapped at free */
    int whole;         /* a memfd region of its own (REGION_DETACH) or room (REGION_FREE) */
    const struct lane *owner; /* the lane it was made on; NULL: that connection closed */
    unsigned epoch;
    uint32_t region;
    uint64_t offset;
    int devmap;        /* mapped in the executor at addr, device-mapped (HOST_MAP) */
};

static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, blocks_cap;
static size_t live; /* nblocks, read without the lock: while 0, copies look nothing up */

static size_t upper(uintptr_t p) { /* the first block whose address is > p */
    size_t lo = 0, hi = nblocks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].addr <= p) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int block_add(const struct block *b) {
    pthread_mutex_lock(&blocks_lock);
    if (nblocks == blocks_cap) {
        size_t cap = blocks_cap ? blocks_cap * 2 : 64;
        struct block *v = realloc(blocks, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&blocks_lock);
            return 0;
        }
        blocks = v;
        blocks_cap = cap;
    }
    size_t i = upper(b->addr);
    memmove(blocks + i + 1, blocks + i, (nblocks - i) * sizeof *blocks);
    blocks[i] = *b;
    nblocks++;
    __atomic_store_n(&live, nblocks, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&blocks_lock);
    return 1;
}

/* The block starting at p, taken out of the table. */
static int block_take(uintptr_t p, struct block *out) {
    pthread_mutex_lock(&blocks_lock);
    size_t i = upper(p);
    int found = i > 0 && blocks[i - 1].addr == p;
    if (found) {
        *out = blocks[i - 1];
        memmove(blocks + i - 1, blocks + i, (nblocks - i) * sizeof *blocks);
        nblocks--;
        __atomic_store_n(&live, nblocks, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&blocks_lock);
    return found;
}

/* The block of this process's connections holding [p, p + n), made on lane `owner`
   (NULL: any open connection's). */
static int block_find(const void *p, size_t n, const struct lane *owner, uint32_t *region,
                      uint64_t *offset) {
    if (!__atomic_load_n(&live, __ATOMIC_ACQUIRE) || !p || !n) return 0;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&blocks_lock);
    size_t i = upper(a);
    int found = 0;
    if (i > 0) {
        struct block *b = &blocks[i - 1];
        found = a - b->addr < b->size && n <= b->size - (a - b->addr) && b->epoch == epoch &&
                b->owner && (!owner || b->owner == owner);
        if (found && region) *region = b->region;
        if (found && offset) *offset = b->offset + (a - b->addr);
    }
    pthread_mutex_unlock(&blocks_lock);
    return found;
}

int hv_region_holds(const void *p, size_t n) { return block_find(p, n, NULL, NULL, NULL); }

int hv_region_device_map(const void *p, size_t n, int *mapped) {
    if (!__atomic_load_n(&live, __ATOMIC_ACQUIRE) || !p || !n) return 0;
    uintptr_t a = (uintptr_t)p;
    pthread_mutex_lock(&blocks_lock);
    size_t i = upper(a);
    int found = 0;
    if (i > 0) {
        struct block *b = &blocks[i - 1];
        found = a - b->addr < b->size && n <= b->size - (a - b->addr) && b->epoch == epoch &&
                b->owner;
        if (found) *mapped = b->devmap;
    }
    pthread_mutex_unlock(&blocks_lock);
    return found;
}

int hv_region_locate(const void *p, size_t n, int device, uint32_t *region, uint64_t *offset) {
    return device >= 0 && device < HV_MAX_DEVICES &&
           block_find(p, n, &lanes[device], region, offset);
}

/* A wire's lane (held): the routed vGPU's, or a standalone wire's own, made here. */
static struct lane *lane_of(struct wire *w) {
    if (!hv_wire_standalone(w)) {
        struct lane *l = &lanes[hv_wire_device(w)];
        l->device = hv_wire_device(w);
        return l;
    }
    void **slot = hv_wire_lane(w);
    if (!*slot) {
        struct lane *l = calloc(1, sizeof *l);
        if (!l) return NULL;
        l->device = -1;
        *slot = l;
    }
    return *slot;
}

static void child_after_fork(void) {
    pthread_mutex_init(&blocks_lock, NULL);
    memset(lanes, 0, sizeof lanes); /* the parent's mappings stay, unused */
    epoch++;
}

static void forks_handled(void) {
    static int atfork_done;
    if (!__atomic_exchange_n(&atfork_done, 1, __ATOMIC_ACQ_REL))
        pthread_atfork(NULL, NULL, child_after_fork);
}

static struct wire *hold(CUresult *r) {
    forks_handled();
    return hv_wire_hold(r);
}

/* One of the lane's own calls. The executor reports an earlier one-way frame's error
   on the next synchronous op instead of running it: then that error goes to
   *earlier (the first one kept) and the op is sent once more, so it still runs. */
static CUresult lane_call(struct wire *w, uint16_t op, const void *body, uint32_t len,
                          void *reply, uint32_t cap, uint32_t *got, CUresult *earlier) {
    unsigned before = hv_wire_failures(w);
    CUresult r = hv_wire_call(w, op, body, len, -1, reply, cap, got);
    if (r && hv_wire_failures(w) != before) {
        if (!*earlier) *earlier = r;
        r = hv_wire_call(w, op, body, len, -1, reply, cap, got);
    }
    return r;
}

static uint64_t align_up(uint64_t n) {
    return (n + HVGPU_REGION_ALIGN - 1) & ~(HVGPU_REGION_ALIGN - 1);
}

/* A sealed memfd of `size` bytes, mapped here and attached on w: its region id. */
static int memfd_region(struct wire *w, uint64_t size, uint32_t *region, void **map, char *why,
                        size_t whylen) {
    int fd = memfd_create("hvgpu-pinned", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        snprintf(why, whylen, "memfd_create: %s", strerror(errno));
        return 0;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        snprintf(why, whylen, "a memfd of %llu bytes: %s", (unsigned long long)size,
                 strerror(errno));
        close(fd);
        return 0;
    }
    hvgpu_region_attach_req_t q = { HVGPU_REGION_KIND_MEMFD, 0, size };
    unsigned char rep[sizeof(hvgpu_region_attach_rep_t) + 64] = {0};
    uint32_t got = 0;
    CUresult r = hv_wire_call(w, HVGPU_OP_REGION_ATTACH, &q, sizeof q, fd, rep, sizeof rep, &got);
    close(fd); /* the executor has its own, and the mapping stays */
    hvgpu_region_attach_rep_view_t a;
    if (r || hvgpu_region_attach_rep_decode(rep, got, &a) < 0 || a.fixed.size < size) {
        snprintf(why, whylen, "the agent did not attach a memfd of %llu bytes (CUDA error %d)",
                 (unsigned long long)size, r ? r : CUDA_ERROR_INVALID_VALUE);
        munmap(p, size);
        return 0;
    }
    *region = a.fixed.region;
    *map = p;
    return 1;
}

/* The VM's device region, attached on w and found among the VM's devices. */
static int attach_device(struct wire *w, struct lane *l, char *why, size_t whylen,
                         CUresult *earlier) {
    hvgpu_region_attach_req_t q = { HVGPU_REGION_KIND_DEVICE, 0, 0 };
    unsigned char rep[sizeof(hvgpu_region_attach_rep_t) + 64] = {0};
    uint32_t got = 0;
    CUresult r = hv_wire_call(w, HVGPU_OP_REGION_ATTACH, &q, sizeof q, -1, rep, sizeof rep, &got);
    if (r) {
        snprintf(why, whylen, "the agent did not attach the VM's region device "
                 "(CUDA error %d)", r);
        return 0;
    }
    hvgpu_region_attach_rep_view_t a; /* too short: region 0, which is detached again */
    int cut = hvgpu_region_attach_rep_decode(rep, got, &a);
    void *base = NULL;
    uint64_t size = 0;
    region_finder find = NULL;
    region_error_fn find_error = NULL;
    if (cut != 0 || a.token.len != HVGPU_REGION_TOKEN_SIZE) {
        snprintf(why, whylen, "the agent's REGION_ATTACH reply carries no region token");
    } else if (!(find = finder(&find_error))) {
        snprintf(why, whylen, "this shim was built without the finder of the VM's "
                 "region device");
    } else if (find(a.token.data, a.fixed.device, &base, &size) != 0) {
        const char *said = find_error ? find_error() : NULL;
        snprintf(why, whylen, "%s", said && *said ? said : "no region device of this VM "
                 "carries the agent's token");
        base = NULL;
    } else if (size < a.fixed.size) { /* not the region the executor maps */
        snprintf(why, whylen, "the VM's region device maps %llu bytes, the agent's "
                 "region is %llu", (unsigned long long)size, (unsigned long long)a.fixed.size);
        munmap(base, size);
        base = NULL;
    }
    if (!base) {
        hvgpu_region_detach_req_t d = { a.fixed.region };
        lane_call(w, HVGPU_OP_REGION_DETACH, &d, sizeof d, NULL, 0, NULL, earlier);
        return 0;
    }
    l->mode = LANE_DEVICE;
    l->device_region = a.fixed.region;
    l->device_base = base;
    l->device_size = a.fixed.size;
    return 1;
}

/* The lane's region, tried once per connection: the VM's device, else memfds (each
   attached as it is made). An earlier one-way frame's error met on the way is left in
   *earlier. */
static void attach(struct wire *w, struct lane *l, CUresult *earlier) {
    if (l->tried) return;
    char why[512] = "";
    uint64_t caps = hv_wire_caps(w);
    if ((caps & HVGPU_CAP_REGION_DEVICE) && !attach_device(w, l, why, sizeof why, earlier) &&
        hv_trace_enabled())
        hv_log("device %d: the VM's region device cannot be used: %s", l->device,
               why);
    if (l->mode == LANE_NONE && (caps & HVGPU_CAP_REGION_MEMFD) && hv_wire_passes_fds(w))
        l->mode = LANE_MEMFD;
    if (l->mode == LANE_NONE && !why[0])
        snprintf(why, sizeof why, "%s", (caps & HVGPU_CAP_REGION_MEMFD)
                 ? "the agent offers memfd regions, which travel only on a unix socket to it"
                 : "the agent offers no region");
    snprintf(l->why, sizeof l->why, "%s", why);
    __atomic_store_n(&l->tried, 1, __ATOMIC_RELEASE); /* route() reads it without the lock */
    if (hv_trace_enabled()) {
        if (l->mode != LANE_NONE)
            hv_log("device %d: pinned memory and large copies go through a region "
                   "(%s)", l->device,
                   l->mode == LANE_DEVICE ? "the VM's device" : "memfds");
        else
            hv_log("device %d: %s; copies travel on the socket and pinned memory is ordinary "
                   "memory", l->device, why);
    }
}

/* The two slots of staged copies, made on the first one (a program that only pins
   pays nothing for them); 0 where the region has no room for them. */
static int staging(struct wire *w, struct lane *l, CUresult *earlier) {
    attach(w, l, earlier);
    if (l->stage_tried || l->mode == LANE_NONE) return l->staged;
    uint64_t slots = HVGPU_STAGE_SLOTS * HVGPU_STAGE_CHUNK;
    char why[512] = "";
    if (l->mode == LANE_DEVICE) {
        hvgpu_region_alloc_req_t q = { l->device_region, 0, slots };
        hvgpu_region_alloc_rep_t v;
        uint32_t got = 0;
        CUresult r = lane_call(w, HVGPU_OP_REGION_ALLOC, &q, sizeof q, &v, sizeof v, &got, earlier);
        if (!r && got == sizeof v && v.offset <= l->device_size &&
            slots <= l->device_size - v.offset) {
            l->stage_region = l->device_region;
            l->stage_offset = v.offset;
            l->stage = l->device_base + v.offset;
            l->staged = 1;
        } else {
            snprintf(why, sizeof why, "no room of %llu bytes for staging in the VM's "
                     "region device (CUDA error %d)", (unsigned long long)slots, r);
        }
    } else {
        void *map;
        if (memfd_region(w, slots, &l->stage_region, &map, why, sizeof why)) {
            l->stage_offset = 0;
            l->stage = map;
            l->staged = 1;
        }
    }
    __atomic_store_n(&l->stage_tried, 1, __ATOMIC_RELEASE);
    if (!l->staged && hv_trace_enabled())
        hv_log("device %d: large pageable copies travel on the socket: %s", l->device,
               why);
    return l->staged;
}

/* -- pinned memory ---------------------------------------------------------------- */

enum { MAP_TRIES = 4 }; /* addresses a memfd allocation is offered at before it stays unmapped */

/* Block b (made on w, not handed out yet) mapped in the executor at b->addr,
   device-mapped: b->devmap. A memfd region whose address the executor cannot take is
   moved here to one the kernel picks, and offered again. */
static void host_map(struct wire *w, struct lane *l, struct block *b, CUresult *earlier) {
    uint64_t len = align_up(b->size);
    CUresult r = CUDA_SUCCESS;
    for (int tries = 0; tries < MAP_TRIES; tries++) {
        hvgpu_host_map_req_t q = { b->region, 0, b->offset, len, b->addr };
        hvgpu_host_map_rep_t v;
        uint32_t got = 0;
        r = lane_call(w, HVGPU_OP_HOST_MAP, &q, sizeof q, &v, sizeof v, &got, earlier);
        if (!r && got == sizeof v && v.dptr == b->addr) {
            b->devmap = 1;
            return;
        }
        if (r != CUDA_ERROR_NOT_SUPPORTED || !b->whole) break;
        void *to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (to == MAP_FAILED) break;
        void *moved = mremap((void *)b->addr, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
        if (moved == MAP_FAILED) {
            munmap(to, len);
            break;
        }
        b->addr = (uintptr_t)moved;
    }
    if (hv_trace_enabled())
        hv_log("device %d: pinned memory at %p is not device-mapped (HOST_MAP: CUDA error %d): "
               "kernels cannot reach it", l->device, (void *)b->addr, r);
}

/* Pinned memory of `size` bytes on w's lane (w held): its address, or NULL (*refused:
   the agent's status where it refused, why: a sentence). An earlier one-way frame's
   error met on the way goes to *earlier, and then nothing is handed out. */
static void *lane_alloc(struct wire *w, struct lane *l, size_t size, CUresult *earlier,
                        CUresult *refused, char *why, size_t whylen) {
    attach(w, l, earlier);
    struct block b = { 0, size, 0, 0, l, epoch, 0, 0, 0 };
    if (l->mode == LANE_DEVICE) {
        hvgpu_region_alloc_req_t q = { l->device_region, 0, size };
        hvgpu_region_alloc_rep_t v;
        uint32_t got = 0;
        CUresult s = lane_call(w, HVGPU_OP_REGION_ALLOC, &q, sizeof q, &v, sizeof v, &got, earlier);
        if (!s && got == sizeof v && v.offset <= l->device_size &&
            size <= l->device_size - v.offset) {
            b.addr = (uintptr_t)(l->device_base + v.offset);
            b.region = l->device_region;
            b.offset = v.offset;
        } else {
            *refused = s;
            snprintf(why, whylen, "REGION_ALLOC failed (CUDA error %d)", s);
        }
    } else if (l->mode == LANE_MEMFD) {
        void *map;
        b.mapped = align_up(size);
        if (memfd_region(w, b.mapped, &b.region, &map, why, whylen)) {
            b.addr = (uintptr_t)map;
            b.whole = 1;
        }
    } else {
        snprintf(why, whylen, "%s", l->why);
    }
    if (b.addr && !*earlier) host_map(w, l, &b, earlier);
    if (b.addr && (*earlier || !block_add(&b))) { /* not handed out: given back */
        if (b.whole) {
            hvgpu_region_detach_req_t q = { b.region };
            lane_call(w, HVGPU_OP_REGION_DETACH, &q, sizeof q, NULL, 0, NULL, earlier);
            munmap((void *)b.addr, b.mapped);
        } else {
            hvgpu_region_free_req_t q = { b.region, 0, b.offset };
            lane_call(w, HVGPU_OP_REGION_FREE, &q, sizeof q, NULL, 0, NULL, earlier);
        }
        b.addr = 0;
    }
    return (void *)b.addr;
}

/* Whether vGPU device's lane may have a region whose pinned memory the executor maps at
   this process's addresses: the agent offers one this connection can take (the VM's
   region device, or memfds on a unix socket), and it was not tried in vain already.
   Asking attaches nothing: a program that only asks (the runtime asks every attribute
   at start) takes no region. */
int hv_region_can_map(int device) {
    if (device < 0 || device >= HV_MAX_DEVICES) return 0;
    CUresult e;
    int previous = hv_route(device);
    struct wire *w = hold(&e);
    int can = 0;
    if (w) {
        struct lane *l = lane_of(w);
        uint64_t caps = hv_wire_caps(w);
        can = l->tried ? l->mode != LANE_NONE
                       : (caps & HVGPU_CAP_REGION_DEVICE) ||
                             ((caps & HVGPU_CAP_REGION_MEMFD) && hv_wire_passes_fds(w));
        hv_wire_release(w);
    }
    hv_route(previous);
    return can;
}

int hv_region_host_alloc(void **pp, size_t size, unsigned flags, CUresult *r) {
    CUresult e;
    struct wire *w = hold(&e);
    if (!w) return 0; /* no agent: ordinary memory, as without the lane */
    struct lane *l = lane_of(w);
    CUresult earlier = CUDA_SUCCESS, refused = CUDA_SUCCESS;
    char why[512] = "";
    void *p = lane_alloc(w, l, size, &earlier, &refused, why, sizeof why);
    hv_wire_release(w);
    if (earlier) { /* a synchronous call reports it, and does not do its own work */
        *r = earlier;
        return 1;
    }
    if (!p) {
        if (l->mode != LANE_NONE && hv_trace_enabled())
            hv_log("device %d: pinned memory of %zu bytes is ordinary memory: %s", l->device,
                   size, why[0] ? why : "out of memory");
        return 0;
    }
    int mapped = 0; /* the flags as given, but DEVICEMAP where the executor could not */
    hv_region_device_map(p, 1, &mapped);
    if (hv_host_add) hv_host_add(p, size, mapped ? flags : flags & ~HV_HOSTALLOC_DEVICEMAP);
    *pp = p;
    *r = CUDA_SUCCESS;
    return 1;
}

/* Gives a block back on w (held); the agent's status. */
static CUresult block_free(struct wire *w, const struct block *b, CUresult *earlier) {
    if (b->whole) {
        hvgpu_region_detach_req_t q = { b->region };
        return lane_call(w, HVGPU_OP_REGION_DETACH, &q, sizeof q, NULL, 0, NULL, earlier);
    }
    hvgpu_region_free_req_t q = { b->region, 0, b->offset };
    return lane_call(w, HVGPU_OP_REGION_FREE, &q, sizeof q, NULL, 0, NULL, earlier);
}

int hv_region_host_free(void *p, CUresult *r) {
    struct block b;
    if (!p || !block_take((uintptr_t)p, &b)) return 0;
    if (hv_host_remove) hv_host_remove(p);
    CUresult s = CUDA_SUCCESS, earlier = CUDA_SUCCESS, e;
    if (b.epoch == epoch && b.owner) {
        int previous = hv_route(((const struct lane *)b.owner)->device);
        struct wire *w = hold(&e);
        if (w) { /* the executor waits for the device before giving it back */
            s = block_free(w, &b, &earlier);
            hv_wire_release(w);
        } /* else the connection is gone, and the agent let go of everything */
        hv_route(previous);
    }
    if (b.whole) munmap((void *)b.addr, b.mapped);
    *r = earlier ? earlier : s == CUDA_ERROR_DEVICE_UNAVAILABLE ? CUDA_SUCCESS : s;
    return 1;
}

/* -- copies ----------------------------------------------------------------------- */

static CUresult fence_send(struct wire *w, CUstream stream, uint32_t *seq) {
    hvgpu_stream_synchronize_req_t q = { hv_untag(stream) };
    return hv_wire_send(w, HVGPU_OP_STREAM_SYNCHRONIZE, &q, sizeof q, -1, seq);
}

/* Reads a fence's reply; the first error is kept (every reply is still read). */
static CUresult settle(struct wire *w, uint32_t seq, CUresult err) {
    CUresult r = hv_wire_reply(w, HVGPU_OP_STREAM_SYNCHRONIZE, seq, NULL, 0, NULL);
    return err ? err : r;
}

static CUresult fence(struct wire *w, CUstream stream) {
    uint32_t seq;
    CUresult r = fence_send(w, stream, &seq);
    return r ? r : settle(w, seq, CUDA_SUCCESS);
}

/* Where chunk k of a staged copy goes in the slots, and the length of the chunk at off
   of a copy of n bytes. */
static uint64_t slot_at(size_t k) { return (k % HVGPU_STAGE_SLOTS) * HVGPU_STAGE_CHUNK; }
static uint64_t chunk_len(size_t n, uint64_t off) {
    return n - off < HVGPU_STAGE_CHUNK ? n - off : HVGPU_STAGE_CHUNK;
}

/* Host to device through the slots: a chunk is copied into a slot, sent, fenced; a
   slot is filled again once its fence has answered. */
static CUresult staged_htod(struct wire *w, struct lane *l, CUdeviceptr dst, const char *src,
                            size_t n, CUstream stream) {
    uint32_t fences[HVGPU_STAGE_SLOTS];
    int nf = 0;
    CUresult err = CUDA_SUCCESS;
    size_t k = 0;
    for (size_t off = 0; off < n; off += HVGPU_STAGE_CHUNK, k++) {
        uint64_t slot = slot_at(k);
        if (nf == HVGPU_STAGE_SLOTS) { /* this slot's last chunk has reached the GPU */
            err = settle(w, fences[0], err);
            memmove(fences, fences + 1, (HVGPU_STAGE_SLOTS - 1) * sizeof *fences);
            nf--;
        }
        if (err) break;
        size_t c = chunk_len(n, off);
        hv_copy(l->stage + slot, src + off, c);
        hvgpu_memcpy_htod_region_req_t q = { dst + off, l->stage_region, 0, l->stage_offset + slot,
                                          c, hv_untag(stream) };
        err = hv_wire_oneway(w, HVGPU_OP_MEMCPY_HTOD_REGION, &q, sizeof q);
        if (!err) err = fence_send(w, stream, &fences[nf]);
        if (err) break;
        nf++;
    }
    for (int i = 0; i < nf; i++) err = settle(w, fences[i], err);
    return err;
}

/* Device to host through the slots: two chunks asked ahead; each copied out once its
   fence has answered, and the next asked into its slot. */
static CUresult staged_dtoh(struct wire *w, struct lane *l, char *dst, CUdeviceptr src, size_t n,
                            CUstream stream) {
    size_t chunks = (n + HVGPU_STAGE_CHUNK - 1) / HVGPU_STAGE_CHUNK;
    uint32_t fences[HVGPU_STAGE_SLOTS];
    int nf = 0;
    CUresult err = CUDA_SUCCESS;
    size_t asked = 0;
    while (asked < chunks && asked < HVGPU_STAGE_SLOTS) {
        uint64_t off = asked * HVGPU_STAGE_CHUNK, c = chunk_len(n, off);
        hvgpu_memcpy_dtoh_region_req_t q = { l->stage_region, 0,
                                          l->stage_offset + slot_at(asked),
                                          src + off, c, hv_untag(stream) };
        err = hv_wire_oneway(w, HVGPU_OP_MEMCPY_DTOH_REGION, &q, sizeof q);
        if (!err) err = fence_send(w, stream, &fences[nf]);
        if (err) break;
        nf++;
        asked++;
    }
    for (size_t k = 0; nf > 0; k++) {
        err = settle(w, fences[0], err);
        memmove(fences, fences + 1, (HVGPU_STAGE_SLOTS - 1) * sizeof *fences);
        nf--;
        if (err) continue; /* the rest of the replies are still read */
        uint64_t off = k * HVGPU_STAGE_CHUNK, c = chunk_len(n, off);
        uint64_t slot = slot_at(k);
        hv_copy(dst + off, l->stage + slot, c);
        if (asked < chunks) { /* into the slot just emptied */
            uint64_t aoff = asked * HVGPU_STAGE_CHUNK;
            uint64_t ac = chunk_len(n, aoff);
            hvgpu_memcpy_dtoh_region_req_t q = { l->stage_region, 0,
                                              l->stage_offset + slot_at(asked),
                                              src + aoff, ac, hv_untag(stream) };
            err = hv_wire_oneway(w, HVGPU_OP_MEMCPY_DTOH_REGION, &q, sizeof q);
            if (!err) err = fence_send(w, stream, &fences[nf]);
            if (err) continue;
            nf++;
            asked++;
        }
    }
    return err;
}

/* What a copy of n bytes whose host side is p may use on lane l (NULL: not made yet):
   1 pinned memory (region and offset set), 2 the slots (the connection still to be
   held and asked), 0 neither. */
static int route(struct lane *l, const void *p, size_t n, uint32_t *region, uint64_t *offset) {
    if (l && block_find(p, n, l, region, offset)) return 1;
    if (n < HVGPU_STAGE_MIN) return 0;
    /* read without the lock: once tried without a region or slots, it stays so (a
       fork's child starts again, with one thread) */
    if (l && ((__atomic_load_n(&l->tried, __ATOMIC_ACQUIRE) && l->mode == LANE_NONE) ||
              (__atomic_load_n(&l->stage_tried, __ATOMIC_ACQUIRE) &&
               !__atomic_load_n(&l->staged, __ATOMIC_ACQUIRE))))
        return 0;
    return 2;
}

/* A copy on w (held), `how` as route() said: 0 where the lane did not take it. */
static int htod_held(struct wire *w, int how, uint32_t region, uint64_t offset, CUdeviceptr dst,
                     const void *src, size_t n, CUstream stream, int wait, CUresult *r) {
    CUresult err = CUDA_SUCCESS;
    if (how == 1) {
        hvgpu_memcpy_htod_region_req_t q = { dst, region, 0, offset, n, hv_untag(stream) };
        err = hv_wire_oneway(w, HVGPU_OP_MEMCPY_HTOD_REGION, &q, sizeof q);
        /* CUDA: the synchronous form from pinned memory returns once the copy is done */
        if (!err) err = wait ? fence(w, stream) : hv_wire_flush(w);
    } else {
        struct lane *l = lane_of(w);
        if (!l || (!staging(w, l, &err) && !err)) return 0;
        if (!err) err = staged_htod(w, l, dst, src, n, stream);
    }
    *r = err;
    return 1;
}

static int dtoh_held(struct wire *w, int how, uint32_t region, uint64_t offset, void *dst,
                     CUdeviceptr src, size_t n, CUstream stream, int wait, CUresult *r) {
    CUresult err = CUDA_SUCCESS;
    if (how == 1) {
        /* the async form returns now: the bytes are there after the program's next
           synchronising call on the stream or context, which the executor answers
           only once the copy is done */
        hvgpu_memcpy_dtoh_region_req_t q = { region, 0, offset, src, n, hv_untag(stream) };
        err = hv_wire_oneway(w, HVGPU_OP_MEMCPY_DTOH_REGION, &q, sizeof q);
        if (!err) err = wait ? fence(w, stream) : hv_wire_flush(w);
    } else {
        struct lane *l = lane_of(w);
        if (!l || (!staging(w, l, &err) && !err)) return 0;
        if (!err) err = staged_dtoh(w, l, dst, src, n, stream);
    }
    *r = err;
    return 1;
}

static struct lane *routed_lane(void) {
    int device = hv_routed_device();
    return device >= 0 && device < HV_MAX_DEVICES ? &lanes[device] : NULL;
}

int hv_region_htod(CUdeviceptr dst, const void *src, size_t n, CUstream stream, int wait,
                CUresult *r) {
    uint32_t region = 0;
    uint64_t offset = 0;
    int how = n && src ? route(routed_lane(), src, n, &region, &offset) : 0;
    if (!how) return 0;
    CUresult e;
    struct wire *w = hold(&e);
    if (!w) return 0; /* the socket path says the same */
    int done = htod_held(w, how, region, offset, dst, src, n, stream, wait, r);
    hv_wire_release(w);
    return done;
}

int hv_region_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream stream, int wait, CUresult *r) {
    uint32_t region = 0;
    uint64_t offset = 0;
    int how = n && dst ? route(routed_lane(), dst, n, &region, &offset) : 0;
    if (!how) return 0;
    CUresult e;
    struct wire *w = hold(&e);
    if (!w) return 0;
    int done = dtoh_held(w, how, region, offset, dst, src, n, stream, wait, r);
    hv_wire_release(w);
    return done;
}

/* -- a standalone wire's lane: the Python API's (wire.c's hvgpu_client_*) -----------
 *
 * As for the shim, with a wire the caller names. Statuses are returned as the rest of
 * that API returns them (wire.c says how to tell a lost connection and a refusal).
 */

static int lane_ready(struct wire *w) { /* may the lane be asked at all */
    return (hv_wire_caps(w) & (HVGPU_CAP_REGION_DEVICE | HVGPU_CAP_REGION_MEMFD)) != 0;
}

/* Host to device: through the lane where it takes the copy (pinned memory, a large
   staged copy), else as MEMCPY_HTOD frames on the socket. Asynchronous, as
   cuMemcpyHtoDAsync: src may be reused on return unless it is pinned memory. */
HV_EXPORT int hvgpu_client_upload(struct wire *w, uint64_t dst, const void *src, uint64_t n,
                                  uint64_t stream) {
    if (!n) return CUDA_SUCCESS;
    CUresult r = hv_wire_take(w);
    if (r) return r;
    forks_handled();
    uint32_t region = 0;
    uint64_t offset = 0;
    void *tagless = (void *)(uintptr_t)stream;
    struct lane *l = *hv_wire_lane(w);
    int how = lane_ready(w) ? route(l, src, (size_t)n, &region, &offset) : 0;
    if (!how || !htod_held(w, how, region, offset, dst, src, (size_t)n, tagless, 0, &r)) {
        const char *p = src;
        r = CUDA_SUCCESS;
        while (n && !r) {
            uint64_t k = n < HVGPU_MAX_PAYLOAD ? n : HVGPU_MAX_PAYLOAD;
            hvgpu_memcpy_htod_req_t q = { dst, stream };
            r = hv_wire_oneway_payload(w, HVGPU_OP_MEMCPY_HTOD, &q, sizeof q, p, k);
            dst += k; p += k; n -= k;
        }
    }
    hv_wire_release(w);
    return r;
}

/* Device to host, waiting for the stream: into pinned memory by the host's DMA, a large
   one staged through the lane, else as MEMCPY_DTOH replies. */
HV_EXPORT int hvgpu_client_download(struct wire *w, void *dst, uint64_t src, uint64_t n,
                                    uint64_t stream) {
    if (!n) return CUDA_SUCCESS;
    CUresult r = hv_wire_take(w);
    if (r) return r;
    forks_handled();
    uint32_t region = 0;
    uint64_t offset = 0;
    void *tagless = (void *)(uintptr_t)stream;
    struct lane *l = *hv_wire_lane(w);
    int how = lane_ready(w) ? route(l, dst, (size_t)n, &region, &offset) : 0;
    if (!how || !dtoh_held(w, how, region, offset, dst, src, (size_t)n, tagless, 1, &r)) {
        char *p = dst;
        r = CUDA_SUCCESS;
        while (n && !r) {
            uint64_t k = n < HVGPU_MAX_PAYLOAD ? n : HVGPU_MAX_PAYLOAD;
            hvgpu_memcpy_dtoh_req_t q = { src, k, stream };
            r = hv_wire_call_payload(w, HVGPU_OP_MEMCPY_DTOH, &q, sizeof q, p, k);
            src += k; p += k; n -= k;
        }
    }
    hv_wire_release(w);
    return r;
}

/* Pinned memory in the lane's region: *p, or a status; CUDA_ERROR_NOT_SUPPORTED where
   no region can be had (hvgpu_client_lane says why). */
HV_EXPORT int hvgpu_client_pinned_alloc(struct wire *w, uint64_t size, void **p) {
    *p = NULL;
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_wire_take(w);
    if (r) return r;
    forks_handled();
    struct lane *l = lane_of(w);
    CUresult earlier = CUDA_SUCCESS, refused = CUDA_SUCCESS;
    char why[512] = "";
    if (l) *p = lane_alloc(w, l, (size_t)size, &earlier, &refused, why, sizeof why);
    hv_wire_release(w);
    if (earlier) return earlier;
    if (refused) return refused;
    if (!*p && l && l->mode != LANE_NONE && !l->why[0])
        snprintf(l->why, sizeof l->why, "%s", why[0] ? why : "out of memory");
    return *p ? CUDA_SUCCESS : l ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Gives back pinned memory of w (or of a closed wire's: w NULL, then it is only
   unmapped where it was its own memfd; the agent let go of its side already). */
HV_EXPORT int hvgpu_client_pinned_free(struct wire *w, void *p) {
    struct block b;
    if (!p || !block_take((uintptr_t)p, &b)) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS, earlier = CUDA_SUCCESS;
    if (w && b.owner && b.epoch == epoch && hv_wire_take(w) == CUDA_SUCCESS) {
        r = b.owner == *hv_wire_lane(w) ? block_free(w, &b, &earlier) : CUDA_ERROR_INVALID_VALUE;
        hv_wire_release(w);
    }
    if (b.whole) munmap((void *)b.addr, b.mapped);
    return earlier ? earlier : r;
}

/* Where pinned memory at p lies: its region and offset there (1), else 0. */
HV_EXPORT int hvgpu_client_pinned_where(struct wire *w, const void *p, uint32_t *region,
                                        uint64_t *offset) {
    struct lane *l = *hv_wire_lane(w);
    return l && block_find(p, 1, l, region, offset);
}

/* The lane of w: 0 not tried yet, 1 none (why says why), 2 the VM's device region,
   3 memfds; *staged whether the staging slots are there. */
HV_EXPORT int hvgpu_client_lane(struct wire *w, int *staged, const char **why) {
    struct lane *l = *hv_wire_lane(w);
    *staged = l && l->staged;
    *why = l ? l->why : "";
    if (!l || !l->tried) return 0;
    return l->mode == LANE_DEVICE ? 2 : l->mode == LANE_MEMFD ? 3 : 1;
}

/* wire.c, closing a standalone wire (held): its pinned blocks stay mapped for the
   program (their views may still be read) but name no region any more; its staging
   slots, and the device region where nothing in it is handed out, are unmapped. */
void hv_lane_close(struct wire *w) {
    struct lane *l = *hv_wire_lane(w);
    if (!l) return;
    int in_device = 0;
    pthread_mutex_lock(&blocks_lock);
    for (size_t i = 0; i < nblocks; i++) {
        if (blocks[i].owner != l) continue;
        blocks[i].owner = NULL;
        in_device |= !blocks[i].whole;
    }
    pthread_mutex_unlock(&blocks_lock);
    if (l->staged && l->mode == LANE_MEMFD)
        munmap(l->stage, HVGPU_STAGE_SLOTS * HVGPU_STAGE_CHUNK);
    if (l->mode == LANE_DEVICE && !in_device) munmap(l->device_base, l->device_size);
    free(l);
    *hv_wire_lane(w) = NULL;
}
