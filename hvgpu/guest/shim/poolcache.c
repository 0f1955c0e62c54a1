/* Freed blocks of stream-ordered pools, kept in the guest for the next allocation.
 *
 * Frameworks' stream-ordered allocators (PyTorch's backend:cudaMallocAsync,
 * XLA's) allocate and free every tensor, and an allocation through the shim is
 * a round trip. So, as the driver's own pools do, a freed block is kept for
 * reuse: cuMemFreeAsync of a pool allocation parks it here, tagged with its
 * pool, the stream it was freed on and its size, instead of sending
 * MEM_FREE_ASYNC, while the pool's release threshold allows (a pool keeps at
 * most that many bytes; the threshold is 0, keeping nothing, until the program
 * raises it). An allocation from the same pool, of the same size, on the same
 * stream takes it back with no round trip: stream order makes that safe, the
 * free came earlier on that stream. A block is never handed to another stream
 * (that would need an event dependency); such an allocation is a real one.
 *
 * The size rule: sizes are rounded up to 512 bytes, and the rounded size is what
 * the executor is asked for. 512 is the step the driver's pools are seen to hand
 * out blocks in (and the test double's), so a kept block is exactly what its pool
 * counts as used, and USED_MEM_CURRENT can be answered without it; frameworks
 * repeat a step's sizes exactly, so a coarser rule would only hand out bigger
 * blocks than asked.
 *
 * A kept block is still allocated on the executor, so it stays charged to the
 * VM's quota; to the program it is freed memory: it is not in the range table
 * (freeing it again is refused) and copies into it are refused (state.c keeps
 * its range). It is really freed, one-way and on the stream it was freed on:
 * oldest first when its pool would keep more than the threshold; all of a
 * pool's when an allocation from it runs out of memory (which is then tried
 * once more) and before the pool is trimmed or destroyed; a stream's before the
 * stream is destroyed. What is kept at exit the executor frees with the
 * connection. A forked child forgets the parent's (they are the parent's
 * executor's memory). A kept block of a size that does not come again stays
 * kept until its pool runs out of memory, where the driver's pool would reuse
 * its memory for other sizes: a program whose sizes keep changing fills more of
 * its slice before it reuses.
 *
 * Talks to the agent only to free what it gives up and to wait for those frees;
 * it must never hand a block to another pool, vGPU or stream than its own.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define STEP 512u
#define FIRST_SLOTS 256u
#define MAX_WAITS 16 /* streams waited for one by one; past that, their vGPU's context */

enum { OPEN, CLOSING, GONE };

struct pool;

struct block {
    CUdeviceptr ptr;
    size_t size;                 /* as allocated on the executor: a multiple of STEP */
    int device;
    int kept;                    /* freed by the program, kept here */
    struct pool *pool;
    uintptr_t stream;            /* kept: the stream it was freed on, as the program named it */
    struct block *by_ptr;        /* the next in its slot of `tracked` */
    struct block *prev, *next;   /* kept: its slot of `kept`; given up: the list to free */
    struct block *older, *newer; /* kept: its pool's, in the order they were freed */
};

struct pool {
    int device;
    uint64_t handle;             /* the executor's number */
    uint64_t threshold;          /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: the most it keeps */
    uint64_t kept_bytes, live_bytes;
    uint64_t high;               /* the most live_bytes has been since made or reset */
    int kept_since_reset;        /* USED_MEM_HIGH is then `high`: the driver's is not the
                                    program's once blocks are kept and taken back */
    int state;                   /* OPEN; CLOSING or GONE: keeps and hands out nothing */
    unsigned marks;              /* HV_POOL_SHARED: keeps nothing; HV_POOL_IMPORTED */
    size_t blocks;               /* tracked here, live or kept */
    struct block *oldest, *newest;
    struct pool *next;
};

struct table { struct block **slot; size_t n, mask; };
struct list { struct block *head, *tail; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool *pools;
static struct table tracked; /* every block allocated through the shim, by (vGPU, address) */
static struct table kept;    /* kept blocks, by (pool, stream, size) */
static uint64_t kept_total;  /* every pool's kept bytes; read without the lock */
static uint64_t allocations, reuses;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static size_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (size_t)x;
}

static size_t ptr_hash(int device, CUdeviceptr ptr) { return mix(ptr ^ ((uint64_t)device << 56)); }

static size_t key_hash(const struct pool *p, uintptr_t stream, size_t size) {
    return mix((uintptr_t)p ^ mix(stream ^ mix(size)));
}

static int full(const struct table *t) { return t->n >= (t->slot ? t->mask + 1 : 0); }

static struct block **new_slots(struct table *t, size_t *cap) {
    *cap = t->slot ? 2 * (t->mask + 1) : FIRST_SLOTS;
    return calloc(*cap, sizeof(struct block *));
}

static void put_tracked(struct block **slot, size_t mask, struct block *b) {
    struct block **s = &slot[ptr_hash(b->device, b->ptr) & mask];
    b->by_ptr = *s;
    *s = b;
}

static void put_kept(struct block **slot, size_t mask, struct block *b) {
    struct block **s = &slot[key_hash(b->pool, b->stream, b->size) & mask];
    b->prev = NULL;
    b->next = *s;
    if (*s) (*s)->prev = b;
    *s = b;
}

static int grow_tracked(void) {
    size_t cap;
    struct block **slot = new_slots(&tracked, &cap);
    if (!slot) return 0;
    for (size_t i = 0; tracked.slot && i <= tracked.mask; i++)
        for (struct block *b = tracked.slot[i], *next; b; b = next) {
            next = b->by_ptr;
            put_tracked(slot, cap - 1, b);
        }
    free(tracked.slot);
    tracked.slot = slot;
    tracked.mask = cap - 1;
    return 1;
}

static int grow_kept(void) {
    size_t cap;
    struct block **slot = new_slots(&kept, &cap);
    if (!slot) return 0;
    for (size_t i = 0; kept.slot && i <= kept.mask; i++)
        for (struct block *b = kept.slot[i], *next; b; b = next) {
            next = b->next;
            put_kept(slot, cap - 1, b);
        }
    free(kept.slot);
    kept.slot = slot;
    kept.mask = cap - 1;
    return 1;
}

static struct block *find(int device, CUdeviceptr ptr) {
    if (!tracked.slot) return NULL;
    for (struct block *b = tracked.slot[ptr_hash(device, ptr) & tracked.mask]; b; b = b->by_ptr)
        if (b->ptr == ptr && b->device == device) return b;
    return NULL;
}

static void untrack(struct block *b) {
    for (struct block **s = &tracked.slot[ptr_hash(b->device, b->ptr) & tracked.mask]; *s;
         s = &(*s)->by_ptr)
        if (*s == b) {
            *s = b->by_ptr;
            tracked.n--;
            break;
        }
    b->pool->blocks--;
}

static void at_exit(void);
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }

/* The child's blocks are not the parent's: they are the parent's executor's memory. */
static void in_child(void) {
    pthread_mutex_init(&lock, NULL);
    for (size_t i = 0; tracked.slot && i <= tracked.mask; i++)
        for (struct block *b = tracked.slot[i], *next; b; b = next) {
            next = b->by_ptr;
            free(b);
        }
    for (struct pool *p = pools, *next; p; p = next) {
        next = p->next;
        free(p);
    }
    free(tracked.slot);
    free(kept.slot);
    memset(&tracked, 0, sizeof tracked);
    memset(&kept, 0, sizeof kept);
    pools = NULL;
    kept_total = allocations = reuses = 0;
    hv_kept_forget();
}

static void setup(void) {
    atexit(at_exit); /* registered after wire.c's table, so it is printed before it */
    pthread_atfork(before_fork, after_fork, in_child);
}

/* The guest's record of a pool; made (threshold 0) when `make`: each pool the executor
   serves a connection is made for it, as CUDA's start at 0, and only this process sets it. */
static struct pool *pool_of(int device, uint64_t handle, int make) {
    for (struct pool *p = pools; p; p = p->next)
        if (p->device == device && p->handle == handle) return p;
    struct pool *p = make ? calloc(1, sizeof *p) : NULL;
    if (p) {
        pthread_once(&once, setup);
        p->device = device;
        p->handle = handle;
        p->next = pools;
        pools = p;
    }
    return p;
}

static void drop_if_gone(struct pool *p) {
    if (p->state != GONE || p->blocks) return;
    for (struct pool **q = &pools; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            free(p);
            return;
        }
}

static void note_live(struct pool *p, size_t size) {
    p->live_bytes += size;
    if (p->live_bytes > p->high) p->high = p->live_bytes;
}

static int park(struct block *b, CUstream stream) {
    if (full(&kept) && !grow_kept()) return 0;
    struct pool *p = b->pool;
    b->stream = (uintptr_t)stream;
    put_kept(kept.slot, kept.mask, b);
    kept.n++;
    b->older = p->newest;
    b->newer = NULL;
    if (p->newest) p->newest->newer = b; else p->oldest = b;
    p->newest = b;
    b->kept = 1;
    p->kept_bytes += b->size;
    p->live_bytes -= b->size;
    p->kept_since_reset = 1;
    __atomic_add_fetch(&kept_total, b->size, __ATOMIC_RELAXED);
    hv_kept_add(b->device, b->ptr, b->size);
    return 1;
}

static void unpark(struct block *b) {
    struct pool *p = b->pool;
    if (b->prev) b->prev->next = b->next;
    else kept.slot[key_hash(p, b->stream, b->size) & kept.mask] = b->next;
    if (b->next) b->next->prev = b->prev;
    kept.n--;
    if (b->older) b->older->newer = b->newer; else p->oldest = b->newer;
    if (b->newer) b->newer->older = b->older; else p->newest = b->older;
    b->kept = 0;
    p->kept_bytes -= b->size;
    __atomic_sub_fetch(&kept_total, b->size, __ATOMIC_RELAXED);
    hv_kept_remove(b->device, b->ptr);
}

/* A kept block given up: no longer kept or tracked, to be freed for real. */
static void give_up(struct block *b, struct list *out) {
    unpark(b);
    untrack(b);
    b->next = NULL;
    if (out->tail) out->tail->next = b; else out->head = b;
    out->tail = b;
}

/* The pool's oldest kept blocks, until it keeps at most `limit` bytes. */
static void evict(struct pool *p, uint64_t limit, struct list *out) {
    while (p->oldest && p->kept_bytes > limit) give_up(p->oldest, out);
}

/* Frees for real, after the lock is let go: one-way frames on the streams the program
   freed them on; with `wait`, then waits for those streams. */
static CUresult release(struct list *given, int wait) {
    struct { int device; uintptr_t stream; } waits[MAX_WAITS];
    int n = 0;
    unsigned whole = 0; /* vGPUs whose context is waited for instead */
    CUresult first = CUDA_SUCCESS, r;
    for (struct block *b = given->head, *next; b; b = next) {
        next = b->next;
        hvgpu_mem_free_async_req_t q = { b->ptr, hv_untag((void *)b->stream) };
        r = HV_ON(b->device, hv_oneway(HVGPU_OP_MEM_FREE_ASYNC, &q, sizeof q, NULL, 0));
        if (r && !first) first = r;
        int i = 0;
        while (wait && i < n && (waits[i].device != b->device || waits[i].stream != b->stream)) i++;
        if (wait && i == n && n < MAX_WAITS) {
            waits[n].device = b->device;
            waits[n++].stream = b->stream;
        } else if (wait && i == n) {
            whole |= 1u << b->device;
        }
        free(b);
    }
    for (int i = 0; i < n; i++) {
        if (whole & (1u << waits[i].device)) continue;
        r = HV_ON(waits[i].device, cuStreamSynchronize((CUstream)waits[i].stream));
        if (r && !first) first = r;
    }
    for (int d = 0; d < HV_MAX_DEVICES; d++) {
        if (!(whole & (1u << d))) continue;
        r = HV_ON(d, cuCtxSynchronize());
        if (r && !first) first = r;
    }
    return first;
}

size_t hv_pool_block_size(size_t size) {
    return size > SIZE_MAX - (STEP - 1) ? size : (size + STEP - 1) & ~(size_t)(STEP - 1);
}

int hv_pool_take(int device, uint64_t pool, CUstream stream, size_t size, CUdeviceptr *ptr) {
    if (!__atomic_load_n(&kept_total, __ATOMIC_RELAXED)) return 0;
    struct block *b = NULL;
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    if (p && p->state == OPEN && kept.slot)
        for (b = kept.slot[key_hash(p, (uintptr_t)stream, size) & kept.mask]; b; b = b->next)
            if (b->pool == p && b->stream == (uintptr_t)stream && b->size == size) break;
    if (b) {
        unpark(b);
        note_live(p, b->size);
        *ptr = b->ptr;
        __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&reuses, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&lock);
    return b != NULL;
}

void hv_pool_track(int device, uint64_t pool, CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&lock);
    __atomic_add_fetch(&allocations, 1, __ATOMIC_RELAXED);
    struct block *stale = find(device, ptr);
    if (stale && !stale->kept) { /* its free was never seen; the executor's word wins */
        stale->pool->live_bytes -= stale->size;
        untrack(stale);
        drop_if_gone(stale->pool);
        free(stale);
    }
    struct pool *p = pool_of(device, pool, 1);
    struct block *b = p ? calloc(1, sizeof *b) : NULL;
    if (b && (full(&tracked) && !grow_tracked())) {
        free(b);
        b = NULL;
    }
    if (b) { /* else untracked: its free is sent as it always was */
        b->ptr = ptr;
        b->size = size;
        b->device = device;
        b->pool = p;
        put_tracked(tracked.slot, tracked.mask, b);
        tracked.n++;
        p->blocks++;
        note_live(p, size);
    }
    pthread_mutex_unlock(&lock);
}

int hv_pool_keep(int device, CUdeviceptr ptr, CUstream stream) {
    struct list gone = { NULL, NULL };
    int is_kept = 0;
    pthread_mutex_lock(&lock);
    struct block *b = find(device, ptr);
    if (b && !b->kept) {
        struct pool *p = b->pool;
        /* a shared pool's free must reach the executor, which withdraws its export */
        if (p->state == OPEN && !(p->marks & HV_POOL_SHARED) && b->size <= p->threshold) {
            evict(p, p->threshold - b->size, &gone);
            is_kept = park(b, stream);
        }
        if (!is_kept) {
            p->live_bytes -= b->size;
            untrack(b);
            drop_if_gone(p);
            free(b);
        }
    }
    pthread_mutex_unlock(&lock);
    release(&gone, 0); /* a lost connection is the program's next call's error */
    return is_kept;
}

CUresult hv_pool_release(int device, uint64_t pool, int *released) {
    struct list gone = { NULL, NULL };
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    if (p) evict(p, 0, &gone);
    pthread_mutex_unlock(&lock);
    if (released) *released = gone.head != NULL;
    return release(&gone, 1);
}

CUresult hv_pool_release_stream(CUstream stream) {
    if (!__atomic_load_n(&kept_total, __ATOMIC_RELAXED)) return CUDA_SUCCESS;
    int device = hv_tag_device(stream);
    struct list gone = { NULL, NULL };
    pthread_mutex_lock(&lock);
    for (struct pool *p = pools; p; p = p->next) {
        if (p->device != device) continue;
        for (struct block *b = p->oldest, *newer; b; b = newer) {
            newer = b->newer;
            if (b->stream == (uintptr_t)stream) give_up(b, &gone);
        }
    }
    pthread_mutex_unlock(&lock);
    return release(&gone, 0);
}

void hv_pool_set_threshold(int device, uint64_t pool, uint64_t threshold) {
    struct list gone = { NULL, NULL };
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 1);
    if (p) {
        p->threshold = threshold;
        evict(p, threshold, &gone);
    }
    pthread_mutex_unlock(&lock);
    release(&gone, 0);
}

uint64_t hv_pool_used(int device, uint64_t pool, int high, uint64_t driver) {
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    if (p && !high) /* the driver counts kept blocks as used: the program freed them */
        driver = driver > p->kept_bytes ? driver - p->kept_bytes : 0;
    else if (p && p->kept_since_reset) /* and never sees a kept block taken back */
        driver = p->high;
    pthread_mutex_unlock(&lock);
    return driver;
}

void hv_pool_reset_high(int device, uint64_t pool) {
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    if (p) {
        p->high = p->live_bytes;
        p->kept_since_reset = p->kept_bytes > 0;
    }
    pthread_mutex_unlock(&lock);
}

void hv_pool_closing(int device, uint64_t pool) {
    struct list gone = { NULL, NULL };
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 1);
    if (p) {
        p->state = CLOSING;
        evict(p, 0, &gone);
    }
    pthread_mutex_unlock(&lock);
    release(&gone, 0); /* ahead of the destroy on the same connection */
}

void hv_pool_destroyed(int device, uint64_t pool, int ok) {
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    if (p) {
        p->state = ok ? GONE : OPEN;
        drop_if_gone(p);
    }
    pthread_mutex_unlock(&lock);
}

void hv_pool_mark(int device, uint64_t pool, unsigned marks) {
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 1);
    if (p) p->marks |= marks;
    pthread_mutex_unlock(&lock);
}

unsigned hv_pool_marks(int device, uint64_t pool) {
    pthread_mutex_lock(&lock);
    struct pool *p = pool_of(device, pool, 0);
    unsigned marks = p ? p->marks : 0;
    pthread_mutex_unlock(&lock);
    return marks;
}

/* Bytes of freed pool blocks the guest keeps now, all pools together: for tests and
   benchmarks in the same process (dlsym), as hvgpu_shim_round_trips. */
HV_EXPORT uint64_t hvgpu_shim_pool_kept(void) {
    return __atomic_load_n(&kept_total, __ATOMIC_RELAXED);
}

/* What is kept at exit is left to the executor, which frees a connection's pool memory
   on its streams when the connection goes: a free sent from here could wait on the
   connection's lock, held by a thread that is still waiting for a reply. */
static void at_exit(void) {
    if (hv_stats_enabled() && __atomic_load_n(&allocations, __ATOMIC_RELAXED))
        hv_log("stream-ordered allocations: %llu, %llu of them freed blocks kept in the guest "
               "(no round trip); %llu bytes kept at exit, freed by the executor",
               (unsigned long long)__atomic_load_n(&allocations, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&reuses, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&kept_total, __ATOMIC_RELAXED));
}
