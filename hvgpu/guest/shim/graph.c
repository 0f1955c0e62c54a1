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
 * What a graph cannot replay is refused at capture with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture invalidated, as the driver
 * does with what it cannot capture: copies from or to pageable memory (the executor
 * would capture its own staging buffer) and host functions here, stream-ordered
 * allocation on a capturing stream by the executor (a graph memory node is not built). Copies from or to
 * pinned memory in the shared-memory region are captured: the graph reads and
 * writes the region when it runs. Capture modes are the program's: the executor
 * serves every guest thread on one thread in relaxed mode, so the rules the driver
 * applies per thread are not applied; a call CUDA would refuse to a thread during
 * another thread's global-mode capture goes through.
 *
 * Must not touch a graph's contents in the guest: they are the executor's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define MODE_RELAXED 2
#define STATUS_NONE 0
#define MAX_CAPTURES 256
#define MAX_QUERY_NODES 4096 /* as the executor's graphs.MAX_QUERY_NODES */
#define MAX_GRAPH_NODES 65536 /* graphs.MAX_NODES: node handles a connection is given */

static struct capture {
    CUstream stream; /* 0: free slot */
    unsigned long long id;
    void *graph;
    int mode;
    pthread_t thread;
} captures[MAX_CAPTURES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int active; /* captures[] in use */

int hv_capture_active(void) { return __atomic_load_n(&active, __ATOMIC_ACQUIRE) > 0; }

static struct capture *find(CUstream stream) {
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i].stream == stream && stream) return &captures[i];
    return NULL;
}

/* The stream's vGPU: a created stream's own, else (a special stream) the routed one. */
static int device_of(CUstream stream) { return hv_tag_device(stream); }

/* The capture table's key: a special stream stands for the routed vGPU's, so two
   vGPUs' per-thread streams are told apart. */
static CUstream key_of(CUstream stream) {
    return hv_created(stream) ? stream : hv_tag(device_of(stream), hv_untag(stream));
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
    }
    pthread_mutex_unlock(&lock);
    if (!c) { /* more captures at once than kept: queries would lie, so refuse */
        hvgpu_stream_end_capture_req_t e = { hv_untag(stream) };
        hvgpu_stream_end_capture_rep_t g;
        HV_ON(device, hv_call(HVGPU_OP_STREAM_END_CAPTURE, &e, sizeof e, NULL, 0, &g, sizeof g,
                              NULL, NULL, 0));
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
    unsigned before = HV_ON(device, hv_oneway_failures());
    hvgpu_stream_end_capture_req_t q = { hv_untag(stream) };
    hvgpu_stream_end_capture_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_END_CAPTURE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    /* An earlier one-way frame's error answered instead: the end was not carried out. */
    int deferred = r && (unsigned)HV_ON(device, hv_oneway_failures()) != before;
    if (!deferred) {
        pthread_mutex_lock(&lock);
        c = find(key);
        if (c) {
            c->stream = NULL;
            __atomic_sub_fetch(&active, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&lock);
    }
    *graph = r ? NULL : hv_tag(device, v.graph);
    return r;
}

/* What the executor says of a stream's capture; nodes (tagged) into a thread's array. */
static __thread void *query_nodes[MAX_QUERY_NODES];

static CUresult query(CUstream stream, int *status, unsigned long long *id, void **graph,
                      size_t *ndeps) {
    *status = STATUS_NONE;
    *id = 0;
    *graph = NULL;
    *ndeps = 0;
    if (!hv_capture_active()) return CUDA_SUCCESS;
    int device = device_of(stream);
    hvgpu_stream_capture_info_req_t q = { hv_untag(stream) };
    static __thread unsigned char rep[sizeof(hvgpu_stream_capture_info_rep_t) + 8 * MAX_QUERY_NODES];
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_CAPTURE_INFO, &q, sizeof q, NULL, 0, rep,
                                       sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_stream_capture_info_rep_t v;
    if (n < sizeof v) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&v, rep, sizeof v);
    size_t count = v.nodes_len / 8;
    if (count > (n - sizeof v) / 8 || count > MAX_QUERY_NODES) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        uint64_t h;
        memcpy(&h, rep + sizeof v + 8 * i, 8);
        query_nodes[i] = hv_tag(device, h);
    }
    *status = (int)v.status;
    *id = v.id;
    *graph = v.graph ? hv_tag(device, v.graph) : NULL;
    *ndeps = count;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int *status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long id;
    void *graph;
    size_t n;
    return query(stream, status, &id, &graph, &n);
}

HV_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream stream, int *status, unsigned long long *id,
                                             void **graph, const void **deps,
                                             const void **edges, size_t *ndeps) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long i;
    void *g;
    size_t n;
    CUresult r = query(stream, status, &i, &g, &n);
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

CUresult hv_capture_refuse(CUstream stream, const char *what) {
    if (!hv_capture_active()) return CUDA_SUCCESS;
    int status;
    CUresult r = cuStreamIsCapturing(stream, &status);
    if (r) return r;
    if (status == STATUS_NONE) return CUDA_SUCCESS;
    /* As the driver does with an operation it cannot capture, the capture is
       invalidated: a synchronisation of the capturing stream is what invalidates it on
       the executor (and is itself refused). */
    r = cuStreamSynchronize(stream);
    static int once;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) || hv_trace_enabled())
        hv_log("%s on a capturing stream cannot be replayed by a graph through hvgpu: refused "
               "with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (use pinned memory, cudaMallocHost, "
               "for copies in a graph)", what);
    return r ? r : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* -- graphs --------------------------------------------------------------------------- */

HV_EXPORT CUresult cuGraphUpload(void *exec, CUstream stream);

static CUresult about(const void *object, uint16_t op) {
    uint64_t q = hv_untag(object);
    return HV_ON(hv_tag_device(object), hv_call(op, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0));
}
_Static_assert(sizeof(hvgpu_graph_destroy_req_t) == 8 && sizeof(hvgpu_graph_exec_destroy_req_t) == 8,
               "one-handle requests");

static CUresult instantiate(void **exec, void *graph, unsigned long long flags) {
    if (!exec || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph);
    hvgpu_graph_instantiate_req_t q = { hv_untag(graph), flags };
    hvgpu_graph_instantiate_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_INSTANTIATE, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    *exec = r ? NULL : hv_tag(device, v.exec);
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
    int device = hv_tag_device(exec);
    if (hv_created(stream) && hv_tag_device(stream) != device) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_upload_req_t q = { hv_untag(exec), hv_untag(stream) };
    return HV_ON(device, hv_oneway(HVGPU_OP_GRAPH_UPLOAD, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuGraphLaunch(void *exec, CUstream stream) {
    if (!hv_created(exec)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(exec);
    if (hv_created(stream) && hv_tag_device(stream) != device) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_graph_launch_req_t q = { hv_untag(exec), hv_untag(stream) };
    return HV_ON(device, hv_oneway(HVGPU_OP_GRAPH_LAUNCH, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *count) {
    if (!count || !hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(graph);
    size_t want = nodes ? *count : 0;
    if (want > MAX_GRAPH_NODES) return CUDA_ERROR_INVALID_VALUE;
    size_t cap = sizeof(hvgpu_graph_get_nodes_rep_t) + 8 * want;
    unsigned char *rep = malloc(cap);
    if (!rep) return CUDA_ERROR_OUT_OF_MEMORY;
    hvgpu_graph_get_nodes_req_t q = { hv_untag(graph), (uint32_t)want };
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_GRAPH_GET_NODES, &q, sizeof q, NULL, 0, rep,
                                       (uint32_t)cap, &n, NULL, 0));
    hvgpu_graph_get_nodes_rep_t v;
    if (!r && n < sizeof v) r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        memcpy(&v, rep, sizeof v);
        size_t got = v.nodes_len / 8;
        if (got > want || got > (n - sizeof v) / 8) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else if (nodes) {
            for (size_t i = 0; i < *count; i++) {
                uint64_t h = 0;
                if (i < got) memcpy(&h, rep + sizeof v + 8 * i, 8);
                nodes[i] = h ? hv_tag(device, h) : NULL;
            }
            /* as CUDA: with room to spare, how many there are; else how many were asked */
            if (v.count < *count) *count = v.count;
        } else {
            *count = v.count;
        }
    }
    free(rep);
    return r;
}

HV_EXPORT CUresult cuGraphDestroy(void *graph) {
    if (!hv_created(graph)) return CUDA_ERROR_INVALID_VALUE;
    return about(graph, HVGPU_OP_GRAPH_DESTROY);
}

HV_EXPORT CUresult cuGraphExecDestroy(void *exec) {
    if (!hv_created(exec)) return CUDA_ERROR_INVALID_VALUE;
    return about(exec, HVGPU_OP_GRAPH_EXEC_DESTROY);
}
