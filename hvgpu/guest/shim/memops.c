/* Stream memory operations: cuStreamWaitValue32/64, cuStreamWriteValue32/64 and
 * cuStreamBatchMemOp, in their _v2 forms and the deprecated v1 ones.
 *
 * Each call is one one-way frame (STREAM_MEMOP), ordered on its stream as launches and
 * memsets are, its error reported by a later synchronising call; the executor calls
 * the same entry point (_v2 or v1) of the driver, so flags and operations the driver
 * refuses (the v1 API where the device does not enable it, NO_MEMORY_BARRIER in the
 * v2, FLUSH where CAN_FLUSH_REMOTE_WRITES is 0) are refused by the driver itself. A
 * capturing stream captures them as the driver does (or the driver refuses it, and
 * the capture fails at its end): nothing is dropped.
 *
 * Their addresses are device addresses: of device memory this program allocated, or
 * of pinned memory the executor maps at the program's own address (region_lane.c).
 * Refused here, at the call: pinned or registered memory the device cannot reach
 * (CUDA_ERROR_NOT_SUPPORTED, said once), and addresses of nothing this program holds
 * (CUDA_ERROR_INVALID_VALUE); the executor checks them again, against what this
 * connection holds.
 *
 * Must not touch the memory it names: the device reads and writes it.
 */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

enum { WAIT32 = 1, WRITE32 = 2, FLUSH = 3, WAIT64 = 4, WRITE64 = 5, BARRIER = 6 };

typedef struct __attribute__((packed)) {
    uint32_t operation, flags;
    uint64_t address, value;
} memop_t;
_Static_assert(sizeof(memop_t) == HVGPU_MEMOP_SIZE, "STREAM_MEMOP's record");

/* CUstreamBatchMemOpParams, as cuda.h lays it out (48 bytes). */
typedef union {
    uint32_t operation;
    struct {
        uint32_t operation;
        uint64_t address;
        union { uint32_t value; uint64_t value64; };
        uint32_t flags;
        uint64_t alias;
    } value_op; /* waitValue and writeValue alike */
    struct { uint32_t operation, flags; } flags_op; /* flushRemoteWrites, memoryBarrier */
    uint64_t pad[6];
} batch_param_t;
_Static_assert(sizeof(batch_param_t) == 48, "CUstreamBatchMemOpParams");

/* Whether the device may reach [a, a + width) in this program: CUDA_SUCCESS, or why not. */
static CUresult reachable(uint64_t a, unsigned width) {
    static int pinned_once, registered_once;
    if (hv_alloc_find((CUdeviceptr)a, NULL, NULL)) return CUDA_SUCCESS;
    int mapped = 0;
    if (hv_region_device_map((const void *)(uintptr_t)a, width, &mapped))
        return mapped ? CUDA_SUCCESS
                      : hv_unsupported("a stream memory operation on pinned memory the "
                                       "executor could not map at the program's address",
                                       &pinned_once);
    if (hv_host_find((const void *)(uintptr_t)a, NULL, NULL))
        return hv_unsupported("a stream memory operation on host memory outside cuMemHostAlloc "
                              "(registered or ordinary memory: the device cannot reach it)",
                              &registered_once);
    if (hv_trace_enabled())
        hv_log("stream memory operation: 0x%llx is no memory this program allocated through "
               "the shim", (unsigned long long)a);
    return CUDA_ERROR_INVALID_VALUE;
}

/* ops[0..count) on stream, as `call` (HVGPU_MEMOP_*) says. */
static CUresult send(CUstream stream, uint32_t call, const memop_t *ops, unsigned count,
                     unsigned flags) {
    for (unsigned i = 0; i < count; i++) {
        unsigned width = ops[i].operation == WAIT32 || ops[i].operation == WRITE32 ? 4
                         : ops[i].operation == WAIT64 || ops[i].operation == WRITE64 ? 8 : 0;
        if (!width && ops[i].operation != FLUSH && ops[i].operation != BARRIER)
            return CUDA_ERROR_INVALID_VALUE;
        if (width) {
            CUresult r = reachable(ops[i].address, width);
            if (r) return r;
        }
    }
    struct __attribute__((packed)) {
        hvgpu_stream_memop_req_t q;
        memop_t ops[HVGPU_MAX_MEMOPS];
    } body;
    body.q = (hvgpu_stream_memop_req_t){ hv_untag(stream), flags, call, count,
                                         count * (uint32_t)sizeof(memop_t) };
    memcpy(body.ops, ops, count * sizeof *ops);
    int device = hv_tag_device(stream);
    return HV_ON(device, hv_oneway(HVGPU_OP_STREAM_MEMOP, &body,
                                   (uint32_t)(sizeof body.q + count * sizeof *ops), NULL, 0));
}

static CUresult one(CUstream stream, int v1, uint32_t operation, CUdeviceptr addr,
                    uint64_t value, unsigned flags) {
    memop_t op = { operation, flags, addr, value };
    return send(stream, v1 ? HVGPU_MEMOP_ONE_V1 : HVGPU_MEMOP_ONE, &op, 1, 0);
}

static CUresult batch(CUstream stream, int v1, unsigned count, const batch_param_t *params,
                      unsigned flags) {
    /* flags: "must be 0", refused at the call as the driver does, not at the next sync */
    if (!count || count > HVGPU_MAX_MEMOPS || !params || flags) return CUDA_ERROR_INVALID_VALUE;
    memop_t ops[HVGPU_MAX_MEMOPS];
    for (unsigned i = 0; i < count; i++) {
        const batch_param_t *p = &params[i];
        switch (p->operation) {
        case WAIT32: case WRITE32:
            ops[i] = (memop_t){ p->operation, p->value_op.flags, p->value_op.address,
                                p->value_op.value };
            break;
        case WAIT64: case WRITE64:
            ops[i] = (memop_t){ p->operation, p->value_op.flags, p->value_op.address,
                                p->value_op.value64 };
            break;
        default: /* a flush, a barrier; anything else is refused in send */
            ops[i] = (memop_t){ p->operation, p->flags_op.flags, 0, 0 };
        }
    }
    return send(stream, v1 ? HVGPU_MEMOP_BATCH_V1 : HVGPU_MEMOP_BATCH, ops, count, flags);
}

HV_EXPORT CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
    return one(s, 0, WAIT32, a, v, f);
}
HV_EXPORT CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
    return one(s, 0, WAIT64, a, v, f);
}
HV_EXPORT CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
    return one(s, 0, WRITE32, a, v, f);
}
HV_EXPORT CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
    return one(s, 0, WRITE64, a, v, f);
}
HV_EXPORT CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned n, void *params, unsigned f) {
    return batch(s, 0, n, params, f);
}
HV_EXPORT CUresult cuStreamWaitValue32(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
    return one(s, 1, WAIT32, a, v, f);
}
HV_EXPORT CUresult cuStreamWaitValue64(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
    return one(s, 1, WAIT64, a, v, f);
}
HV_EXPORT CUresult cuStreamWriteValue32(CUstream s, CUdeviceptr a, uint32_t v, unsigned f) {
    return one(s, 1, WRITE32, a, v, f);
}
HV_EXPORT CUresult cuStreamWriteValue64(CUstream s, CUdeviceptr a, uint64_t v, unsigned f) {
    return one(s, 1, WRITE64, a, v, f);
}
HV_EXPORT CUresult cuStreamBatchMemOp(CUstream s, unsigned n, void *params, unsigned f) {
    return batch(s, 1, n, params, f);
}
