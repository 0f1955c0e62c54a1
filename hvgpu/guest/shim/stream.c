/* Driver entry points for streams and events.
 *
 * Stream and event handles are the executor's numbers, tagged with their vGPU
 * (shim.h), used as the opaque pointers CUDA hands out; each call goes to its
 * object's vGPU. A stream waiting on another vGPU's event waits in this process
 * (the executors are separate processes). Host callbacks run on the calling thread once the
 * stream's earlier work is done (so they still follow that work, but block
 * the caller); on a capturing stream they are refused (graph.c says why). Stream
 * capture and graphs are graph.c's.
 *
 * Completion is never answered here: stream and event queries and synchronisations
 * always ask the executor, after the one-way frames sent before them on the same
 * connection. So a copy into pinned memory (region_lane.c), which returns before its
 * bytes are there, is done once such an answer says its stream's work is.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>

#include "shim.h"

#define MAX_STREAM_INFO 4096
static struct { uint64_t handle; unsigned flags; int priority; } info[MAX_STREAM_INFO];
static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;

static void remember(uint64_t h, unsigned flags, int priority) {
    pthread_mutex_lock(&info_lock);
    info[h % MAX_STREAM_INFO].handle = h;
    info[h % MAX_STREAM_INFO].flags = flags;
    info[h % MAX_STREAM_INFO].priority = priority;
    pthread_mutex_unlock(&info_lock);
}

static int recall(uint64_t h, unsigned *flags, int *priority) {
    pthread_mutex_lock(&info_lock);
    int found = info[h % MAX_STREAM_INFO].handle == h;
    if (found) {
        if (flags) *flags = info[h % MAX_STREAM_INFO].flags;
        if (priority) *priority = info[h % MAX_STREAM_INFO].priority;
    }
    pthread_mutex_unlock(&info_lock);
    return found;
}

HV_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    if (!stream) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_stream_create_req_t q = { flags };
    hvgpu_stream_create_rep_t v;
    CUresult r = hv_call(HVGPU_OP_STREAM_CREATE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    *stream = hv_tag(hv_routed_device(), v.stream);
    remember((uint64_t)(uintptr_t)*stream, flags, 0);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamCreateWithPriority(CUstream *stream, unsigned flags, int priority) {
    if (!stream) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_stream_create_priority_req_t q = { flags, priority };
    hvgpu_stream_create_priority_rep_t v;
    CUresult r = hv_call(HVGPU_OP_STREAM_CREATE_PRIORITY, &q, sizeof q, NULL, 0, &v, sizeof v,
                         NULL, NULL, 0);
    if (r) return r;
    *stream = hv_tag(hv_routed_device(), v.stream);
    remember((uint64_t)(uintptr_t)*stream, flags, priority);
    return CUDA_SUCCESS;
}

/* A call about one stream or event, on its vGPU's connection. */
static CUresult about(const void *object, uint16_t op) {
    return hv_call_handle(hv_tag_device(object), op, hv_untag(object));
}
_Static_assert(sizeof(hvgpu_stream_synchronize_req_t) == 8 &&
               sizeof(hvgpu_event_synchronize_req_t) == 8, "one-handle requests");

HV_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    /* Pool blocks kept for reuse on it are freed on it first, while it exists. */
    if (hv_created(stream)) hv_pool_release_stream(stream);
    CUresult r = about(stream, HVGPU_OP_STREAM_DESTROY);
    if (!r) hv_capture_stream_destroyed(stream);
    return r;
}

HV_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    CUresult r = about(stream, HVGPU_OP_STREAM_SYNCHRONIZE);
    if (!r) hv_graph_synced_stream(stream); /* a graph's copies into pageable memory */
    return r ? r : hv_managed_synced(hv_tag_device(stream), stream, 0);
}

HV_EXPORT CUresult cuStreamQuery(CUstream stream) {
    CUresult r = about(stream, HVGPU_OP_STREAM_QUERY);
    if (!r) hv_graph_synced_stream(stream);
    return r ? r : hv_managed_synced(hv_tag_device(stream), stream, 0);
}

HV_EXPORT CUresult cuEventSynchronize(CUevent event);

HV_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
    int device = hv_tag_device(stream);
    if (hv_tag_device(event) != device) /* another vGPU's: wait for it here */
        return cuEventSynchronize(event);
    hvgpu_stream_wait_event_req_t q = { hv_untag(stream), hv_untag(event), flags };
    return HV_ON(device, hv_oneway(HVGPU_OP_STREAM_WAIT_EVENT, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuStreamGetFlags(CUstream stream, unsigned *flags) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    if (!recall((uint64_t)(uintptr_t)stream, flags, NULL)) *flags = 0;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamGetPriority(CUstream stream, int *priority) {
    if (!priority) return CUDA_ERROR_INVALID_VALUE;
    if (!recall((uint64_t)(uintptr_t)stream, NULL, priority)) *priority = 0;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamGetId(CUstream stream, unsigned long long *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    *id = (unsigned long long)(uintptr_t)stream;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = hv_created(stream) ? hv_primary(hv_tag_device(stream)) : hv_current_or_primary();
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamGetDevice(CUstream stream, CUdevice *dev) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    cuStreamGetCtx(stream, &ctx);
    *dev = ctx->device;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *data) {
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    if (hv_capture_host(stream, fn, NULL, data, &r)) return r; /* a step of the graph */
    r = cuStreamSynchronize(stream);
    if (!r) fn(data);
    return r;
}

HV_EXPORT CUresult cuStreamAddCallback(CUstream stream, void (*cb)(CUstream, CUresult, void *),
                                       void *data, unsigned flags) {
    (void)flags;
    if (!cb) return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    if (hv_capture_host(stream, NULL, cb, data, &r)) return r; /* a step of the graph */
    r = cuStreamSynchronize(stream);
    cb(stream, r, data);
    return CUDA_SUCCESS;
}

/* -- stream attributes ------------------------------------------------------------ */

/* CUstreamAttrValue is CUlaunchAttributeValue: 64 bytes, sent as they are; the
 * executor takes only the attributes valid for streams and an access policy window
 * only over this process's own memory. A priority set so is remembered as one given
 * at creation (cuStreamGetPriority answers from here), as the executor clamped it. */
_Static_assert(HVGPU_LAUNCH_ATTR_VALUE_SIZE == 64, "CUlaunchAttributeValue");
enum { ATTR_PRIORITY = 8 };

HV_EXPORT CUresult cuStreamGetAttribute(CUstream stream, int attr, void *out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_stream_get_attribute_req_t q = { hv_untag(stream), (uint32_t)attr };
    unsigned char rep[sizeof(hvgpu_stream_get_attribute_rep_t) + HVGPU_LAUNCH_ATTR_VALUE_SIZE];
    uint32_t n = 0;
    CUresult r = HV_ON(hv_tag_device(stream), hv_call(HVGPU_OP_STREAM_GET_ATTRIBUTE, &q, sizeof q,
                                                      NULL, 0, rep, sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_stream_get_attribute_rep_view_t v;
    hvgpu_stream_get_attribute_rep_decode(rep, n, &v);
    memset(out, 0, HVGPU_LAUNCH_ATTR_VALUE_SIZE);
    memcpy(out, v.value.data, v.value.len < HVGPU_LAUNCH_ATTR_VALUE_SIZE
                                  ? v.value.len : HVGPU_LAUNCH_ATTR_VALUE_SIZE);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuStreamSetAttribute(CUstream stream, int attr, const void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    struct __attribute__((packed)) {
        hvgpu_stream_set_attribute_req_t q;
        unsigned char value[HVGPU_LAUNCH_ATTR_VALUE_SIZE];
    } body;
    body.q = (hvgpu_stream_set_attribute_req_t){ hv_untag(stream), (uint32_t)attr,
                                                 HVGPU_LAUNCH_ATTR_VALUE_SIZE };
    memcpy(body.value, value, sizeof body.value);
    int device = hv_tag_device(stream);
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_SET_ATTRIBUTE, &body, sizeof body, NULL, 0,
                                       NULL, 0, NULL, NULL, 0));
    if (!r && attr == ATTR_PRIORITY && hv_created(stream)) {
        int now[HVGPU_LAUNCH_ATTR_VALUE_SIZE / sizeof(int)];
        unsigned flags = 0;
        recall((uint64_t)(uintptr_t)stream, &flags, NULL);
        if (!cuStreamGetAttribute(stream, attr, now))
            remember((uint64_t)(uintptr_t)stream, flags, now[0]);
    }
    return r;
}

HV_EXPORT CUresult cuStreamCopyAttributes(CUstream dst, CUstream src) {
    int device = hv_tag_device(dst);
    if (hv_tag_device(src) != device) return CUDA_ERROR_INVALID_HANDLE; /* another context's */
    hvgpu_stream_copy_attributes_req_t q = { hv_untag(dst), hv_untag(src) };
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_STREAM_COPY_ATTRIBUTES, &q, sizeof q, NULL, 0,
                                       NULL, 0, NULL, NULL, 0));
    if (!r && hv_created(dst)) { /* the priority came with them */
        int now[HVGPU_LAUNCH_ATTR_VALUE_SIZE / sizeof(int)];
        unsigned flags = 0;
        recall((uint64_t)(uintptr_t)dst, &flags, NULL);
        if (!cuStreamGetAttribute(dst, ATTR_PRIORITY, now))
            remember((uint64_t)(uintptr_t)dst, flags, now[0]);
    }
    return r;
}

/* -- events -------------------------------------------------------------------- */

HV_EXPORT CUresult cuEventCreate(CUevent *event, unsigned flags) {
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_event_create_req_t q = { flags };
    hvgpu_event_create_rep_t v;
    CUresult r = hv_call(HVGPU_OP_EVENT_CREATE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (!r) *event = hv_tag(hv_routed_device(), v.event);
    return r;
}

HV_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    return about(event, HVGPU_OP_EVENT_DESTROY);
}

HV_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
    int device = hv_tag_device(event);
    if (hv_created(stream) && hv_tag_device(stream) != device)
        return CUDA_ERROR_INVALID_HANDLE; /* as CUDA: the stream of another context */
    hvgpu_event_record_req_t q = { hv_untag(event), hv_untag(stream) };
    hv_graph_event_recorded(event, stream);
    return HV_ON(device, hv_oneway(HVGPU_OP_EVENT_RECORD, &q, sizeof q, NULL, 0));
}

HV_EXPORT CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned flags) {
    static int once;
    if (flags) return hv_unsupported("cuEventRecordWithFlags (external events)", &once);
    return cuEventRecord(event, stream);
}

HV_EXPORT CUresult cuEventQuery(CUevent event) {
    CUresult r = about(event, HVGPU_OP_EVENT_QUERY);
    if (!r) hv_graph_event_done(event);
    return r ? r : hv_managed_synced(hv_tag_device(event), NULL, 0);
}

HV_EXPORT CUresult cuEventSynchronize(CUevent event) {
    CUresult r = about(event, HVGPU_OP_EVENT_SYNCHRONIZE);
    if (!r) hv_graph_event_done(event);
    return r ? r : hv_managed_synced(hv_tag_device(event), NULL, 0);
}

HV_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    int device = hv_tag_device(start);
    if (hv_tag_device(end) != device) return CUDA_ERROR_INVALID_HANDLE;
    hvgpu_event_elapsed_time_req_t q = { hv_untag(start), hv_untag(end) };
    hvgpu_event_elapsed_time_rep_t v;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_EVENT_ELAPSED_TIME, &q, sizeof q, NULL, 0, &v,
                                       sizeof v, NULL, NULL, 0));
    if (!r) *ms = v.ms;
    return r;
}

HV_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) {
    return cuEventElapsedTime(ms, start, end);
}

/* Unversioned names with the same arguments as their _v2. */
HV_EXPORT CUresult cuStreamDestroy(CUstream stream) { return cuStreamDestroy_v2(stream); }
HV_EXPORT CUresult cuEventDestroy(CUevent event) { return cuEventDestroy_v2(event); }

/* Green contexts are not built: no stream belongs to one. */
HV_EXPORT CUresult cuStreamGetGreenCtx(CUstream stream, void **green) {
    (void)stream;
    if (!green) return CUDA_ERROR_INVALID_VALUE;
    *green = NULL;
    return CUDA_SUCCESS;
}
