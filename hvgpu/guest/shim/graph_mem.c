/* Graph memory in the guest: which addresses allocation nodes returned, and while
 * which of them the program may name as device memory.
 *
 * The executor's driver makes allocation and free nodes (graph.c sends them, and
 * cuMemAllocAsync/cuMemFreeAsync on a capturing stream, pool.c); an allocation's
 * address is fixed for its graph's life. Here each address is a device range of its
 * own kind (HV_RANGE_GRAPH) as long as a graph or instantiation of this process holds
 * its node, or a launch left it live (allocated, not yet freed by a free node, cuMemFree
 * or cuMemFreeAsync): copies, memsets and cuPointerGetAttribute treat it as device
 * memory meanwhile, and cuMemFree sends it to the executor. After that the address may
 * be another's: the range goes. The executor keeps the same books and judges every use;
 * these only route the program's calls.
 *
 * An instantiation that allocates or frees is launched with a round trip, so that the
 * driver's refusal of a relaunch with its allocations unfreed
 * (CUDA_ERROR_INVALID_VALUE, unless CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
 * is the launch's own answer, as the driver gives it.
 *
 * Must not touch the memory: it is the executor's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

struct gm { int device; CUdeviceptr ptr; size_t size; int refs, live; struct gm *next; };
struct holder { void *key; int is_exec; int na, nf, capa, capf; CUdeviceptr *a, *f;
                struct holder *next; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct gm *allocs;
static struct holder *holders;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A forked child has a connection, so graphs, of its own: the parent's are not its. */
static void child_after_fork(void) {
    pthread_mutex_init(&lock, NULL);
    allocs = NULL;
    holders = NULL;
}

static void watch_fork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

static struct gm *find(int device, CUdeviceptr ptr) {
    for (struct gm *g = allocs; g; g = g->next)
        if (g->device == device && g->ptr == ptr) return g;
    return NULL;
}

static struct holder *holder(void *key, int is_exec, int make) {
    for (struct holder *h = holders; h; h = h->next)
        if (h->key == key && h->is_exec == is_exec) return h;
    if (!make) return NULL;
    struct holder *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->key = key;
    h->is_exec = is_exec;
    h->next = holders;
    holders = h;
    return h;
}

static int push(CUdeviceptr **v, int *n, int *cap, CUdeviceptr p) {
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 4;
        CUdeviceptr *w = realloc(*v, sizeof *w * (size_t)c);
        if (!w) return 0;
        *v = w;
        *cap = c;
    }
    (*v)[(*n)++] = p;
    return 1;
}

/* The range goes once nothing holds the address and it is not live (lock held). */
static void drop_if_unused(struct gm *g) {
    if (g->refs > 0 || g->live) return;
    struct gm **p = &allocs;
    while (*p != g) p = &(*p)->next;
    *p = g->next;
    hv_range_remove(g->device, g->ptr, HV_RANGE_GRAPH);
    free(g);
}

void hv_gm_alloc(void *graph, int device, CUdeviceptr ptr, size_t size) {
    pthread_once(&fork_once, watch_fork);
    pthread_mutex_lock(&lock);
    struct gm *g = find(device, ptr);
    if (!g && (g = calloc(1, sizeof *g))) {
        *g = (struct gm){ device, ptr, size, 0, 0, allocs };
        allocs = g;
        HV_ON(device, (hv_range_add(ptr, size, HV_RANGE_GRAPH), CUDA_SUCCESS));
    }
    struct holder *h = g ? holder(graph, 0, 1) : NULL;
    if (h && push(&h->a, &h->na, &h->capa, ptr)) g->refs++;
    pthread_mutex_unlock(&lock);
}

void hv_gm_free(void *graph, CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    struct holder *h = holder(graph, 0, 1);
    if (h) push(&h->f, &h->nf, &h->capf, ptr);
    pthread_mutex_unlock(&lock);
}

int hv_gm_has(void *key, int is_exec) {
    pthread_mutex_lock(&lock);
    struct holder *h = holders ? holder(key, is_exec, 0) : NULL;
    int has = h && (h->na || h->nf);
    pthread_mutex_unlock(&lock);
    return has;
}

void hv_gm_instantiated(void *graph, void *exec) {
    pthread_mutex_lock(&lock);
    struct holder *g = holder(graph, 0, 0), *e = g ? holder(exec, 1, 1) : NULL;
    int device = hv_tag_device(graph);
    for (int i = 0; e && i < g->na; i++) {
        struct gm *m = find(device, g->a[i]);
        if (m && push(&e->a, &e->na, &e->capa, g->a[i])) m->refs++;
    }
    for (int i = 0; e && i < g->nf; i++) push(&e->f, &e->nf, &e->capf, g->f[i]);
    pthread_mutex_unlock(&lock);
}

void hv_gm_launched(void *exec) {
    pthread_mutex_lock(&lock);
    struct holder *e = holder(exec, 1, 0);
    int device = hv_tag_device(exec);
    for (int i = 0; e && i < e->nf; i++) {
        struct gm *m = find(device, e->f[i]);
        if (m) m->live = 0;
    }
    for (int i = 0; e && i < e->na; i++) {
        int freed = 0;
        for (int k = 0; k < e->nf && !freed; k++) freed = e->f[k] == e->a[i];
        struct gm *m = find(device, e->a[i]);
        if (m && !freed) m->live = 1;
    }
    pthread_mutex_unlock(&lock);
}

int hv_gm_freed(int device, CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    struct gm *m = find(device, ptr);
    if (m) {
        m->live = 0;
        drop_if_unused(m);
    }
    pthread_mutex_unlock(&lock);
    return m != NULL;
}

void hv_gm_gone(void *key, int is_exec) {
    pthread_mutex_lock(&lock);
    struct holder **p = &holders;
    while (*p && ((*p)->key != key || (*p)->is_exec != is_exec)) p = &(*p)->next;
    struct holder *h = *p;
    if (h) {
        *p = h->next;
        int device = hv_tag_device(key);
        for (int i = 0; i < h->na; i++) {
            struct gm *m = find(device, h->a[i]);
            if (m) {
                m->refs--;
                drop_if_unused(m);
            }
        }
        free(h->a);
        free(h->f);
        free(h);
    }
    pthread_mutex_unlock(&lock);
}
