/* Driver entry points for contexts: the primary contexts, the thread's stack of
 * current contexts, and what a context answers (limits, flags, configuration).
 *
 * A context is the guest's handle on the executor's one context per device, so
 * creating one hands back that context (documented in the coverage list). Must
 * not send the agent a context of its own: every call runs in the executor's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define STACK_MAX 32
static __thread struct hv_ctx *ctx_stack[STACK_MAX];
static __thread int ctx_depth;

const char hv_client_software[] = "hvgpu libcuda shim";
const uint64_t hv_client_caps = HVGPU_CAP_PARAM_INFO | HVGPU_CAP_PROGRESS | HVGPU_CAP_REGION_MEMFD |
                                HVGPU_CAP_REGION_DEVICE | HVGPU_CAP_OUTPUT;

struct hv_ctx *hv_current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

struct hv_ctx *hv_current_or_primary(void) { return hv_current() ? hv_current() : hv_primary(0); }

static struct hv_ctx *valid_ctx(CUcontext ctx) {
    if (!ctx) return hv_current();
    return ctx->magic == 0x68766378 ? ctx : NULL;
}

void hv_cls_reset(CUcontext ctx); /* dark.c */

HV_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    struct hv_ctx *c = hv_primary(dev);
    __atomic_add_fetch(&c->retained, 1, __ATOMIC_RELAXED);
    *pctx = c;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult r = hv_check_device(dev);
    if (r) return r;
    struct hv_ctx *c = hv_primary(dev);
    if (__atomic_load_n(&c->retained, __ATOMIC_RELAXED) > 0)
        __atomic_sub_fetch(&c->retained, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned *flags, int *active) {
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    struct hv_ctx *c = hv_primary(dev);
    *flags = c->flags;
    *active = c->retained > 0;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned flags) {
    CUresult r = hv_check_device(dev);
    if (!r) hv_primary(dev)->flags = flags; /* scheduling hints: the executor decides */
    return r;
}

HV_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    static int once;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    r = HV_ON(dev, hv_call(HVGPU_OP_CTX_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, 0));
    struct hv_ctx *c = hv_primary(dev);
    hv_cls_reset(c);
    c->retained = 0;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) && hv_trace_enabled())
        hv_log("cuDevicePrimaryCtxReset: the context is kept; its memory is released when "
               "the program exits");
    return r;
}

HV_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = hv_current();
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx && ctx->magic != 0x68766378) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (ctx_depth) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth) ctx_stack[ctx_depth - 1] = ctx;
    else ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    if (!ctx || ctx->magic != 0x68766378) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == STACK_MAX) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct hv_ctx *c = ctx_stack[--ctx_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

static CUresult create(CUcontext *pctx, unsigned flags, CUdevice dev) {
    static int once;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuDevicePrimaryCtxRetain(pctx, dev);
    if (r) return r;
    (*pctx)->flags = flags;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED) && hv_trace_enabled())
        hv_log("cuCtxCreate: a vGPU has one context; the new context is that one");
    return cuCtxPushCurrent_v2(*pctx);
}

HV_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev) {
    return create(pctx, flags, dev);
}

/* A vGPU's one context cannot be narrowed to some of the GPU's SMs (execution
   affinity) nor made to share a graphics API's context (CIG): asked for either, the
   shim refuses as the driver refuses what the device does not support, and says why.
   CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY is the driver's status for an affinity it does
   not take; CUDA_ERROR_NOT_SUPPORTED its status for CIG where CIG is not supported. */
static CUresult refuse_affinity(const void *params, int n) {
    static int once;
    if (n < 0 || (n > 0 && !params)) return CUDA_ERROR_INVALID_VALUE;
    if (!n) return CUDA_SUCCESS;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
        hv_log("cuCtxCreate with execution affinity refused: a vGPU has one context, whose "
               "SMs are the slice's compute share; no context of fewer SMs can be made");
    return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
}

HV_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int n, unsigned flags,
                                  CUdevice dev) {
    CUresult r = refuse_affinity(params, n);
    return r ? r : create(pctx, flags, dev);
}

/* CUctxCreateParams, as cuda.h 12.5+ lays it out. */
typedef struct {
    void *affinity;   /* CUexecAffinityParam * */
    int naffinity;
    void *cig;        /* CUctxCigParam * */
} hv_ctx_create_params;

HV_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, hv_ctx_create_params *params, unsigned flags,
                                  CUdevice dev) {
    static int once;
    if (params) {
        CUresult r = refuse_affinity(params->affinity, params->naffinity);
        if (r) return r;
        if (params->cig) {
            if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
                hv_log("cuCtxCreate in CIG mode refused: the GPU is the host's; no graphics "
                       "API's context of the guest can share it");
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return create(pctx, flags, dev);
}

HV_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (hv_current() == ctx) ctx_depth--;
    return cuDevicePrimaryCtxRelease_v2(ctx->device);
}

HV_EXPORT CUresult cuCtxGetDevice(CUdevice *dev) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    struct hv_ctx *c = hv_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    struct hv_ctx *c = valid_ctx(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxSynchronize(void) {
    CUresult r = hv_call(HVGPU_OP_CTX_SYNCHRONIZE, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, 0);
    if (!r) hv_graph_synced_device(hv_routed_device()); /* graphs' pageable copies land */
    return r ? r : hv_managed_synced(hv_routed_device(), NULL, 1);
}

HV_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
    struct hv_ctx *c = valid_ctx(ctx);
    if (!c) return ctx ? CUDA_ERROR_INVALID_CONTEXT : cuCtxSynchronize();
    return HV_ON(c->device, cuCtxSynchronize());
}

HV_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxGetFlags(unsigned *flags) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    struct hv_ctx *c = hv_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    struct hv_ctx *c = valid_ctx(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *id = (unsigned long long)c->device + 1;
    return CUDA_SUCCESS;
}

/* The executor context's answers, once per limit, and what cuCtxSetLimit made of them
   (libraries choose kernels by them: cuBLAS asks whether the context is a CIG context
   and how much shared memory it may use). */
static size_t limit_cached[32];
static unsigned char limit_have[32];

static void limit_keep(int limit, size_t value) {
    if (limit < 0 || limit >= 32) return;
    __atomic_store_n(&limit_cached[limit], value, __ATOMIC_RELAXED);
    __atomic_store_n(&limit_have[limit], 1, __ATOMIC_RELEASE);
}

HV_EXPORT CUresult cuCtxGetLimit(size_t *value, int limit) {
    if (!value || limit < 0) return CUDA_ERROR_INVALID_VALUE;
    if (limit < 32 && __atomic_load_n(&limit_have[limit], __ATOMIC_ACQUIRE)) {
        *value = __atomic_load_n(&limit_cached[limit], __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    hvgpu_ctx_get_limit_req_t q = { limit };
    hvgpu_ctx_get_limit_rep_t v;
    CUresult r = hv_call(HVGPU_OP_CTX_GET_LIMIT, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    *value = (size_t)v.value;
    limit_keep(limit, (size_t)v.value);
    return CUDA_SUCCESS;
}

/* Set on the executor's context, which the VM's programs served by it at once share;
   the memory the driver reserves for it is charged to the slice (past its quota:
   CUDA_ERROR_OUT_OF_MEMORY, as the driver's own). The value kept is the one the driver
   then reports (it rounds a stack size up). Answered: its status is the driver's. */
HV_EXPORT CUresult cuCtxSetLimit(int limit, size_t value) {
    if (limit < 0) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    hvgpu_ctx_set_limit_req_t q = { limit, (uint64_t)value };
    hvgpu_ctx_set_limit_rep_t v;
    CUresult r = hv_call(HVGPU_OP_CTX_SET_LIMIT, &q, sizeof q, NULL, 0, &v, sizeof v, NULL, NULL, 0);
    if (!r) limit_keep(limit, (size_t)v.value);
    return r;
}

HV_EXPORT CUresult cuCtxGetCacheConfig(int *config) {
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    *config = 0; /* CU_FUNC_CACHE_PREFER_NONE */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxSetCacheConfig(int config) {
    (void)config; /* a preference CUDA itself may ignore */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    static int have, cached_least, cached_greatest;
    if (!have) {
        hvgpu_stream_priority_range_rep_t v;
        CUresult r = hv_call(HVGPU_OP_STREAM_PRIORITY_RANGE, NULL, 0, NULL, 0, &v, sizeof v,
                             NULL, NULL, 0);
        if (r) return r;
        cached_least = v.least;
        cached_greatest = v.greatest;
        have = 1;
    }
    if (least) *least = cached_least;
    if (greatest) *greatest = cached_greatest;
    return CUDA_SUCCESS;
}

/* CU_CTX_FLAGS_MASK's flags, with a scheduling mode CU_CTX_SCHED_MASK names (auto, spin,
   yield, blocking sync). They are the program's word about how it waits: the executor's
   context keeps its own, and the shim's waits are the socket's. */
HV_EXPORT CUresult cuCtxSetFlags(unsigned flags) {
    struct hv_ctx *c = hv_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned sched = flags & 0x07u;
    if (flags & ~0xFFu || (sched != 0 && sched != 1 && sched != 2 && sched != 4))
        return CUDA_ERROR_INVALID_VALUE;
    c->flags = flags;
    return CUDA_SUCCESS;
}

/* Shared memory banks are four bytes wide and fixed on every GPU a driver of CUDA 12+
   runs (Volta and later): the driver answers four and takes any valid setting as a
   no-op, and so does the shim. CUsharedconfig: 0 default, 1 four bytes, 2 eight. */
HV_EXPORT CUresult cuCtxGetSharedMemConfig(int *config) {
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    *config = 1; /* CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuCtxSetSharedMemConfig(int config) {
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    return config < 0 || config > 2 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

HV_EXPORT CUresult cuFuncSetSharedMemConfig(CUfunction f, int config) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    return config < 0 || config > 2 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Execution affinity: a vGPU's one context cannot be narrowed to fewer SMs (see
   refuse_affinity), so the device says it does not support it, and the context's
   affinity is asked as of such a device. CU_EXEC_AFFINITY_TYPE_SM_COUNT is 0, the only
   type. */
HV_EXPORT CUresult cuDeviceGetExecAffinitySupport(int *pi, int type, CUdevice dev) {
    if (!pi || type != 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = hv_check_device(dev);
    if (!r) *pi = 0;
    return r;
}

HV_EXPORT CUresult cuCtxGetExecAffinity(void *param, int type) {
    if (!param || type != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
}

/* On the executor's context of the vGPU, which all the VM's programs on it share (one
   process's contexts and the work of the others on that vGPU alike are captured, or wait:
   more than the program's own, never less). Answered: the driver's refusal (a capture
   under way, a bad event) comes back at the call. */
static CUresult ctx_event(CUcontext ctx, CUevent event, uint32_t wait) {
    struct hv_ctx *c = valid_ctx(ctx);
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!hv_created(event)) return CUDA_ERROR_INVALID_HANDLE;
    if (hv_tag_device(event) != c->device) {
        /* Recording needs an event of the context; waiting may take another vGPU's, whose
           executor is another process: the guest waits for it, and the context's later
           work is issued after. */
        return wait ? hv_call_handle(hv_tag_device(event), HVGPU_OP_EVENT_SYNCHRONIZE,
                                     hv_untag(event))
                    : CUDA_ERROR_INVALID_HANDLE;
    }
    hvgpu_ctx_event_req_t q = { hv_untag(event), wait };
    return HV_ON(c->device, hv_call(HVGPU_OP_CTX_EVENT, &q, sizeof q, NULL, 0, NULL, 0, NULL,
                                    NULL, 0));
}

HV_EXPORT CUresult cuCtxRecordEvent(CUcontext ctx, CUevent event) { return ctx_event(ctx, event, 0); }
HV_EXPORT CUresult cuCtxWaitEvent(CUcontext ctx, CUevent event) { return ctx_event(ctx, event, 1); }

HV_EXPORT CUresult cuCtxResetPersistingL2Cache(void) {
    if (!hv_current()) return CUDA_ERROR_INVALID_CONTEXT;
    return hv_call(HVGPU_OP_CTX_RESET_PERSISTING_L2, NULL, 0, NULL, 0, NULL, 0, NULL, NULL, 0);
}

/* Unversioned names with the same arguments as their _v2 (NVIDIA's library keeps
   exporting them, and libraries such as cuBLASLt look them up by name). */
HV_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }
HV_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
HV_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }
HV_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
HV_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}
HV_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
