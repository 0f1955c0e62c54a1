/* The executor's launch loop (launch_burst.c) and launch_burst.py: their interface.
 *
 * Generated from hvgpu/host/executor/launch_burst.py by
 * `python -m hvgpu.virtio.cgen`. Do not edit: change the Python tables and
 * regenerate.
 */
#ifndef HVGPU_LAUNCH_BURST_H
#define HVGPU_LAUNCH_BURST_H

#include <stddef.h>
#include <stdint.h>

#include "hvgpu_wire.h"

#define MAX_SEGMENTS 1024 /* segments of a copy ring at most */

/* The driver entry points hv_burst_new takes, in launch_burst.py's ENTRIES order. */
enum {
    E_LAUNCH, /* cuLaunchKernel */
    E_LAUNCH_EX, /* cuLaunchKernelEx */
    E_EVENT_RECORD, /* cuEventRecord */
    E_STREAM_WAIT_EVENT, /* cuStreamWaitEvent */
    E_EVENT_SYNCHRONIZE, /* cuEventSynchronize */
    E_MEMSET_D8, /* cuMemsetD8Async */
    E_MEMSET_D16, /* cuMemsetD16Async */
    E_MEMSET_D32, /* cuMemsetD32Async */
    E_MEMCPY_DTOD, /* cuMemcpyDtoDAsync */
    E_MEMCPY_HTOD, /* cuMemcpyHtoDAsync */
    N_ENTRIES
};

/* The ops the loop serves, in the order of hv_burst_result's served counts. */
enum {
    S_LAUNCH_KERNEL,
    S_LAUNCH_KERNEL_EX,
    S_EVENT_RECORD,
    S_STREAM_WAIT_EVENT,
    S_MEMSET,
    S_MEMCPY_DTOD,
    S_MEMCPY_HTOD,
    N_SERVED
};

/* The served index of op, or -1. */
static inline int served_index(uint16_t op) {
    switch (op) {
    case HVGPU_OP_LAUNCH_KERNEL: return S_LAUNCH_KERNEL;
    case HVGPU_OP_LAUNCH_KERNEL_EX: return S_LAUNCH_KERNEL_EX;
    case HVGPU_OP_EVENT_RECORD: return S_EVENT_RECORD;
    case HVGPU_OP_STREAM_WAIT_EVENT: return S_STREAM_WAIT_EVENT;
    case HVGPU_OP_MEMSET: return S_MEMSET;
    case HVGPU_OP_MEMCPY_DTOD: return S_MEMCPY_DTOD;
    case HVGPU_OP_MEMCPY_HTOD: return S_MEMCPY_HTOD;
    default: return -1;
    }
}

/* What one run reports: launch_burst.py's RESULT_FIELDS, as ctypes lays them out. */
struct hv_burst_result {
    uint64_t consumed;
    uint64_t served[7];
    uint64_t h2d_bytes;
    int32_t status;
    uint32_t seq;
    uint32_t op;
    uint32_t need;
    uint32_t want_ring;
    uint32_t reserved;
};
_Static_assert(sizeof(struct hv_burst_result) == 96, "struct hv_burst_result");
_Static_assert(_Alignof(struct hv_burst_result) == 8, "struct hv_burst_result");
_Static_assert(offsetof(struct hv_burst_result, consumed) == 0, "hv_burst_result.consumed");
_Static_assert(offsetof(struct hv_burst_result, served) == 8, "hv_burst_result.served");
_Static_assert(offsetof(struct hv_burst_result, h2d_bytes) == 64, "hv_burst_result.h2d_bytes");
_Static_assert(offsetof(struct hv_burst_result, status) == 72, "hv_burst_result.status");
_Static_assert(offsetof(struct hv_burst_result, seq) == 76, "hv_burst_result.seq");
_Static_assert(offsetof(struct hv_burst_result, op) == 80, "hv_burst_result.op");
_Static_assert(offsetof(struct hv_burst_result, need) == 84, "hv_burst_result.need");
_Static_assert(offsetof(struct hv_burst_result, want_ring) == 88, "hv_burst_result.want_ring");
_Static_assert(offsetof(struct hv_burst_result, reserved) == 92, "hv_burst_result.reserved");

#endif /* HVGPU_LAUNCH_BURST_H */
