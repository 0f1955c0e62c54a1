/* What of a captured graph lives in the guest: copies of pageable memory and host
 * functions, which the executor's graph cannot reach or run.
 *
 * A copy between the device and the program's pageable memory on a capturing stream
 * is captured as a copy between the device and a room of pinned memory in the
 * region (region_lane.c), made for the graph; the graph keeps a
 * *delivery*: before each launch, the program's source bytes are copied into the
 * room (the driver's graph reads pageable memory when it runs, and the program's
 * bytes at launch are what it wrote before launching); after the launch, the room's
 * bytes are copied to the program's destination once a synchronising call says the
 * launch is done (cuStreamSynchronize or cuStreamQuery of its stream, an event
 * recorded after it, cuCtxSynchronize), as a device-to-host copy into pinned memory
 * is there for the program at its next synchronisation.
 *
 * A host function (cuLaunchHostFunc, cuStreamAddCallback) on a capturing stream
 * splits the graph: the capture so far ends on the executor as one *part*, the
 * function is kept, and the capture begins again. Launching the graph launches
 * each part in turn and, between them, waits for the part before and runs the
 * function in the launching thread, in order (so that launch returns once the last
 * host function has run, as a host function outside a graph blocks here too).
 *
 * A graph built node by node (cuGraphCreate) has a *shadow* here: every node-adding
 * request as it went to the executor, its dependencies and the edges added later, so
 * that host nodes (cuGraphAddHostNode), which only the guest can run, can be placed:
 * at instantiation the graph is cut into parts by how many host nodes lie on the
 * longest path to each node, each part is built again on the executor with the edges
 * inside it (the ones across parts hold by the order of the parts), and the host
 * nodes of each depth run, in order, after that depth's part and before the next.
 *
 * A graph or instantiation with deliveries or parts has a *record* here, found by
 * the handle the program holds (its first part's); one without is only the
 * executor's. The rooms are given back when the last graph, instantiation and
 * pending delivery that use them have gone.
 *
 * Must not touch the program's memory except at a delivery, between the addresses the
 * program's own copy named.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

struct delivery {
    void *user;     /* the program's memory */
    void *room;     /* pinned memory in the region, which the executor's graph copies */
    size_t n;
    int to_host;    /* 1: device to host (after the launch); 0: host to device (before) */
    int part;       /* the part whose launch copies it */
};

struct rooms { /* shared by a graph, its instantiations and pending deliveries */
    int refs;
    int n, cap;
    struct delivery *d;
};

struct step { uint64_t handle; void (*fn)(void *); void (*cb)(CUstream, CUresult, void *);
              void *data; CUstream stream;
              uint64_t graph; /* a hand-built graph's part: kept while its instantiation is,
                                 so that its nodes can still be named (set-params) */ };

/* Where a node of a hand-built graph went at instantiation: its part and its handle
   there. */
struct nmap { void *node; int step; uint64_t part_node; };

struct hv_captured {
    struct rooms *rooms; /* NULL until a pageable copy */
    int n, cap;
    struct step *steps;  /* the parts ended so far, each with the function after it */
};

struct record {
    void *key;           /* what the program holds: its first part's handle, tagged */
    int device, is_exec;
    int n;
    struct step *steps;  /* graph or exec handles (untagged) and the function after each */
    struct rooms *rooms;
    int nmap, nbase;
    struct nmap *map;    /* an instantiation of a hand-built graph: its nodes' places (the
                            first nbase its own graph's, then those of the graph it was
                            last updated from) */
    struct record *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct record *records;

struct pending { int device; CUstream stream; unsigned long long seq; struct delivery d;
                 struct rooms *rooms; };
static struct pending *pendings;
static int npending, cap_pending;
static unsigned long long launches; /* counts launches with deliveries pending after them */

static void rooms_drop(struct rooms *r) {
    if (!r) return;
    pthread_mutex_lock(&lock);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&lock);
    if (!last) return;
    for (int i = 0; i < r->n; i++) {
        CUresult e;
        hv_region_host_free(r->d[i].room, &e);
    }
    free(r->d);
    free(r);
}

static int grow(void **p, int *cap, int need, size_t each) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap * 2 : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * each);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* -- during a capture ---------------------------------------------------------------- */

int hv_captured_copy(struct hv_captured **c, CUdeviceptr dptr, void *user, size_t n,
                     int to_host, CUstream stream, CUresult *r) {
    void *room = NULL;
    CUresult e = CUDA_SUCCESS;
    if (!hv_region_host_alloc(&room, n, 0, &e)) return 0; /* no room: the caller refuses it */
    if (e) { /* an earlier one-way frame's error, reported here */
        *r = e;
        return 1;
    }
    if (!*c && !(*c = calloc(1, sizeof **c))) goto fail;
    if (!(*c)->rooms && !((*c)->rooms = calloc(1, sizeof *(*c)->rooms))) goto fail;
    struct rooms *rs = (*c)->rooms;
    rs->refs = 1;
    if (!grow((void **)&rs->d, &rs->cap, rs->n + 1, sizeof *rs->d)) goto fail;
    rs->d[rs->n++] = (struct delivery){ user, room, n, to_host, (*c)->n };
    if (to_host) {
        if (!hv_region_dtoh(room, dptr, n, stream, 0, r)) *r = CUDA_ERROR_NOT_SUPPORTED;
    } else {
        memcpy(room, user, n);
        if (!hv_region_htod(dptr, room, n, stream, 0, r)) *r = CUDA_ERROR_NOT_SUPPORTED;
    }
    return 1;
fail:
    hv_region_host_free(room, &e);
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    return 1;
}

int hv_captured_split(struct hv_captured **c, uint64_t part, void (*fn)(void *),
                      void (*cb)(CUstream, CUresult, void *), void *data, CUstream stream) {
    if (!*c && !(*c = calloc(1, sizeof **c))) return 0;
    if (!grow((void **)&(*c)->steps, &(*c)->cap, (*c)->n + 1, sizeof *(*c)->steps)) return 0;
    (*c)->steps[(*c)->n++] = (struct step){ part, fn, cb, data, stream, 0 };
    return 1;
}

/* Parts already ended on the executor, for a capture that failed: destroyed there. */
void hv_captured_drop(struct hv_captured *c, int device) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        hv_call_handle(device, HVGPU_OP_GRAPH_DESTROY, c->steps[i].handle);
    }
    rooms_drop(c->rooms);
    free(c->steps);
    free(c);
}

static void *add_record(int device, int is_exec, struct step *steps, int n, struct rooms *rooms) {
    if (!steps[0].handle) return NULL; /* the key is the first part's handle */
    struct record *rec = calloc(1, sizeof *rec);
    if (!rec) return NULL;
    rec->device = device;
    rec->is_exec = is_exec;
    rec->steps = steps;
    rec->n = n;
    rec->rooms = rooms;
    rec->key = hv_tag(device, steps[0].handle);
    pthread_mutex_lock(&lock);
    rec->next = records;
    records = rec;
    pthread_mutex_unlock(&lock);
    return rec->key;
}

void *hv_captured_finish(struct hv_captured *c, int device, uint64_t last) {
    if (!c) return hv_tag(device, last);
    if (!grow((void **)&c->steps, &c->cap, c->n + 1, sizeof *c->steps)) {
        hv_captured_drop(c, device);
        return NULL;
    }
    c->steps[c->n++] = (struct step){ last, NULL, NULL, NULL, NULL, 0 };
    void *key = add_record(device, 0, c->steps, c->n, c->rooms);
    if (!key) {
        c->n--;
        hv_captured_drop(c, device);
        return NULL;
    }
    free(c);
    return key;
}

/* -- records -------------------------------------------------------------------------- */

static struct record *take(void *key, int is_exec, int unlink) {
    pthread_mutex_lock(&lock);
    struct record **p = &records;
    while (*p && ((*p)->key != key || (*p)->is_exec != is_exec)) p = &(*p)->next;
    struct record *rec = *p;
    if (rec && unlink) *p = rec->next;
    pthread_mutex_unlock(&lock);
    return rec;
}

int hv_graph_recorded(void *key, int is_exec, int *parts) {
    struct record *rec = take(key, is_exec, 0);
    if (rec && parts) *parts = rec->n;
    return rec != NULL;
}

int hv_graph_destroy(void *key, int is_exec, CUresult *r) {
    struct record *rec = take(key, is_exec, 1);
    if (!rec) return 0;
    *r = CUDA_SUCCESS;
    for (int i = 0; i < rec->n; i++) {
        if (!rec->steps[i].handle) continue; /* a host node's step */
        CUresult e = hv_call_handle(rec->device, is_exec ? HVGPU_OP_GRAPH_EXEC_DESTROY
                                                : HVGPU_OP_GRAPH_DESTROY, rec->steps[i].handle);
        if (!*r) *r = e;
        if (rec->steps[i].graph) hv_call_handle(rec->device, HVGPU_OP_GRAPH_DESTROY,
                                                rec->steps[i].graph);
    }
    rooms_drop(rec->rooms);
    free(rec->steps);
    free(rec->map);
    free(rec);
    return 1;
}

/* cuGraphClone of a recorded graph: each part cloned on the executor, the functions
   between them and the rooms (shared, as an instantiation shares them) kept alike. */
int hv_graph_clone(void *graph, void **clone, CUresult *r) {
    struct record *g = take(graph, 0, 0);
    if (!g) return 0;
    *clone = NULL;
    struct step *steps = calloc((size_t)g->n, sizeof *steps);
    if (!steps) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return 1;
    }
    *r = CUDA_SUCCESS;
    int made = 0;
    for (; made < g->n && !*r; made++) {
        steps[made] = g->steps[made];
        if (!g->steps[made].handle) continue;
        hvgpu_graph_clone_req_t q = { g->steps[made].handle };
        hvgpu_graph_clone_rep_t v;
        *r = HV_ON(g->device, hv_call(HVGPU_OP_GRAPH_CLONE, &q, sizeof q, NULL, 0, &v,
                                      sizeof v, NULL, NULL, 0));
        steps[made].handle = *r ? 0 : v.clone;
    }
    if (!*r) {
        pthread_mutex_lock(&lock);
        if (g->rooms) g->rooms->refs++;
        pthread_mutex_unlock(&lock);
        *clone = add_record(g->device, 0, steps, g->n, g->rooms);
        if (*clone) return 1;
        rooms_drop(g->rooms);
        *r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < made; i++)
        if (steps[i].handle) hv_call_handle(g->device, HVGPU_OP_GRAPH_DESTROY, steps[i].handle);
    free(steps);
    return 1;
}

int hv_graph_parts(void *key, int is_exec, uint64_t *parts, int most) {
    pthread_mutex_lock(&lock);
    struct record **p = &records;
    while (*p && ((*p)->key != key || (*p)->is_exec != is_exec)) p = &(*p)->next;
    int n = 0;
    for (int i = 0; *p && i < (*p)->n && n < most; i++)
        if ((*p)->steps[i].handle) parts[n++] = (*p)->steps[i].handle;
    pthread_mutex_unlock(&lock);
    return *p ? n : -1;
}

int hv_graph_exec_node(void *exec, const void *node, uint64_t *parts, uint64_t *nodes,
                       int most) {
    struct record *e = take(exec, 1, 0);
    if (!e) return -1;
    if (!e->map) { /* captured: the program's node is one part's own; which, the executor
                      knows */
        int n = hv_graph_parts(exec, 1, parts, most);
        for (int i = 0; i < n; i++) nodes[i] = hv_untag(node);
        return n;
    }
    for (int i = 0; i < e->nmap && most > 0; i++)
        if (e->map[i].node == node) {
            parts[0] = e->steps[e->map[i].step].handle;
            nodes[0] = e->map[i].part_node;
            return 1;
        }
    return 0;
}

int hv_graph_instantiate(void *graph, unsigned long long flags, void **exec, CUresult *r) {
    struct record *g = take(graph, 0, 0);
    if (!g) return 0;
    struct step *steps = calloc((size_t)g->n, sizeof *steps);
    if (!steps) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return 1;
    }
    *r = CUDA_SUCCESS;
    int made = 0;
    for (; made < g->n; made++) {
        hvgpu_graph_instantiate_req_t q = { g->steps[made].handle, flags };
        hvgpu_graph_instantiate_rep_t v;
        *r = HV_ON(g->device, hv_call(HVGPU_OP_GRAPH_INSTANTIATE, &q, sizeof q, NULL, 0, &v,
                                      sizeof v, NULL, NULL, 0));
        if (*r) break;
        steps[made] = g->steps[made];
        steps[made].handle = v.exec;
    }
    if (!*r) {
        pthread_mutex_lock(&lock);
        if (g->rooms) g->rooms->refs++;
        pthread_mutex_unlock(&lock);
        *exec = add_record(g->device, 1, steps, g->n, g->rooms);
        if (*exec) return 1;
        rooms_drop(g->rooms);
        *r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < made; i++) hv_call_handle(g->device, HVGPU_OP_GRAPH_EXEC_DESTROY, steps[i].handle);
    free(steps);
    *exec = NULL;
    return 1;
}

int hv_graph_upload(void *exec, CUstream stream, CUresult *r) {
    struct record *e = take(exec, 1, 0);
    if (!e) return 0;
    *r = CUDA_SUCCESS;
    for (int i = 0; i < e->n && !*r; i++) {
        if (!e->steps[i].handle) continue;
        hvgpu_graph_upload_req_t q = { e->steps[i].handle, hv_untag(stream) };
        *r = HV_ON(e->device, hv_oneway(HVGPU_OP_GRAPH_UPLOAD, &q, sizeof q, NULL, 0));
    }
    return 1;
}

int hv_graph_count(void *graph, size_t *count, CUresult *r) {
    struct record *g = take(graph, 0, 0);
    if (!g) return 0;
    *count = 0;
    *r = CUDA_SUCCESS;
    for (int i = 0; i < g->n && !*r; i++) {
        hvgpu_graph_get_nodes_req_t q = { g->steps[i].handle, 0 };
        unsigned char rep[sizeof(hvgpu_graph_get_nodes_rep_t)];
        uint32_t got = 0;
        *r = HV_ON(g->device, hv_call(HVGPU_OP_GRAPH_GET_NODES, &q, sizeof q, NULL, 0, rep,
                                      sizeof rep, &got, NULL, 0));
        hvgpu_graph_get_nodes_rep_view_t v; /* the count alone: no nodes were asked */
        if (!*r && hvgpu_graph_get_nodes_rep_decode(rep, got, &v) >= 0) *count += v.fixed.count;
    }
    return 1;
}

/* -- launches and deliveries ---------------------------------------------------------- */

static void deliver(const struct delivery *d) { memcpy(d->user, d->room, d->n); }


int hv_graph_launch(void *exec, CUstream stream, CUresult *r) {
    struct record *e = take(exec, 1, 0);
    if (!e) return 0;
    *r = CUDA_SUCCESS;
    struct rooms *rs = e->rooms;
    for (int i = 0; i < e->n && !*r; i++) {
        for (int k = 0; rs && k < rs->n; k++)
            if (!rs->d[k].to_host && rs->d[k].part == i) memcpy(rs->d[k].room, rs->d[k].user,
                                                                rs->d[k].n);
        hvgpu_graph_launch_req_t q = { e->steps[i].handle, hv_untag(stream) };
        if (e->steps[i].handle) /* 0: a host function after the one before */
            *r = HV_ON(e->device, hv_oneway(HVGPU_OP_GRAPH_LAUNCH, &q, sizeof q, NULL, 0));
        const struct step *st = &e->steps[i];
        if (*r || (!st->fn && !st->cb)) continue;
        *r = HV_ON(e->device, cuStreamSynchronize(stream));
        for (int k = 0; !*r && rs && k < rs->n; k++) /* the function sees what came back */
            if (rs->d[k].to_host && rs->d[k].part == i) deliver(&rs->d[k]);
        if (st->fn && !*r) st->fn(st->data);
        if (st->cb) st->cb(st->stream, *r, st->data);
    }
    if (*r || !rs) return 1;
    pthread_mutex_lock(&lock);
    unsigned long long seq = ++launches;
    for (int k = 0; k < rs->n; k++) {
        if (!rs->d[k].to_host || rs->d[k].part != e->n - 1) continue;
        if (!grow((void **)&pendings, &cap_pending, npending + 1, sizeof *pendings)) {
            *r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        rs->refs++;
        pendings[npending++] = (struct pending){ e->device, hv_created(stream) ? stream
                                                 : hv_tag(e->device, hv_untag(stream)),
                                                 seq, rs->d[k], rs };
    }
    pthread_mutex_unlock(&lock);
    return 1;
}

/* Deliveries whose launch a synchronising call has just said is done: those of
   `stream` on `device` up to `upto` (0: any), or all of the device's (stream NULL
   with all set). */
static void settle(int device, CUstream stream, int all, unsigned long long upto) {
    if (!__atomic_load_n(&npending, __ATOMIC_ACQUIRE)) return;
    CUstream key = hv_created(stream) ? stream : hv_tag(device, hv_untag(stream));
    struct rooms *drop[64];
    int ndrop = 0;
    do {
        ndrop = 0;
        pthread_mutex_lock(&lock);
        for (int i = 0; i < npending && ndrop < 64;) {
            struct pending *p = &pendings[i];
            if (p->device == device && (all || p->stream == key) && (!upto || p->seq <= upto)) {
                deliver(&p->d);
                drop[ndrop++] = p->rooms;
                *p = pendings[--npending];
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&lock);
        for (int i = 0; i < ndrop; i++) rooms_drop(drop[i]);
    } while (ndrop == 64);
}

void hv_graph_synced_stream(CUstream stream) { settle(hv_tag_device(stream), stream, 0, 0); }
void hv_graph_synced_device(int device) { settle(device, NULL, 1, 0); }

#define EVENT_SLOTS 1024
static struct { CUevent event; CUstream stream; unsigned long long seq; } marks[EVENT_SLOTS];

void hv_graph_event_recorded(CUevent event, CUstream stream) {
    if (!__atomic_load_n(&npending, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&lock);
    size_t i = ((uintptr_t)event >> 3) % EVENT_SLOTS;
    marks[i].event = event;
    marks[i].stream = stream;
    marks[i].seq = launches;
    pthread_mutex_unlock(&lock);
}

void hv_graph_event_done(CUevent event) {
    if (!__atomic_load_n(&npending, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&lock);
    size_t i = ((uintptr_t)event >> 3) % EVENT_SLOTS;
    int found = marks[i].event == event;
    CUstream stream = marks[i].stream;
    unsigned long long seq = marks[i].seq;
    pthread_mutex_unlock(&lock);
    if (found && seq) settle(hv_tag_device(event), stream, 0, seq);
}

/* -- shadows of graphs built node by node ---------------------------------------------- */

#define HOST_MARK (1ull << 46) /* a host node's handle: no executor handle gets this high */

struct snode {
    int host;
    uint16_t op;
    unsigned char *fixed, *tail; /* the request's fixed fields and its field after deps */
    size_t fixed_len, deps_at, tail_len;
    int *deps, ndeps;            /* earlier nodes, by index */
    void (*fn)(void *);
    void *data;
    void *handle;                /* what the program holds */
    void *from;                  /* in a clone: the node of the original it copies */
};

struct shadow {
    void *graph;
    int device;
    int n, cap, hosts;
    struct snode *nodes;
    int nedges, cap_edges;
    int *edges; /* pairs: from, to */
    int clone;  /* a clone's: each node's `from` is the original's node it copies */
    struct shadow *next;
};

static struct shadow *shadows;
static uint64_t host_nodes; /* host node handles made: each is the process's only one */

static struct shadow *shadow_of(void *graph) {
    struct shadow *s = shadows;
    while (s && s->graph != graph) s = s->next;
    return s;
}

void hv_shadow_new(void *graph) {
    struct shadow *s = calloc(1, sizeof *s);
    if (!s) return; /* host nodes are then refused for this graph */
    s->graph = graph;
    s->device = hv_tag_device(graph);
    pthread_mutex_lock(&lock);
    s->next = shadows;
    shadows = s;
    pthread_mutex_unlock(&lock);
}

static void shadow_free(struct shadow *s) {
    for (int i = 0; i < s->n; i++) {
        free(s->nodes[i].fixed);
        free(s->nodes[i].tail);
        free(s->nodes[i].deps);
    }
    free(s->nodes);
    free(s->edges);
    free(s);
}

void hv_shadow_drop(void *graph) {
    pthread_mutex_lock(&lock);
    struct shadow **p = &shadows;
    while (*p && (*p)->graph != graph) p = &(*p)->next;
    struct shadow *s = *p;
    if (s) *p = s->next;
    pthread_mutex_unlock(&lock);
    if (s) shadow_free(s);
}

int hv_shadow_is_host(const void *node) {
    return hv_created(node) && (hv_untag(node) & HOST_MARK);
}

int hv_shadow_hosts(void *graph) {
    pthread_mutex_lock(&lock);
    struct shadow *s = shadow_of(graph);
    int n = s ? s->hosts : -1;
    pthread_mutex_unlock(&lock);
    return n;
}

static int index_of(struct shadow *s, const void *node) {
    for (int i = s->n - 1; i >= 0; i--) /* latest first: a node mostly depends on recent ones */
        if (s->nodes[i].handle == node) return i;
    return -1;
}

/* Records a node the graph now has (a host node has no request). 0: the shadow is
   dropped (out of memory), and with it the graph's host nodes' chance: said once. */
int hv_shadow_add(void *graph, const struct hv_node_request *q, void *const *deps, size_t ndeps,
                  void **node) {
    pthread_mutex_lock(&lock);
    struct shadow *s = shadow_of(graph);
    int ok = s != NULL;
    if (ok && !grow((void **)&s->nodes, &s->cap, s->n + 1, sizeof *s->nodes)) ok = 0;
    struct snode sn = { 0 };
    if (ok) {
        sn.host = q == NULL;
        sn.deps = malloc(sizeof(int) * (ndeps ? ndeps : 1));
        ok = sn.deps != NULL;
        for (size_t i = 0; ok && i < ndeps; i++) {
            int k = index_of(s, deps[i]);
            if (k < 0) ok = 0;
            else sn.deps[sn.ndeps++] = k;
        }
    }
    if (ok && q) {
        sn.op = q->op;
        sn.fixed_len = q->fixed_len;
        sn.deps_at = q->deps_at;
        sn.tail_len = q->tail_len;
        sn.fixed = malloc(q->fixed_len ? q->fixed_len : 1);
        sn.tail = malloc(q->tail_len ? q->tail_len : 1);
        ok = sn.fixed && sn.tail;
        if (ok) {
            memcpy(sn.fixed, q->fixed, q->fixed_len);
            if (q->tail_len) memcpy(sn.tail, q->tail, q->tail_len);
        }
    }
    if (ok && !q) {
        sn.handle = hv_tag(s->device, HOST_MARK | ++host_nodes);
        *node = sn.handle;
        s->hosts++;
    } else if (ok) {
        sn.handle = *node;
    }
    if (ok) s->nodes[s->n++] = sn;
    pthread_mutex_unlock(&lock);
    if (!ok) {
        free(sn.deps);
        free(sn.fixed);
        free(sn.tail);
    }
    return ok;
}

int hv_shadow_edge(void *graph, const void *from, const void *to) {
    pthread_mutex_lock(&lock);
    struct shadow *s = shadow_of(graph);
    int a = s ? index_of(s, from) : -1, b = s ? index_of(s, to) : -1;
    int ok = a >= 0 && b >= 0 &&
             grow((void **)&s->edges, &s->cap_edges, 2 * (s->nedges + 1), sizeof(int));
    if (ok) {
        s->edges[2 * s->nedges] = a;
        s->edges[2 * s->nedges + 1] = b;
        s->nedges++;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

void hv_shadow_set_host(void *node, void (*fn)(void *), void *data) {
    pthread_mutex_lock(&lock);
    for (struct shadow *s = shadows; s; s = s->next) {
        int k = index_of(s, node);
        if (k >= 0 && s->nodes[k].host) {
            s->nodes[k].fn = fn;
            s->nodes[k].data = data;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* Rebuilds node k in part graph `part` (its dependencies inside the part mapped to
   their new handles in made[]); 0 with *r set on failure. */
static int rebuild(const struct shadow *s, int k, uint64_t part, const int *depth,
                   const int *preds, const int *npreds, const int *pred_at, uint64_t *made,
                   CUresult *r) {
    const struct snode *sn = &s->nodes[k];
    if (sn->op == HVGPU_OP_GRAPH_ADD_CONDITIONAL_NODE) { /* its bodies are the driver's */
        hv_log("instantiating a graph with host nodes and a conditional node is not built "
               "by hvgpu: CUDA_ERROR_NOT_SUPPORTED");
        *r = CUDA_ERROR_NOT_SUPPORTED;
        return 0;
    }
    if (sn->op == HVGPU_OP_GRAPH_ADD_MEM_ALLOC_NODE || sn->op == HVGPU_OP_GRAPH_ADD_MEM_FREE_NODE) {
        /* rebuilt, an allocation node would have another address than the program holds */
        hv_log("instantiating a graph with host nodes and graph memory nodes is not built "
               "by hvgpu: CUDA_ERROR_NOT_SUPPORTED");
        *r = CUDA_ERROR_NOT_SUPPORTED;
        return 0;
    }
    int nd = 0;
    for (int j = 0; j < npreds[k]; j++) {
        int p = preds[pred_at[k] + j];
        if (!s->nodes[p].host && depth[p] == depth[k]) nd++;
    }
    size_t len = sn->fixed_len + 8 * (size_t)nd + sn->tail_len;
    unsigned char *body = malloc(len);
    if (!body) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return 0;
    }
    memcpy(body, sn->fixed, sn->fixed_len);
    memcpy(body, &part, 8); /* every node-adding request starts with its graph */
    uint32_t dl = (uint32_t)(8 * nd);
    memcpy(body + sn->deps_at, &dl, 4);
    int w = 0;
    for (int j = 0; j < npreds[k]; j++) {
        int p = preds[pred_at[k] + j];
        if (!s->nodes[p].host && depth[p] == depth[k])
            memcpy(body + sn->fixed_len + 8 * (size_t)w++, &made[p], 8);
    }
    if (sn->tail_len) memcpy(body + sn->fixed_len + 8 * (size_t)nd, sn->tail, sn->tail_len);
    uint64_t v = 0;
    *r = HV_ON(s->device, hv_call(sn->op, body, (uint32_t)len, NULL, 0, &v, sizeof v, NULL,
                                  NULL, 0));
    free(body);
    made[k] = v;
    return !*r;
}

/* The graph cut into parts (its docstring says how), each part built again on the
   executor; then instantiated (target NULL), or (target: an instantiation made so) each of
   target's parts updated from the part of the same place, where the parts and the host
   nodes between them line up (else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, nothing
   changed). 0: not a graph or instantiation made in parts here. */
static int shadow_build(void *graph, unsigned long long flags, void *target_key, void **exec,
                        CUresult *r) {
    pthread_mutex_lock(&lock);
    struct shadow *s = shadow_of(graph);
    int hosts = s ? s->hosts : 0;
    pthread_mutex_unlock(&lock);
    struct record *target = target_key ? take(target_key, 1, 0) : NULL;
    if (target_key && (!s || !target || !target->map)) return 0;
    if (!target && !hosts) return 0;
    /* The program builds and instantiates a graph on one thread: the shadow is read
       without the lock from here. */
    int n = s->n, total = 0;
    int *npreds = calloc((size_t)n, sizeof(int)), *pred_at = calloc((size_t)n + 1, sizeof(int));
    int *depth = calloc((size_t)n, sizeof(int)), *order = calloc((size_t)n, sizeof(int));
    int *left = calloc((size_t)n, sizeof(int));
    uint64_t *made = calloc((size_t)n, sizeof(uint64_t));
    int *part_of = calloc((size_t)n + 1, sizeof(int));
    for (int k = 0; k < n; k++) total += s->nodes[k].ndeps;
    int *preds = calloc((size_t)(total + s->nedges + 1), sizeof(int));
    int *succs = calloc((size_t)(total + s->nedges + 1), sizeof(int));
    int *succ_at = calloc((size_t)n + 1, sizeof(int));
    struct step *steps = NULL;
    int nsteps = 0, cap_steps = 0, maxd = 0;
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!npreds || !pred_at || !depth || !order || !left || !made || !preds || !succs ||
        !succ_at || !part_of)
        goto out;
    for (int k = 0; k < n; k++) npreds[k] = s->nodes[k].ndeps;
    for (int e = 0; e < s->nedges; e++) npreds[s->edges[2 * e + 1]]++;
    for (int k = 0; k < n; k++) pred_at[k + 1] = pred_at[k] + npreds[k];
    for (int k = 0; k < n; k++) {
        memcpy(preds + pred_at[k], s->nodes[k].deps, sizeof(int) * (size_t)s->nodes[k].ndeps);
        left[k] = s->nodes[k].ndeps;
    }
    for (int e = 0; e < s->nedges; e++) {
        int to = s->edges[2 * e + 1];
        preds[pred_at[to] + left[to]++] = s->edges[2 * e];
    }
    /* Kahn's order, a node after all it depends on, through each node's dependents */
    memset(left, 0, sizeof(int) * (size_t)n);
    for (int q = 0; q < pred_at[n]; q++) left[preds[q]]++;
    for (int k = 0; k < n; k++) succ_at[k + 1] = succ_at[k] + left[k];
    memset(left, 0, sizeof(int) * (size_t)n);
    for (int j = 0; j < n; j++)
        for (int q = 0; q < npreds[j]; q++) {
            int p = preds[pred_at[j] + q];
            succs[succ_at[p] + left[p]++] = j;
        }
    for (int k = 0; k < n; k++) left[k] = npreds[k];
    int head = 0, tail = 0;
    for (int k = 0; k < n; k++)
        if (!left[k]) order[tail++] = k;
    while (head < tail) {
        int k = order[head++];
        for (int q = succ_at[k]; q < succ_at[k + 1]; q++)
            if (--left[succs[q]] == 0) order[tail++] = succs[q];
    }
    if (tail != n) { /* a cycle: the executor's graph would have refused it */
        *r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int k = order[i], d = 0;
        for (int q = 0; q < npreds[k]; q++) {
            int p = preds[pred_at[k] + q];
            int dp = depth[p] + s->nodes[p].host;
            if (dp > d) d = dp;
        }
        depth[k] = d;
        if (d > maxd) maxd = d;
    }
    if (target) { /* the parts and the host nodes between them must line up */
        int at = 0, same = 1;
        for (int d = 0; d <= maxd && same; d++) {
            same = at < target->n && target->steps[at++].handle;
            for (int i = 0; i < n && same; i++)
                if (s->nodes[order[i]].host && depth[order[i]] == d)
                    same = at < target->n && !target->steps[at++].handle;
        }
        if (!same || at != target->n) {
            *r = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
            goto out;
        }
    }
    *r = CUDA_SUCCESS;
    for (int d = 0; d <= maxd && !*r; d++) {
        hvgpu_graph_create_req_t cq = { 0 };
        hvgpu_graph_create_rep_t cv;
        *r = HV_ON(s->device, hv_call(HVGPU_OP_GRAPH_CREATE, &cq, sizeof cq, NULL, 0, &cv,
                                      sizeof cv, NULL, NULL, 0));
        if (*r) break;
        for (int i = 0; i < n && !*r; i++) {
            int k = order[i];
            if (!s->nodes[k].host && depth[k] == d)
                rebuild(s, k, cv.graph, depth, preds, npreds, pred_at, made, r);
        }
        hvgpu_graph_instantiate_req_t iq = { cv.graph, flags };
        hvgpu_graph_instantiate_rep_t iv = { 0 };
        if (!*r && target) { /* the part of the same place takes this one's parameters */
            hvgpu_graph_exec_update_req_t uq = { target->steps[nsteps].handle, cv.graph };
            hvgpu_graph_exec_update_rep_t uv;
            *r = HV_ON(s->device, hv_call(HVGPU_OP_GRAPH_EXEC_UPDATE, &uq, sizeof uq, NULL, 0,
                                          &uv, sizeof uv, NULL, NULL, 0));
            iv.exec = uq.exec;
        } else if (!*r) {
            *r = HV_ON(s->device, hv_call(HVGPU_OP_GRAPH_INSTANTIATE, &iq, sizeof iq, NULL, 0,
                                          &iv, sizeof iv, NULL, NULL, 0));
        }
        if (*r) {
            hv_call_handle(s->device, HVGPU_OP_GRAPH_DESTROY, cv.graph);
            break;
        }
        if (!grow((void **)&steps, &cap_steps, nsteps + 1, sizeof *steps)) {
            if (!target) hv_call_handle(s->device, HVGPU_OP_GRAPH_EXEC_DESTROY, iv.exec);
            hv_call_handle(s->device, HVGPU_OP_GRAPH_DESTROY, cv.graph);
            *r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        for (int k = 0; k < n; k++)
            if (!s->nodes[k].host && depth[k] == d) part_of[k] = nsteps;
        /* the part's graph stays with the instantiation: its nodes are what the
           program's node-level calls on the instantiation name */
        steps[nsteps++] = (struct step){ iv.exec, NULL, NULL, NULL, NULL, cv.graph };
        for (int i = 0; i < n; i++) { /* this depth's host nodes, after its part */
            int k = order[i];
            if (!s->nodes[k].host || depth[k] != d) continue;
            if (!grow((void **)&steps, &cap_steps, nsteps + 1, sizeof *steps)) {
                *r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            steps[nsteps++] = (struct step){ 0, s->nodes[k].fn, NULL, s->nodes[k].data, NULL, 0 };
        }
    }
    struct nmap *map = NULL;
    int nmap = 0;
    if (!*r && !(map = calloc((size_t)n + 1, sizeof *map))) *r = CUDA_ERROR_OUT_OF_MEMORY;
    for (int k = 0; !*r && k < n; k++)
        if (!s->nodes[k].host) map[nmap++] = (struct nmap){ s->nodes[k].handle, part_of[k], made[k] };
    if (!*r && target) {
        /* Updated. Its nodes stay those of the graph it was made from (what node-level
           calls name, as the driver's rule is), and so do the parts' graphs; the new
           graph's nodes name the same places (the shapes matched, node for node) until the
           next update, and its host nodes' functions are taken. */
        struct nmap *both = NULL;
        if (nmap == target->nbase && (both = calloc(2 * (size_t)nmap + 1, sizeof *both))) {
            memcpy(both, target->map, sizeof *both * (size_t)nmap);
            for (int i = 0; i < nmap; i++)
                both[nmap + i] = (struct nmap){ map[i].node, target->map[i].step,
                                                target->map[i].part_node };
        }
        pthread_mutex_lock(&lock);
        for (int i = 0; i < nsteps; i++) {
            target->steps[i].fn = steps[i].fn;
            target->steps[i].data = steps[i].data;
        }
        struct nmap *old = both ? target->map : NULL;
        if (both) {
            target->map = both;
            target->nmap = 2 * nmap;
        }
        pthread_mutex_unlock(&lock);
        for (int i = 0; i < nsteps; i++)
            if (steps[i].graph) hv_call_handle(s->device, HVGPU_OP_GRAPH_DESTROY, steps[i].graph);
        free(old);
    } else if (!*r) {
        *exec = add_record(s->device, 1, steps, nsteps, NULL);
        if (*exec) {
            struct record *rec = take(*exec, 1, 0);
            pthread_mutex_lock(&lock);
            rec->map = map;
            rec->nmap = rec->nbase = nmap;
            pthread_mutex_unlock(&lock);
            map = NULL;
            steps = NULL;
        } else {
            *r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    free(map);
    if (*r) {
        for (int i = 0; steps && i < nsteps; i++) {
            if (steps[i].handle && !target)
                hv_call_handle(s->device, HVGPU_OP_GRAPH_EXEC_DESTROY, steps[i].handle);
            if (steps[i].graph) hv_call_handle(s->device, HVGPU_OP_GRAPH_DESTROY, steps[i].graph);
        }
        if (exec) *exec = NULL;
    }
out:
    free(part_of);
    free(npreds);
    free(pred_at);
    free(depth);
    free(order);
    free(left);
    free(made);
    free(preds);
    free(succs);
    free(succ_at);
    free(steps);
    return 1;
}

int hv_shadow_instantiate(void *graph, unsigned long long flags, void **exec, CUresult *r) {
    return shadow_build(graph, flags, NULL, exec, r);
}

int hv_shadow_update(void *exec, void *graph, CUresult *r) {
    return shadow_build(graph, 0, exec, NULL, r);
}

/* cuGraphClone of a hand-built graph: the executor has cloned its nodes into `clone`;
   the shadow is copied, each executor node's handle the one the executor found for it
   in the clone, each host node given a handle of its own. 0 with *r set on failure. */
int hv_shadow_clone(void *graph, void *clone, CUresult *r) {
    *r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    struct shadow *s = shadow_of(graph);
    pthread_mutex_unlock(&lock);
    if (!s) return 1; /* not hand-built: the executor's clone is all */
    struct shadow *c = calloc(1, sizeof *c);
    if (!c) goto oom;
    c->graph = clone;
    c->clone = 1;
    c->device = hv_tag_device(clone);
    c->hosts = s->hosts;
    if (s->n && !(c->nodes = calloc((size_t)s->n, sizeof *c->nodes))) goto oom;
    c->cap = s->n;
    if (s->nedges && !(c->edges = malloc(sizeof(int) * 2 * (size_t)s->nedges))) goto oom;
    c->cap_edges = 2 * s->nedges;
    c->nedges = s->nedges;
    if (s->nedges) memcpy(c->edges, s->edges, sizeof(int) * 2 * (size_t)s->nedges);
    /* As instantiation does, the shadow is read without the lock: the program builds a
       graph on one thread. */
    for (int k = 0; k < s->n; k++) {
        const struct snode *o = &s->nodes[k];
        struct snode *n = &c->nodes[c->n];
        *n = *o;
        n->fixed = n->tail = NULL;
        n->deps = malloc(sizeof(int) * (size_t)(o->ndeps ? o->ndeps : 1));
        if (!n->deps) goto oom;
        c->n++;
        memcpy(n->deps, o->deps, sizeof(int) * (size_t)o->ndeps);
        n->from = o->handle;
        if (o->host) {
            pthread_mutex_lock(&lock);
            n->handle = hv_tag(c->device, HOST_MARK | ++host_nodes);
            pthread_mutex_unlock(&lock);
            continue;
        }
        n->fixed = malloc(o->fixed_len ? o->fixed_len : 1);
        n->tail = malloc(o->tail_len ? o->tail_len : 1);
        if (!n->fixed || !n->tail) goto oom;
        memcpy(n->fixed, o->fixed, o->fixed_len);
        if (o->tail_len) memcpy(n->tail, o->tail, o->tail_len);
        hvgpu_graph_node_find_in_clone_req_t q = { hv_untag(clone), hv_untag(o->handle) };
        hvgpu_graph_node_find_in_clone_rep_t v;
        *r = HV_ON(c->device, hv_call(HVGPU_OP_GRAPH_NODE_FIND_IN_CLONE, &q, sizeof q, NULL, 0,
                                      &v, sizeof v, NULL, NULL, 0));
        if (*r) {
            shadow_free(c);
            return 0;
        }
        n->handle = hv_tag(c->device, v.node);
    }
    pthread_mutex_lock(&lock);
    c->next = shadows;
    shadows = c;
    pthread_mutex_unlock(&lock);
    return 1;
oom:
    if (c) shadow_free(c);
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    return 0;
}

int hv_shadow_find_in_clone(void *clone, const void *node, void **found) {
    pthread_mutex_lock(&lock);
    struct shadow *c = shadow_of(clone);
    int got = -1;
    if (c && c->clone) {
        got = 0;
        for (int k = 0; k < c->n && !got; k++)
            if (c->nodes[k].from == node) {
                *found = c->nodes[k].handle;
                got = 1;
            }
    }
    pthread_mutex_unlock(&lock);
    return got;
}
