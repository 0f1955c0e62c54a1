/* Stream capture and CUDA graphs.
 *
 * A capture happens on the executor's real stream: cuStreamBeginCapture asks the
 * executor to begin it, the launches, copies, memsets and event records that follow
 * travel one-way as ever and the host's driver records them, and cuStreamEndCapture
 * hands back the executor's graph. Graphs and their instantiations are the
 * executor's handles, tagged with their vGPU like streams (shim.h); cuGraphLaunch
 * is one one-way frame however many nodes the graph has.
 *
 * What this file keeps: the captures this process began (stream, id, graph, mode,
 * thread), so that with none under way a capture query answers "not capturing"
 * without a round trip (the frameworks ask on every allocation); with one under
 * way, queries ask the executor, which knows which streams joined a capture through
 * events and whether it has been invalidated.
 *
 * What the executor's graph cannot hold is kept in the guest (graph_guest.c): a copy
 * between the device and pageable memory is captured through a room of the
 * region and delivered to or from the program's memory at each launch;
 * a host function splits the graph into parts, and runs between them in the
 * launching thread. Where that cannot be (no region, a host function on a stream
 * joined into a capture) the call is refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture invalidated, as the driver
 * does with what it cannot capture; stream-ordered allocation on a capturing stream
 * is an allocation or free node of the capture's graph. Capture modes are
 * the program's: the executor serves every guest thread on one thread in relaxed
 * mode, so the rules the driver applies per thread are not applied; a call CUDA would
 * refuse to a thread during another thread's global-mode capture goes through.
 *
 * A clone (cuGraphClone) is the executor's clone of each part, the guest's record or
 * shadow copied with it; cuGraphNodeFindInClone asks the shadow, or the executor (of the
 * part that holds the node). Node-level calls on an instantiation made in parts
 * (cuGraphExecKernelNodeSetParams, cuGraphExecUpdate) go to the part that holds the node.
 * Conditional nodes (cuGraphAddNode) are the executor's, and so are their bodies, which
 * the driver makes and the program fills as any graph; a graph with host nodes and a
 * conditional node is not instantiated (its parts would be rebuilt without the bodies).
 * Graph memory nodes (cuGraphAddMemAllocNode and cuGraphAddMemFreeNode, and
 * cuMemAllocAsync/cuMemFreeAsync on a capturing stream, pool.c) are the executor's driver's,
 * their addresses device ranges here while a graph holds them or a launch left them live
 * (graph_mem.c); a graph with host nodes and memory nodes is not instantiated (a rebuilt
 * allocation node would have another address).
 *
 * Must not touch a graph's contents in the guest: they are the executor's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MODE_RELAXED 2
#define STATUS_NONE 0
#define MAX_CAPTURES 256

static struct capture {
    CUstream stream; /* 0: free slot */
    unsigned long long id;
    void *graph;
    int mode;
    pthread_t thread;
    struct hv_captured *got; /* pageable copies and host functions (graph_guest.c) */
    int lost;                /* a split failed: the executor's capture has ended */
} captures[MAX_CAPTURES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int active; /* captures[] in use */

int hv_capture_active(void) { return __atomic_load_n(&active, __ATOMIC_ACQUIRE) > 0; }

/* A forked child has connections, so captures, of its own: the parent's are its
   executor's (and a thread of the parent may have held the lock). */
static void child_after_fork(void) {
    pthread_mutex_init(&lock, NULL);
    memset(captures, 0, sizeof captures);
    active = 0;
}

static void watch_fork(void) { pthread_atfork(NULL, NULL, child_after_fork); }
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static struct capture *find(CUstream stream) {
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i].stream == stream && stream) return &captures[i];
    return NULL;
}

/* The capture of key (if this process began one) is over: what the guest kept of it
   (pageable copies, parts before host functions), for the caller to finish or drop. */
static struct hv_captured *forget(CUstream key) {
    struct hv_captured *got = NULL;
    pthread_mutex_lock(&lock);
    struct capture *c = find(key);
    if (c) {
        got = c->got;
        c->got = NULL;
        c->stream = NULL;
        __atomic_sub_fetch(&active, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    return got;
}

/* The stream's vGPU: a created stream's own, else (a special stream) the routed one. */
static int device_of(CUstream stream) { return hv_tag_device(stream); }

/* The capture table's key: a special stream stands for the routed vGPU's, so two
   vGPUs' per-thread streams are told apart. */
static CUstream key_of(CUstream stream) {
    return hv_created(stream) ? stream : hv_tag(device_of(stream), hv_untag(stream));
}

/* The executor ends the capture a stream began when it destroys the stream. */
void hv_capture_stream_destroyed(CUstream stream) {
    hv_captured_drop(forget(key_of(stream)), device_of(stream));
}

/* -- capture ---------------------------------------------------------------------- */

HV_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
    if (mode < 0 || mode > MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int device = device_of(stream);
    hvgpu_stream_begin_capture_req_t q = { hv_untag(stream), (uint32_t)mode };
    hvgpu_stream_begin_capture_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_BEGIN_CAPTURE, &q, sizeof q, NULL, 0,
                                       &v, sizeof v, NULL, NULL, 0));
    if (r) return r;
    CUstream key = key_of(stream);
    pthread_once(&fork_once, watch_fork); /* before the table has an entry to inherit */
    pthread_mutex_lock(&lock);
    struct capture *c = find(key);
    for (int i = 0; !c && i < MAX_CAPTURES; i++)
        if (!captures[i].stream) c = &captures[i];
    if (c) {
        if (!c->stream) __atomic_add_fetch(&active, 1, __ATOMIC_RELEASE);
        c->stream = key;
        c->id = v.id;
        c->graph = hv_tag(device, v.graph);
        c->mode = mode;
        c->thread = pthread_self();
        c->got = NULL;
        c->lost = 0;
    }
    pthread_mutex_unlock(&lock);
    if (!c) { /* more captures at once than kept: queries would lie, so refuse */
        hvgpu_stream_end_capture_req_t e = { hv_untag(stream) };
        hvgpu_stream_end_capture_rep_t g;
        if (!HV_ON(device, hv_call(HVGPU_OP_STREAM_END_CAPTURE, &e, sizeof e, NULL, 0, &g,
                                   sizeof g, NULL, NULL, 0))) {
            /* the executor holds the graph until told: while it does, what a graph could
               reach (regions, events, modules the program lets go of) stays held too */
            hv_call_handle(device, HVGPU_OP_GRAPH_DESTROY, g.graph);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
    return cuStreamBeginCapture_v2(stream, 0); /* CUDA 10.0's: global mode */
}

HV_EXPORT CUresult cuStreamEndCapture(CUstream stream, void **graph) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    CUstream key = key_of(stream);
    pthread_mutex_lock(&lock);
    struct capture *c = find(key);
    int wrong = c && c->mode != MODE_RELAXED && !pthread_equal(c->thread, pthread_self());
    pthread_mutex_unlock(&lock);
    if (wrong) return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD; /* the capture goes on */
    int device = device_of(stream);
    if (c && c->lost) { /* a host function's split failed; the executor has nothing left */
        hv_captured_drop(forget(key), device);
        *graph = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    hvgpu_stream_end_capture_req_t q = { hv_untag(stream) };
    hvgpu_stream_end_capture_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_END_CAPTURE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    /* Failed or not, the capture is over: the executor carries the end out even where an
       earlier one-way frame's error is owed (that one comes with a later call). */
    struct hv_captured *got = forget(key);
    if (r) {
        hv_captured_drop(got, device);
        *graph = NULL;
        return r;
    }
    *graph = hv_captured_finish(got, device, v.graph); /* the first part's, where split */
    if (!*graph) {
        hv_call_handle(device, HVGPU_OP_GRAPH_DESTROY, v.graph);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* -- what a graph cannot hold on the host ---------------------------------------------- */

static CUresult query(CUstream stream, int nodes, int *status, unsigned long long *id,
                      void **graph, size_t *ndeps);

/* The capture `stream` is in (status and entry), asked of the executor. */
static CUresult capture_of(CUstream stream, int *status, struct capture **c) {
    unsigned long long id;
    void *graph;
    size_t n;
    *c = NULL;
    CUresult r = query(stream, 0, status, &id, &graph, &n);
    if (r || *status == STATUS_NONE) return r;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CAPTURES && !*c; i++)
        if (captures[i].stream && captures[i].id == id &&
            hv_tag_device(captures[i].stream) == device_of(stream))
            *c = &captures[i];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* The executor answered a query with an earlier frame's error: that is this call's
   answer, and the call is not carried out, so a capture it was meant for is
   invalidated (as an operation the driver refuses during a capture invalidates it). */
static int owed(CUstream stream, CUresult *r) {
    CUresult earlier = *r;
    hv_capture_refuse(stream, "an operation refused for an earlier error");
    *r = earlier;
    return 1;
}

int hv_capture_copy(CUdeviceptr dptr, void *user, size_t n, int to_host, CUstream stream,
                    CUresult *r) {
    int status;
    struct capture *c;
    if (!hv_capture_active()) return 0;
    *r = capture_of(stream, &status, &c);
    if (*r) return owed(stream, r);
    if (status == STATUS_NONE) return 0;
    if (c && !c->lost && status == 1 && hv_captured_copy(&c->got, dptr, user, n, to_host, stream, r))
        return 1;
    *r = hv_capture_refuse(stream, to_host ? "a copy to pageable memory with no room for it in "
                                             "the region"
                                           : "a copy from pageable memory with no room for it "
                                             "in the region");
    return 1;
}

int hv_capture_host(CUstream stream, void (*fn)(void *), void (*cb)(CUstream, CUresult, void *),
                    void *data, CUresult *r) {
    int status;
    struct capture *c;
    if (!hv_capture_active()) return 0;
    *r = capture_of(stream, &status, &c);
    if (*r) return owed(stream, r);
    if (status == STATUS_NONE) return 0;
    int device = device_of(stream);
    if (!c || c->stream != key_of(stream) || status != 1 || c->lost) {
        *r = hv_capture_refuse(stream, "a host function on a stream joined into a capture "
                                       "(only its origin stream can run one)");
        return 1;
    }
    /* The capture so far becomes one part; the function runs between it and the next. */
    hvgpu_stream_end_capture_req_t e = { hv_untag(stream) };
    hvgpu_stream_end_capture_rep_t part;
    *r = HV_ON(device, hv_call(HVGPU_OP_STREAM_END_CAPTURE, &e, sizeof e, NULL, 0, &part,
                               sizeof part, NULL, NULL, 0));
    if (*r) {
        c->lost = 1;
        return 1;
    }
    if (!hv_captured_split(&c->got, part.graph, fn, cb, data, stream)) {
        hv_call_handle(device, HVGPU_OP_GRAPH_DESTROY, part.graph);
        c->lost = 1;
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return 1;
    }
    hvgpu_stream_begin_capture_req_t b = { hv_untag(stream), (uint32_t)c->mode };
    hvgpu_stream_begin_capture_rep_t v;
    *r = HV_ON(device, hv_call(HVGPU_OP_STREAM_BEGIN_CAPTURE, &b, sizeof b, NULL, 0, &v,
                               sizeof v, NULL, NULL, 0));
    if (*r) {
        c->lost = 1;
        return 1;
    }
    pthread_mutex_lock(&lock);
    c->id = v.id;
    c->graph = hv_tag(device, v.graph);
    pthread_mutex_unlock(&lock);
    return 1;
}

/* What the executor says of a stream's capture; where `nodes`, its dependency nodes
   (tagged) into a thread's array. The executor gives each node it names a handle that
   lasts as long as the graph, so they are asked for only where the program wants them
   (the frameworks' allocators ask on every allocation during a capture, without). */
static __thread void *query_nodes[HVGPU_MAX_QUERY_NODES];

static CUresult query(CUstream stream, int nodes, int *status, unsigned long long *id,
                      void **graph, size_t *ndeps) {
    *status = STATUS_NONE;
    *id = 0;
    *graph = NULL;
    *ndeps = 0;
    if (!hv_capture_active()) return CUDA_SUCCESS;
    int device = device_of(stream);
    hvgpu_stream_capture_info_req_t q = { hv_untag(stream), nodes ? 1u : 0u };
    static __thread unsigned char rep[sizeof(hvgpu_stream_capture_info_rep_t) +
                                      8 * HVGPU_MAX_QUERY_NODES];
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_CAPTURE_INFO, &q, sizeof q, NULL, 0, rep,
                                       sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_stream_capture_info_rep_view_t v;
    if (hvgpu_stream_capture_info_rep_decode(rep, n, &v) < 0) return CUDA_ERROR_INVALID_VALUE;
    size_t count = v.fixed.nodes_len / 8;
    if (count > v.nodes.len / 8 || count > HVGPU_MAX_QUERY_NODES) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        uint64_t h;
        memcpy(&h, v.nodes.data + 8 * i, 8);
        query_nodes[i] = hv_tag(device, h);
    }
    *status = (int)v.fixed.status;
    *id = v.fixed.id;
    *graph = v.fixed.graph ? hv_tag(device, v.fixed.graph) : NULL;
    *ndeps = count;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long id;
    void *graph;
    size_t n;
    return query(stream, 0, status, &id, &graph, &n);
}

HV_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                             void **graph, const void **deps,
                                             const void **edges, size_t *ndeps) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long i;
    void *g;
    size_t n;
    CUresult r = query(stream, deps || ndeps, status, &i, &g, &n);
    if (r) return r;
    if (id) *id = i;
    if (graph) *graph = g;
    if (deps) *deps = n ? (const void *)query_nodes : NULL;
    if (edges) *edges = NULL; /* every edge the default kind */
    if (ndeps) *ndeps = n;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, unsigned long long *id,
                                             void **graph, const void **deps, size_t *ndeps) {
    return cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, NULL, ndeps);
}

HV_EXPORT CUresult cuStreamGetCaptureInfo(CUstream stream, int *status, unsigned long long *id) {
    return cuStreamGetCaptureInfo_v3(stream, status, id, NULL, NULL, NULL, NULL);
}

static __thread int capture_mode;

/* Kept for the program (it reads back what it set); the executor is always relaxed. */
HV_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode || *mode < 0 || *mode > MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static CUresult is_capturing(CUstream stream, int *status) {
    return cuStreamIsCapturing(stream, status);
}

static CUresult synchronize(CUstream stream, int *unused) {
    (void)unused;
    return cuStreamSynchronize(stream);
}

/* call(stream, status), carried out: the executor answers an earlier one-way frame's
   error instead of making a synchronous call, and then it is made once more (that error
   kept in *earlier, the first one, for the program). */
static CUresult carried_out(int device, CUresult *earlier, CUresult (*call)(CUstream, int *),
                            CUstream stream, int *status) {
    unsigned before = HV_ON(device, hv_oneway_failures());
    CUresult r = call(stream, status);
    if (r && (unsigned)HV_ON(device, hv_oneway_failures()) != before) {
        if (!*earlier) *earlier = r;
        r = call(stream, status);
    }
    return r;
}

CUresult hv_capture_refuse(CUstream stream, const char *what) {
    if (!hv_capture_active()) return CUDA_SUCCESS;
    int device = device_of(stream), status = STATUS_NONE;
    CUresult earlier = CUDA_SUCCESS;
    CUresult r = carried_out(device, &earlier, is_capturing, stream, &status);
    if (r || status == STATUS_NONE) /* the earlier error is the program's answer here */
        return earlier ? earlier : r;
    /* As the driver does with an operation it cannot capture, the capture is
       invalidated: a synchronisation of the capturing stream is what invalidates it on
       the executor (and is itself refused). It must be carried out: a capture left valid
       would end as a graph without this operation. */
    r = carried_out(device, &earlier, synchronize, stream, NULL);
    static int once;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
        hv_log("%s on a capturing stream cannot be replayed by a graph through hvgpu: refused "
               "with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (use pinned memory, cudaMallocHost, "
               "for copies in a graph)", what);
    return earlier ? earlier : r ? r : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* -- graphs --------------------------------------------------------------------------- */

HV_EXPORT CUresult cuGraphUpload(void *exec, CUstream stream);

static CUresult about(const void *object, uint16_t op) {
    return hv_call_handle(hv_tag_device(object), op, hv_untag(object));
}
_Static_assert(sizeof(hvgpu_graph_destroy_req_t) == 8 && sizeof(hvgpu_graph_exec_destroy_req_t) == 8,
               "one-handle requests");

/* Parts, or rooms for pageable copies: what node-level calls cannot carry. */
static CUresult split_refused(void *object, int is_exec, const char *api) {
    int parts = 0;
    if (!hv_graph_recorded(object, is_exec, &parts)) return CUDA_SUCCESS;
    static int once;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
        hv_log("%s of a graph captured with host functions or pageable copies is not built "
               "by hvgpu: CUDA_ERROR_NOT_SUPPORTED", api);
    return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult instantiate(void **exec, void *graph, unsigned long long flags) {
    if (!exec || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    if (hv_shadow_instantiate(graph, flags, exec, &rr)) return rr; /* with host nodes */
    if (hv_graph_instantiate(graph, flags, exec, &rr)) return rr;
    int device = hv_tag_device(graph);
    hvgpu_graph_instantiate_req_t q = { hv_untag(graph), flags };
    hvgpu_graph_instantiate_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_INSTANTIATE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    *exec = r ? NULL : hv_tag(device, v.exec);
    if (!r && hv_gm_has(graph, 0)) hv_gm_instantiated(graph, *exec);
    return r;
}

HV_EXPORT CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    return instantiate(exec, graph, flags);
}

/* CUDA 10 and 11's form: an error node and a log buffer (the log says why, if it can). */
HV_EXPORT CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **error_node, char *log,
                                         size_t log_size) {
    CUresult r = instantiate(exec, graph, 0);
    if (error_node) *error_node = NULL;
    if (log && log_size) {
        if (r) snprintf(log, log_size, "hvgpu: the host's cuGraphInstantiate failed (%d)", r);
        else log[0] = '\0';
    }
    return r;
}

HV_EXPORT CUresult cuGraphInstantiate(void **exec, void *graph, void **error_node, char *log,
                                      size_t log_size) {
    return cuGraphInstantiate_v2(exec, graph, error_node, log, log_size);
}

typedef struct {
    unsigned long long flags;
    CUstream upload_stream;
    void *error_node;
    int result; /* CUgraphInstantiateResult: 0 success, 1 error */
} instantiate_params;

HV_EXPORT CUresult cuGraphInstantiateWithParams(void **exec, void *graph, instantiate_params *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    const unsigned long long upload = 2; /* CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD */
    CUresult r = instantiate(exec, graph, p->flags & ~upload);
    p->error_node = NULL;
    p->result = r ? 1 : 0;
    if (!r && (p->flags & upload)) r = cuGraphUpload(*exec, p->upload_stream);
    return r;
}

HV_EXPORT CUresult cuGraphUpload(void *exec, CUstream stream) {
    if (!hv_created(exec)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    if (hv_graph_upload(exec, stream, &rr)) return rr;
    int device = hv_tag_device(exec);
    if (hv_created(stream) && hv_tag_device(stream) != device) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_upload_req_t q = { hv_untag(exec), hv_untag(stream) };
    return HV_ON(device, hv_oneway(HVGPU_OP_GRAPH_UPLOAD, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuGraphLaunch(void *exec, CUstream stream) {
    if (!hv_created(exec)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    if (hv_graph_launch(exec, stream, &rr)) return rr;
    int device = hv_tag_device(exec);
    if (hv_created(stream) && hv_tag_device(stream) != device) return CUDA_ERROR_INVALID_VALUE;
    CUresult m = hv_managed_before(device, stream);
    if (m) return m;
    hvgpu_graph_launch_req_t q = { hv_untag(exec), hv_untag(stream) };
    if (hv_gm_has(exec, 1)) { /* the driver's refusal of a relaunch is the launch's answer */
        CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_LAUNCH, &q, sizeof q, NULL, 0, NULL, 0,
                                           NULL, NULL, 0));
        if (!r) hv_gm_launched(exec);
        return r;
    }
    return HV_ON(device, hv_oneway(HVGPU_OP_GRAPH_LAUNCH, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *count) {
    if (!count || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int parts = 0;
    if (hv_graph_recorded(graph, 0, &parts) && parts > 1) {
        CUresult rr;
        if (!nodes) return hv_graph_count(graph, count, &rr) ? rr : CUDA_ERROR_INVALID_VALUE;
        return split_refused(graph, 0, "cuGraphGetNodes listing the nodes");
    }
    int hosts = hv_shadow_hosts(graph);
    if (hosts > 0 && nodes) {
        hv_log("cuGraphGetNodes listing the nodes of a graph with host nodes is not built by "
               "hvgpu: CUDA_ERROR_NOT_SUPPORTED");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int device = hv_tag_device(graph);
    size_t want = nodes ? *count : 0;
    if (want > HVGPU_MAX_GRAPH_NODES) return CUDA_ERROR_INVALID_VALUE;
    size_t cap = sizeof(hvgpu_graph_get_nodes_rep_t) + 8 * want;
    unsigned char *rep = malloc(cap);
    if (!rep) return CUDA_ERROR_OUT_OF_MEMORY;
    hvgpu_graph_get_nodes_req_t q = { hv_untag(graph), (uint32_t)want };
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_GET_NODES, &q, sizeof q, NULL, 0, rep,
                                       (uint32_t)cap, &n, NULL, 0));
    hvgpu_graph_get_nodes_rep_view_t v;
    if (!r && hvgpu_graph_get_nodes_rep_decode(rep, n, &v) < 0) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        size_t got = v.fixed.nodes_len / 8;
        if (got > want || got > v.nodes.len / 8) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else if (nodes) {
            for (size_t i = 0; i < *count; i++) {
                uint64_t h = 0;
                if (i < got) memcpy(&h, v.nodes.data + 8 * i, 8);
                nodes[i] = h ? hv_tag(device, h) : NULL;
            }
            /* as CUDA: with room to spare, how many there are; else how many were asked */
            if (v.fixed.count < *count) *count = v.fixed.count;
        } else {
            *count = v.fixed.count + (size_t)(hosts > 0 ? hosts : 0);
        }
    }
    free(rep);
    return r;
}

HV_EXPORT CUresult cuGraphDestroy(void *graph) {
    if (!hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    hv_shadow_drop(graph);
    hv_gm_gone(graph, 0);
    if (hv_graph_destroy(graph, 0, &rr)) return rr;
    return about(graph, HVGPU_OP_GRAPH_DESTROY);
}

HV_EXPORT CUresult cuGraphClone(void **clone, void *graph) {
    if (!clone || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    if (hv_graph_clone(graph, clone, &rr)) return rr; /* captured in parts */
    int device = hv_tag_device(graph);
    hvgpu_graph_clone_req_t q = { hv_untag(graph) };
    hvgpu_graph_clone_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_CLONE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    *clone = r ? NULL : hv_tag(device, v.clone);
    if (!r && !hv_shadow_clone(graph, *clone, &r)) { /* its host nodes are the guest's */
        about(*clone, HVGPU_OP_GRAPH_DESTROY);
        *clone = NULL;
    }
    return r;
}

HV_EXPORT CUresult cuGraphNodeFindInClone(void **found, void *node, void *clone) {
    if (!found || !hv_created(node) || !hv_created(clone) ||
        hv_tag_device(node) != hv_tag_device(clone))
        return CUDA_ERROR_INVALID_VALUE;
    int got = hv_shadow_find_in_clone(clone, node, found);
    if (got >= 0) return got ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(clone);
    uint64_t parts[64];
    int n = hv_graph_parts(clone, 0, parts, 64);
    if (n < 0) { /* the executor's graph alone */
        parts[0] = hv_untag(clone);
        n = 1;
    }
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < n && r == CUDA_ERROR_INVALID_VALUE; i++) { /* the part it copies */
        hvgpu_graph_node_find_in_clone_req_t q = { parts[i], hv_untag(node) };
        hvgpu_graph_node_find_in_clone_rep_t v;
        r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_NODE_FIND_IN_CLONE, &q, sizeof q, NULL, 0, &v,
                                  sizeof v, NULL, NULL, 0));
        if (!r) *found = hv_tag(device, v.node);
    }
    return r;
}

HV_EXPORT CUresult cuGraphExecDestroy(void *exec) {
    if (!hv_created(exec)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rr;
    hv_gm_gone(exec, 1);
    if (hv_graph_destroy(exec, 1, &rr)) return rr;
    return about(exec, HVGPU_OP_GRAPH_EXEC_DESTROY);
}

/* -- graphs built node by node ----------------------------------------------------------- */

#define MEMORYTYPE_HOST 1
#define MEMORYTYPE_DEVICE 2
#define MEMORYTYPE_UNIFIED 4

HV_EXPORT CUresult cuGraphCreate(void **graph, unsigned flags) {
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_routed_device();
    hvgpu_graph_create_req_t q = { flags };
    hvgpu_graph_create_rep_t v;
    CUresult r = hv_call(HVGPU_OP_GRAPH_CREATE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    *graph = r ? NULL : hv_tag(device, v.graph);
    if (!r) hv_shadow_new(*graph); /* for host nodes, should the program add any */
    return r;
}

typedef struct {
    void (*fn)(void *);
    void *data;
} host_node_params;

HV_EXPORT CUresult cuGraphAddHostNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                      const host_node_params *p) {
    if (!node || !p || !p->fn || !hv_created(graph) || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    if (hv_shadow_hosts(graph) < 0) {
        static int once;
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
            hv_log("cuGraphAddHostNode: hvgpu runs host nodes of graphs built by cuGraphCreate; "
                   "this graph was captured: CUDA_ERROR_NOT_SUPPORTED");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!hv_shadow_add(graph, NULL, deps, ndeps, node)) return CUDA_ERROR_INVALID_VALUE;
    hv_shadow_set_host(*node, p->fn, p->data);
    return CUDA_SUCCESS;
}

/* Appends the untagged handles of n nodes of `device` to buf; 0 where one is not. */
static int put_nodes(unsigned char *buf, void *const *nodes, size_t n, int device) {
    for (size_t i = 0; i < n; i++) {
        if (!hv_created(nodes[i]) || hv_tag_device(nodes[i]) != device) return 0;
        uint64_t h = hv_untag(nodes[i]);
        memcpy(buf + 8 * i, &h, 8);
    }
    return 1;
}

/* A node-adding request: fixed fields (their deps_len set here, at deps_len_at), the
   dependencies, then tail (the op's later variable field, if any). */
static CUresult add_node_ex(void **node, void *graph, uint16_t op, void *fixed,
                            size_t fixed_len, size_t deps_len_at, void *const *deps,
                            size_t ndeps, const void *tail, size_t tail_len, void *rep,
                            uint32_t rep_cap, uint32_t *rep_len);

static CUresult add_node(void **node, void *graph, uint16_t op, void *fixed, size_t fixed_len,
                         size_t deps_len_at, void *const *deps, size_t ndeps, const void *tail,
                         size_t tail_len) {
    uint64_t v = 0; /* every node-adding op but the conditional one replies one u64 node */
    uint32_t got = 0;
    return add_node_ex(node, graph, op, fixed, fixed_len, deps_len_at, deps, ndeps, tail,
                       tail_len, &v, sizeof v, &got);
}

/* A node-adding request whose reply starts with the node (u64): rep, rep_cap bytes. */
static CUresult add_node_ex(void **node, void *graph, uint16_t op, void *fixed,
                            size_t fixed_len, size_t deps_len_at, void *const *deps,
                            size_t ndeps, const void *tail, size_t tail_len, void *rep,
                            uint32_t rep_cap, uint32_t *rep_len) {
    if (!node || !hv_created(graph) || (ndeps && !deps) || ndeps > HVGPU_MAX_QUERY_NODES)
        return CUDA_ERROR_INVALID_VALUE;
    int parts = 0;
    if (hv_graph_recorded(graph, 0, &parts) && parts > 1)
        return split_refused(graph, 0, "adding a node");
    int device = hv_tag_device(graph);
    int shadowed = hv_shadow_hosts(graph) >= 0;
    /* host nodes are the guest's alone: the executor's node depends on the others */
    void **sent = malloc(sizeof(void *) * (ndeps ? ndeps : 1));
    if (!sent) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t nsent = 0;
    for (size_t i = 0; i < ndeps; i++)
        if (!hv_shadow_is_host(deps[i])) sent[nsent++] = deps[i];
        else if (!shadowed) nsent = ndeps + 1; /* a host node of another graph */
    if (nsent > ndeps) {
        free(sent);
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint32_t dl = (uint32_t)(8 * nsent);
    memcpy((unsigned char *)fixed + deps_len_at, &dl, 4);
    size_t len = fixed_len + dl + tail_len;
    unsigned char *body = malloc(len ? len : 1);
    if (!body) {
        free(sent);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(body, fixed, fixed_len);
    CUresult r = CUDA_SUCCESS;
    if (!put_nodes(body + fixed_len, sent, nsent, device)) r = CUDA_ERROR_INVALID_VALUE;
    free(sent);
    if (tail_len) memcpy(body + fixed_len + dl, tail, tail_len);
    uint64_t v = 0;
    *rep_len = 0;
    if (!r) r = HV_ON(device, hv_call(op, body, (uint32_t)len, NULL, 0, rep, rep_cap, rep_len,
                                      NULL, 0));
    free(body);
    if (!r && *rep_len < 8) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) memcpy(&v, rep, 8);
    *node = r ? NULL : hv_tag(device, v);
    if (!r && shadowed) {
        /* deps_at: where deps_len is; the dependencies follow the fixed fields */
        struct hv_node_request q = { op, fixed, fixed_len, deps_len_at, tail, tail_len };
        if (!hv_shadow_add(graph, &q, deps, ndeps, node)) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}
#define FIELD_AT(type, field) offsetof(type, field)

typedef struct {
    CUfunction func;
    unsigned gx, gy, gz, bx, by, bz, smem;
    void **params, **extra;
    CUkernel kern; /* _v2 only: used where func is NULL */
    void *ctx;
} kernel_node_params;

static CUresult kernel_node(void **node, void *graph, void *const *deps, size_t ndeps,
                            const kernel_node_params *p, int v2) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct hv_func *f = p->func ? p->func : (v2 ? p->kern : NULL);
    static __thread unsigned char params[HVGPU_MAX_PARAMS];
    uint32_t n = 0;
    int device;
    uint64_t handle;
    CUresult r = hv_kernel_pack(f, p->params, p->extra, params, &n, &device, &handle);
    if (r) return r;
    if (hv_created(graph) && hv_tag_device(graph) != device) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_add_kernel_node_req_t q = { hv_untag(graph), handle, p->gx, p->gy, p->gz,
                                            p->bx, p->by, p->bz, p->smem, 0, n };
    return add_node(node, graph, HVGPU_OP_GRAPH_ADD_KERNEL_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_kernel_node_req_t, deps_len), deps, ndeps, params, n);
}

HV_EXPORT CUresult cuGraphAddKernelNode_v2(void **node, void *graph, void *const *deps,
                                           size_t ndeps, const kernel_node_params *p) {
    return kernel_node(node, graph, deps, ndeps, p, 1);
}

HV_EXPORT CUresult cuGraphAddKernelNode(void **node, void *graph, void *const *deps,
                                        size_t ndeps, const kernel_node_params *p) {
    return kernel_node(node, graph, deps, ndeps, p, 0); /* CUDA 10's struct: no kern, ctx */
}

static CUresult exec_kernel_set(void *exec, void *node, const kernel_node_params *p, int v2) {
    if (!p || !hv_created(exec) || !hv_created(node)) return CUDA_ERROR_INVALID_VALUE;
    struct hv_func *f = p->func ? p->func : (v2 ? p->kern : NULL);
    static __thread unsigned char body[sizeof(hvgpu_graph_exec_kernel_node_set_params_req_t) +
                                       HVGPU_MAX_PARAMS];
    hvgpu_graph_exec_kernel_node_set_params_req_t q;
    uint32_t n = 0;
    int device;
    uint64_t handle;
    CUresult r = hv_kernel_pack(f, p->params, p->extra, body + sizeof q, &n, &device, &handle);
    if (r) return r;
    if (hv_tag_device(exec) != device || hv_tag_device(node) != device)
        return CUDA_ERROR_INVALID_VALUE;
    /* An instantiation made in parts (host nodes, host functions, pageable copies): the
       node is set in the part that holds it. */
    uint64_t parts[64], nodes[64];
    int np = hv_graph_exec_node(exec, node, parts, nodes, 64);
    if (np < 0) {
        parts[0] = hv_untag(exec);
        nodes[0] = hv_untag(node);
        np = 1;
    }
    r = CUDA_ERROR_INVALID_VALUE; /* a node of none of them: the driver's answer */
    for (int i = 0; i < np && r == CUDA_ERROR_INVALID_VALUE; i++) {
        hvgpu_graph_exec_kernel_node_set_params_req_t fixed = {
            parts[i], nodes[i], handle, p->gx, p->gy, p->gz, p->bx, p->by, p->bz, p->smem, n };
        memcpy(body, &fixed, sizeof fixed);
        r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS, body,
                                  (uint32_t)(sizeof fixed + n), NULL, 0, NULL, 0, NULL, NULL, 0));
    }
    return r;
}

HV_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(void *exec, void *node,
                                                     const kernel_node_params *p) {
    return exec_kernel_set(exec, node, p, 1);
}

HV_EXPORT CUresult cuGraphExecKernelNodeSetParams(void *exec, void *node,
                                                  const kernel_node_params *p) {
    return exec_kernel_set(exec, node, p, 0);
}

typedef struct {
    CUdeviceptr dst;
    size_t pitch;
    unsigned value, element_size;
    size_t width, height;
} memset_node_params;

HV_EXPORT CUresult cuGraphAddMemsetNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                        const memset_node_params *p, void *ctx) {
    (void)ctx;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_add_memset_node_req_t q = { hv_untag(graph), p->dst, p->pitch, p->value,
                                            p->element_size, p->width, p->height, 0 };
    return add_node(node, graph, HVGPU_OP_GRAPH_ADD_MEMSET_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_memset_node_req_t, deps_len), deps, ndeps, NULL, 0);
}

typedef struct {
    size_t x, y, z, lod;
    int type;
    const void *host;
    CUdeviceptr device;
    void *array, *reserved;
    size_t pitch, height;
} memcpy_side;

typedef struct {
    memcpy_side src, dst;
    size_t width, height, depth;
} memcpy3d;

/* One side of a linear copy: 1 device memory at *addr, 2 host memory of the region
   (region and offset set), 0 neither (arrays, pageable memory). */
static int side(const memcpy_side *s, size_t n, int device, uint64_t *addr, uint32_t *region) {
    if (s->y || s->z || s->lod || s->array) return 0;
    const void *host = NULL;
    if (s->type == MEMORYTYPE_DEVICE) {
        *addr = s->device + s->x;
        return 1;
    }
    if (s->type == MEMORYTYPE_HOST) host = (const char *)s->host + s->x;
    else if (s->type == MEMORYTYPE_UNIFIED) host = (const char *)(uintptr_t)(s->device + s->x);
    else return 0;
    if (hv_region_locate(host, n, device, region, addr)) return 2;
    if (s->type == MEMORYTYPE_UNIFIED) { /* a device address given as unified */
        *addr = s->device + s->x;
        return 1;
    }
    return 0;
}

CUresult cuMemcpy3D_v2(const memcpy3d *p); /* array.c */

static void run_copy(void *p) {
    CUresult r = cuMemcpy3D_v2(p);
    if (r) hv_log("a graph's copy node (run in the guest) failed: CUDA error %d", r);
}

/* A copy the executor's graph cannot hold (pageable memory, arrays, 2D or 3D) in a graph
   built by cuGraphCreate: a host node that makes the copy at each launch, in the
   launching thread once the nodes it depends on have run, as the driver's node would
   (pageable bytes read or written then). Its parameters are kept for the process's life. */
static CUresult copy_as_host_node(void **node, void *graph, void *const *deps, size_t ndeps,
                                  const memcpy3d *p) {
    memcpy3d *kept = malloc(sizeof *kept);
    if (!kept) return CUDA_ERROR_OUT_OF_MEMORY;
    *kept = *p;
    if (!hv_shadow_add(graph, NULL, deps, ndeps, node)) {
        free(kept);
        return CUDA_ERROR_INVALID_VALUE;
    }
    hv_shadow_set_host(*node, run_copy, kept);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuGraphAddMemcpyNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                        const memcpy3d *p, void *ctx) {
    (void)ctx;
    if (!p || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph);
    size_t n = p->width;
    uint64_t src = 0, dst = 0;
    uint32_t sregion = 0, dregion = 0;
    int s = p->height <= 1 && p->depth <= 1 ? side(&p->src, n, device, &src, &sregion) : 0;
    int d = s ? side(&p->dst, n, device, &dst, &dregion) : 0;
    int kind = s == 1 && d == 1   ? HVGPU_MEMCPY_NODE_DEVICE
               : s == 2 && d == 1 ? HVGPU_MEMCPY_NODE_FROM_REGION
               : s == 1 && d == 2 ? HVGPU_MEMCPY_NODE_TO_REGION
                                  : -1;
    if (kind < 0 && hv_shadow_hosts(graph) >= 0)
        return copy_as_host_node(node, graph, deps, ndeps, p);
    if (kind < 0) {
        static int once;
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
            hv_log("cuGraphAddMemcpyNode: in a captured graph hvgpu adds copy nodes of one row "
                   "between device memory and device or pinned (cudaMallocHost) memory; this "
                   "one is refused with CUDA_ERROR_NOT_SUPPORTED (pageable memory, arrays, "
                   "2D or 3D)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    hvgpu_graph_add_memcpy_node_req_t q = {
        hv_untag(graph), (uint32_t)kind, kind == HVGPU_MEMCPY_NODE_FROM_REGION ? sregion : dregion,
        dst, src, n, 0 };
    return add_node(node, graph, HVGPU_OP_GRAPH_ADD_MEMCPY_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_memcpy_node_req_t, deps_len), deps, ndeps, NULL, 0);
}

HV_EXPORT CUresult cuGraphAddEmptyNode(void **node, void *graph, void *const *deps, size_t ndeps) {
    hvgpu_graph_add_empty_node_req_t q = { hv_untag(graph), 0 };
    return add_node(node, graph, HVGPU_OP_GRAPH_ADD_EMPTY_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_empty_node_req_t, deps_len), deps, ndeps, NULL, 0);
}

static CUresult event_node(void **node, void *graph, void *const *deps, size_t ndeps,
                           CUevent event, uint32_t wait) {
    if (!hv_created(event) || !hv_created(graph) || hv_tag_device(event) != hv_tag_device(graph))
        return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_add_event_node_req_t q = { hv_untag(graph), wait, 0, hv_untag(event), 0 };
    return add_node(node, graph, HVGPU_OP_GRAPH_ADD_EVENT_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_event_node_req_t, deps_len), deps, ndeps, NULL, 0);
}

HV_EXPORT CUresult cuGraphAddEventRecordNode(void **node, void *graph, void *const *deps,
                                             size_t ndeps, CUevent event) {
    return event_node(node, graph, deps, ndeps, event, 0);
}

HV_EXPORT CUresult cuGraphAddEventWaitNode(void **node, void *graph, void *const *deps,
                                           size_t ndeps, CUevent event) {
    return event_node(node, graph, deps, ndeps, event, 1);
}

HV_EXPORT CUresult cuGraphAddDependencies_v2(void *graph, void *const *from, void *const *to,
                                             const unsigned char *edges, size_t n) {
    if (!hv_created(graph) || (n && (!from || !to)) || n > HVGPU_MAX_QUERY_NODES)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; edges && i < 8 * n; i++)
        if (edges[i]) return CUDA_ERROR_NOT_SUPPORTED; /* only the default edge kind */
    int device = hv_tag_device(graph);
    int shadowed = hv_shadow_hosts(graph) >= 0;
    size_t fixed = sizeof(hvgpu_graph_add_dependencies_req_t);
    unsigned char *body = malloc(fixed + 16 * n + 1);
    void **a = malloc(sizeof(void *) * (2 * n + 1));
    if (!body || !a) {
        free(body);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t m = 0; /* the edges between executor nodes; those of host nodes are the guest's */
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < n && !r; i++) {
        if (hv_shadow_is_host(from[i]) || hv_shadow_is_host(to[i])) {
            if (!shadowed) r = CUDA_ERROR_INVALID_VALUE;
            continue;
        }
        a[m] = from[i];
        a[n + m++] = to[i];
    }
    hvgpu_graph_add_dependencies_req_t q = { hv_untag(graph), (uint32_t)(8 * m),
                                             (uint32_t)(8 * m) };
    memcpy(body, &q, fixed);
    if (!r && !(put_nodes(body + fixed, a, m, device) && put_nodes(body + fixed + 8 * m, a + n, m,
                                                                  device)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r && m)
        r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_ADD_DEPENDENCIES, body,
                                  (uint32_t)(fixed + 16 * m), NULL, 0, NULL, 0, NULL, NULL, 0));
    for (size_t i = 0; i < n && !r && shadowed; i++)
        if (!hv_shadow_edge(graph, from[i], to[i])) r = CUDA_ERROR_INVALID_VALUE;
    free(body);
    free(a);
    return r;
}

HV_EXPORT CUresult cuGraphAddDependencies(void *graph, void *const *from, void *const *to,
                                          size_t n) {
    return cuGraphAddDependencies_v2(graph, from, to, NULL, n);
}

typedef struct {
    int result;
    void *error_node, *error_from_node;
} update_result_info;

HV_EXPORT CUresult cuGraphExecUpdate_v2(void *exec, void *graph, update_result_info *info) {
    if (!hv_created(exec) || !hv_created(graph) || hv_tag_device(exec) != hv_tag_device(graph))
        return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(exec);
    CUresult made;
    if (hv_shadow_update(exec, graph, &made)) { /* made in parts: updated part by part */
        if (info) *info = (update_result_info){ made ? 1 : 0, NULL, NULL };
        return made;
    }
    CUresult refused = split_refused(exec, 1, "cuGraphExecUpdate");
    if (!refused) refused = split_refused(graph, 0, "cuGraphExecUpdate");
    if (!refused && hv_shadow_hosts(graph) > 0) refused = CUDA_ERROR_NOT_SUPPORTED;
    if (refused) {
        if (info) *info = (update_result_info){ 1, NULL, NULL };
        return refused;
    }
    hvgpu_graph_exec_update_req_t q = { hv_untag(exec), hv_untag(graph) };
    hvgpu_graph_exec_update_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_EXEC_UPDATE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    if (info) {
        info->result = r ? 1 /* CU_GRAPH_EXEC_UPDATE_ERROR */ : 0;
        info->error_node = !r || !v.error_node ? NULL : hv_tag(device, v.error_node);
        info->error_from_node = NULL;
    }
    return r;
}

HV_EXPORT CUresult cuGraphExecUpdate(void *exec, void *graph, void **error_node, int *result) {
    update_result_info info;
    CUresult r = cuGraphExecUpdate_v2(exec, graph, &info);
    if (error_node) *error_node = info.error_node;
    if (result) *result = info.result;
    return r;
}

/* -- graph memory ---------------------------------------------------------------------- */

typedef struct { int type, id; } gm_location;                   /* CUmemLocation */
typedef struct { gm_location location; int flags; } gm_access;  /* CUmemAccessDesc */
typedef struct { /* CUDA_MEM_ALLOC_NODE_PARAMS, v1 and v2 alike */
    int alloc_type, handle_types;
    gm_location location;
    void *win32;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
    const gm_access *access;
    size_t access_count;
    size_t bytesize;
    CUdeviceptr dptr;
} mem_alloc_node_params;
_Static_assert(sizeof(mem_alloc_node_params) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS");

enum { GM_PINNED = 1, GM_ON_DEVICE = 1, GM_READWRITE = 3, NODE_HOST_TYPE = 3,
       NODE_MEM_ALLOC_TYPE = 10, NODE_MEM_FREE_TYPE = 11 };

/* Device memory of the graph's vGPU, read-write for it alone: what the executor's
   pools are (peer access between vGPUs is not built). */
HV_EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *graph, void *const *deps,
                                          size_t ndeps, mem_alloc_node_params *p) {
    static int kinds, host, peers;
    if (!p || !node || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph), on = -1;
    if (p->alloc_type != GM_PINNED || p->handle_types || p->usage)
        return hv_unsupported("graph allocations of managed or exportable memory, or with "
                              "usage flags", &kinds);
    CUresult r = hv_device_location(&p->location, &on, "graph allocations of host or NUMA "
                                    "memory", &host);
    if (r) return r;
    if (p->access_count && !p->access) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < p->access_count && on == device; i++) {
        int to = -1;
        r = hv_device_location(&p->access[i].location, &to, "graph allocations host or NUMA "
                               "memory may reach", &host);
        if (r) return r;
        if (to != device) on = -1;
        else if (p->access[i].flags != GM_READWRITE) return CUDA_ERROR_INVALID_VALUE;
    }
    if (on != device)
        return hv_unsupported("graph allocations on or reachable from another vGPU than the "
                              "graph's (peer access between vGPUs)", &peers);
    if (!p->bytesize) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_add_mem_alloc_node_req_t q = { hv_untag(graph), p->bytesize, GM_ON_DEVICE, 0, 0 };
    hvgpu_graph_add_mem_alloc_node_rep_t v;
    uint32_t got = 0;
    r = add_node_ex(node, graph, HVGPU_OP_GRAPH_ADD_MEM_ALLOC_NODE, &q, sizeof q,
                    FIELD_AT(hvgpu_graph_add_mem_alloc_node_req_t, deps_len), deps, ndeps, NULL,
                    0, &v, sizeof v, &got);
    if (!r && got < sizeof v) r = CUDA_ERROR_INVALID_VALUE;
    if (r) return r;
    p->dptr = v.dptr;
    hv_gm_alloc(graph, device, v.dptr, p->bytesize);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuGraphAddMemFreeNode(void **node, void *graph, void *const *deps,
                                         size_t ndeps, CUdeviceptr dptr) {
    hvgpu_graph_add_mem_free_node_req_t q = { hv_untag(graph), dptr, 0 };
    CUresult r = add_node(node, graph, HVGPU_OP_GRAPH_ADD_MEM_FREE_NODE, &q, sizeof q,
                          FIELD_AT(hvgpu_graph_add_mem_free_node_req_t, deps_len), deps, ndeps,
                          NULL, 0);
    if (!r) hv_gm_free(graph, dptr);
    return r;
}

/* What the executor's driver says of a node: its type, and a memory node's address and
   size. */
static CUresult node_info(void *node, hvgpu_graph_node_get_type_rep_t *v) {
    if (!hv_created(node)) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_node_get_type_req_t q = { hv_untag(node) };
    return HV_ON(hv_tag_device(node), hv_call(HVGPU_OP_GRAPH_NODE_GET_TYPE, &q, sizeof q, NULL,
                                              0, v, sizeof *v, NULL, NULL, 0));
}

HV_EXPORT CUresult cuGraphNodeGetType(void *node, int *type) {
    if (!type || !node) return CUDA_ERROR_INVALID_VALUE;
    if (hv_shadow_is_host(node)) { /* the guest's own */
        *type = NODE_HOST_TYPE;
        return CUDA_SUCCESS;
    }
    hvgpu_graph_node_get_type_rep_t v;
    CUresult r = node_info(node, &v);
    if (!r) *type = (int)v.type;
    return r;
}

HV_EXPORT CUresult cuGraphMemAllocNodeGetParams(void *node, mem_alloc_node_params *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_node_get_type_rep_t v;
    CUresult r = node_info(node, &v);
    if (r) return r;
    if (v.type != NODE_MEM_ALLOC_TYPE) return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->alloc_type = GM_PINNED;
    p->location = (gm_location){ GM_ON_DEVICE, hv_tag_device(node) };
    p->bytesize = v.size;
    p->dptr = v.dptr;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuGraphMemFreeNodeGetParams(void *node, CUdeviceptr *dptr) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_node_get_type_rep_t v;
    CUresult r = node_info(node, &v);
    if (r) return r;
    if (v.type != NODE_MEM_FREE_TYPE) return CUDA_ERROR_INVALID_VALUE;
    *dptr = v.dptr;
    return CUDA_SUCCESS;
}

/* The executor's driver's figures: its process's graph memory pool, which serves this
   VM's processes on the vGPU. */
HV_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    CUresult r = hv_check_device(dev);
    if (r) return r;
    return HV_ON(dev, hv_call(HVGPU_OP_DEVICE_GRAPH_MEM_TRIM, NULL, 0, NULL, 0, NULL, 0, NULL,
                              NULL, 0));
}

static CUresult graph_mem_attribute(CUdevice dev, int attr, void *value, uint32_t set) {
    CUresult r = hv_check_device(dev);
    if (r) return r;
    if (!value || attr < 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t in = 0;
    if (set) memcpy(&in, value, 8);
    hvgpu_device_graph_mem_attribute_req_t q = { (uint32_t)attr, set, in };
    hvgpu_device_graph_mem_attribute_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_DEVICE_GRAPH_MEM_ATTRIBUTE, &q, sizeof q, NULL, 0, &v,
                           sizeof v, NULL, NULL, 0));
    if (!r && !set) memcpy(value, &v.value, 8); /* a cuuint64_t */
    return r;
}

HV_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value) {
    return graph_mem_attribute(dev, attr, value, 0);
}

HV_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, int attr, void *value) {
    return graph_mem_attribute(dev, attr, value, 1);
}

/* -- conditional nodes and cuGraphAddNode ------------------------------------------------ */

HV_EXPORT CUresult cuGraphConditionalHandleCreate(uint64_t *handle, void *graph, void *ctx,
                                                  unsigned default_value, unsigned flags) {
    (void)ctx;
    if (!handle || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph);
    hvgpu_graph_conditional_handle_create_req_t q = { hv_untag(graph), default_value, flags };
    hvgpu_graph_conditional_handle_create_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_CONDITIONAL_HANDLE_CREATE, &q, sizeof q,
                                       NULL, 0, &v, sizeof v, NULL, NULL, 0));
    if (!r) *handle = v.handle; /* the driver's value: a kernel sets it, on the executor */
    return r;
}

/* A conditional node: the executor's, with the body graphs the driver made for it, into
   which the program adds nodes (they are the executor's graphs, named as any other). The
   array handed back is the program's for the node's life: kept for the process's. */
static CUresult conditional_node(void **node, void *graph, void *const *deps, size_t ndeps,
                                 uint64_t handle, unsigned type, unsigned size, void ***out) {
    if (!node || !out || !hv_created(graph) || !size || size > HVGPU_MAX_CONDITIONAL_BODIES)
        return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph);
    uint32_t cap = (uint32_t)(sizeof(hvgpu_graph_add_conditional_node_rep_t) + 8 * size);
    unsigned char *rep = malloc(cap);
    void **bodies = calloc(size, sizeof *bodies);
    if (!rep || !bodies) {
        free(rep);
        free(bodies);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    hvgpu_graph_add_conditional_node_req_t q = { hv_untag(graph), handle, type, size, 0 };
    uint32_t got = 0;
    CUresult r = add_node_ex(node, graph, HVGPU_OP_GRAPH_ADD_CONDITIONAL_NODE, &q, sizeof q,
                             FIELD_AT(hvgpu_graph_add_conditional_node_req_t, deps_len), deps,
                             ndeps, NULL, 0, rep, cap, &got);
    hvgpu_graph_add_conditional_node_rep_view_t v;
    if (!r && (hvgpu_graph_add_conditional_node_rep_decode(rep, got, &v) < 0 ||
               v.fixed.bodies_len != 8 * size || v.bodies.len != 8 * size))
        r = CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; !r && i < size; i++) {
        uint64_t h;
        memcpy(&h, v.bodies.data + 8 * i, 8);
        bodies[i] = hv_tag(device, h);
    }
    free(rep);
    if (r) {
        free(bodies);
        return r;
    }
    *out = bodies;
    return CUDA_SUCCESS;
}

typedef struct { /* CUgraphNodeParams (cuda.h 13.0) */
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        kernel_node_params kernel; /* CUDA_KERNEL_NODE_PARAMS_v3: v2's layout */
        struct { int flags, reserved; void *ctx; memcpy3d copy; } memcpy;
        struct { memset_node_params p; void *ctx; } memset;
        host_node_params host;
        struct { void *graph; int ownership; } child;
        struct { CUevent event; } event;
        struct { uint64_t handle; unsigned type, size; void **graph_out; void *ctx; } cond;
        mem_alloc_node_params alloc;
        struct { CUdeviceptr dptr; } free;
    } u;
    long long reserved2;
} graph_node_params;
_Static_assert(sizeof(graph_node_params) == 256, "CUgraphNodeParams");

enum { NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_HOST, NODE_GRAPH, NODE_EMPTY, NODE_WAIT_EVENT,
       NODE_EVENT_RECORD, NODE_CONDITIONAL = 13 };

HV_EXPORT CUresult cuGraphAddNode_v2(void **node, void *graph, void *const *deps,
                                     const unsigned char *edges, size_t ndeps,
                                     graph_node_params *p) {
    if (!p || !node) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; edges && i < 8 * ndeps; i++)
        if (edges[i]) return CUDA_ERROR_NOT_SUPPORTED; /* only the default edge kind */
    switch (p->type) {
    case NODE_KERNEL:
        return kernel_node(node, graph, deps, ndeps, &p->u.kernel, 1);
    case NODE_MEMCPY:
        return cuGraphAddMemcpyNode(node, graph, deps, ndeps, &p->u.memcpy.copy, p->u.memcpy.ctx);
    case NODE_MEMSET:
        return cuGraphAddMemsetNode(node, graph, deps, ndeps, &p->u.memset.p, p->u.memset.ctx);
    case NODE_HOST:
        return cuGraphAddHostNode(node, graph, deps, ndeps, &p->u.host);
    case NODE_EMPTY:
        return cuGraphAddEmptyNode(node, graph, deps, ndeps);
    case NODE_WAIT_EVENT:
        return cuGraphAddEventWaitNode(node, graph, deps, ndeps, p->u.event.event);
    case NODE_EVENT_RECORD:
        return cuGraphAddEventRecordNode(node, graph, deps, ndeps, p->u.event.event);
    case NODE_CONDITIONAL:
        return conditional_node(node, graph, deps, ndeps, p->u.cond.handle, p->u.cond.type,
                                p->u.cond.size, &p->u.cond.graph_out);
    case NODE_MEM_ALLOC_TYPE:
        return cuGraphAddMemAllocNode(node, graph, deps, ndeps, &p->u.alloc);
    case NODE_MEM_FREE_TYPE:
        return cuGraphAddMemFreeNode(node, graph, deps, ndeps, p->u.free.dptr);
    default: {
        static int once;
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
            hv_log("cuGraphAddNode of a node of type %d (child graphs, external semaphores, "
                   "batched memory operations) is not built by "
                   "hvgpu: CUDA_ERROR_NOT_SUPPORTED", p->type);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    }
}

HV_EXPORT CUresult cuGraphAddNode(void **node, void *graph, void *const *deps, size_t ndeps,
                                  graph_node_params *p) {
    return cuGraphAddNode_v2(node, graph, deps, NULL, ndeps, p);
}
