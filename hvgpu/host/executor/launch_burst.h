/* The executor's launch loop (launch_burst.c) and launch_burst.py: their interface.
 *
 * Generated from hvgpu/host/executor/launch_burst.py and the executor's op table
 * (hvgpu/host/executor/ops: each served op's burst= entry points and fields= checks) by
 * `python -m hvgpu.virtio.cgen`. Do not edit: change the Python tables and
 * regenerate.
 */
#ifndef HVGPU_LAUNCH_BURST_H
#define HVGPU_LAUNCH_BURST_H

#include <stddef.h>
#include <stdint.h>

#include "hvgpu_wire.h"

#define MAX_SEGMENTS 1024 /* segments of a copy ring at most */

/* The driver entry points hv_burst_new takes, in launch_burst.py's ENTRIES order: the
   served ops' (each op's declaration names those it calls), then the copy ring's. */
enum {
    E_cuMemcpyHtoDAsync,
    E_cuMemcpyDtoDAsync,
    E_cuMemsetD8Async,
    E_cuMemsetD16Async,
    E_cuMemsetD32Async,
    E_cuLaunchKernel,
    E_cuLaunchKernelEx,
    E_cuStreamWaitEvent,
    E_cuEventRecord,
    E_cuEventSynchronize,
    N_ENTRIES
};

/* The ops the loop serves (those the executor's op table declares with burst=), in
   the order of hv_burst_result's served counts. */
enum {
    S_MEMCPY_HTOD,
    S_MEMCPY_DTOD,
    S_MEMSET,
    S_LAUNCH_KERNEL,
    S_LAUNCH_KERNEL_EX,
    S_STREAM_WAIT_EVENT,
    S_EVENT_RECORD,
    N_SERVED
};

/* The served index of op, or -1. */
static inline int served_index(uint16_t op) {
    switch (op) {
    case HVGPU_OP_MEMCPY_HTOD: return S_MEMCPY_HTOD;
    case HVGPU_OP_MEMCPY_DTOD: return S_MEMCPY_DTOD;
    case HVGPU_OP_MEMSET: return S_MEMSET;
    case HVGPU_OP_LAUNCH_KERNEL: return S_LAUNCH_KERNEL;
    case HVGPU_OP_LAUNCH_KERNEL_EX: return S_LAUNCH_KERNEL_EX;
    case HVGPU_OP_STREAM_WAIT_EVENT: return S_STREAM_WAIT_EVENT;
    case HVGPU_OP_EVENT_RECORD: return S_EVENT_RECORD;
    default: return -1;
    }
}

/* What a field check asks of the field it reads (ops/fields.py's kinds). */
enum hv_check_kind {
    HV_CHECK_FUNCTION, /* a function handle of this guest's */
    HV_CHECK_STREAM, /* a stream handle of this guest's */
    HV_CHECK_EVENT, /* an event handle of this guest's */
    HV_CHECK_RANGE, /* a device address: its range lies inside an allocation of this guest's */
    HV_CHECK_ONE_OF, /* a value among those allowed */
    HV_CHECK_PARAMS, /* a parameter buffer's length: the size the op's function takes */
    HV_CHECK_ATTRS, /* launch attributes' length: whole records, none naming an event */
};

#define HV_MAX_VARS 2 /* variable-length fields of a served op at most */
#define HV_MAX_CHECKS 4 /* field checks of a served op at most */

/* One field check: the field at `at` (`width` bytes of the op's fixed part), judged as
   its kind says. */
struct hv_check {
    uint8_t kind;
    uint8_t width;
    uint16_t at;
    uint16_t size_at;     /* RANGE: the field holding its size ... */
    uint8_t size_width;   /* ... of this width; 0: the size is the frame's payload */
    uint8_t times_width;  /* RANGE: the size is multiplied by the field of this width ... */
    uint16_t times_at;    /* ... here (times_width 0: by nothing) */
    uint8_t var;          /* PARAMS, ATTRS: which variable field holds the bytes */
    uint64_t allowed;     /* ONE_OF: bit v set for each value v allowed */
};

/* A served op's frame and its field checks, in the order they are judged. */
struct hv_served_op {
    uint32_t fixed;                /* bytes of its fixed part */
    uint8_t payload;               /* its frame carries a payload */
    uint8_t n_vars;
    uint16_t var_len[HV_MAX_VARS]; /* where each variable field's length is, in order */
    uint8_t n_checks;
    struct hv_check checks[HV_MAX_CHECKS];
};

#define HV_FIELD(type, member) offsetof(type, member)
#define HV_WIDTH(type, member) sizeof(((type *)0)->member)

static const struct hv_served_op hv_served[N_SERVED] = {
    [S_MEMCPY_HTOD] = { /* cuMemcpyHtoDAsync */
        .fixed = sizeof(hvgpu_memcpy_htod_req_t), .payload = 1, .n_vars = 0,
        .var_len = {0},
        .n_checks = 2, .checks = {
            {.kind = HV_CHECK_RANGE, .at = HV_FIELD(hvgpu_memcpy_htod_req_t, dst), .width = HV_WIDTH(hvgpu_memcpy_htod_req_t, dst)}, /* its size: the payload */
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_memcpy_htod_req_t, stream), .width = HV_WIDTH(hvgpu_memcpy_htod_req_t, stream)},
        }},
    [S_MEMCPY_DTOD] = { /* cuMemcpyDtoDAsync */
        .fixed = sizeof(hvgpu_memcpy_dtod_req_t), .payload = 0, .n_vars = 0,
        .var_len = {0},
        .n_checks = 3, .checks = {
            {.kind = HV_CHECK_RANGE, .at = HV_FIELD(hvgpu_memcpy_dtod_req_t, dst), .width = HV_WIDTH(hvgpu_memcpy_dtod_req_t, dst), .size_at = HV_FIELD(hvgpu_memcpy_dtod_req_t, size), .size_width = HV_WIDTH(hvgpu_memcpy_dtod_req_t, size)},
            {.kind = HV_CHECK_RANGE, .at = HV_FIELD(hvgpu_memcpy_dtod_req_t, src), .width = HV_WIDTH(hvgpu_memcpy_dtod_req_t, src), .size_at = HV_FIELD(hvgpu_memcpy_dtod_req_t, size), .size_width = HV_WIDTH(hvgpu_memcpy_dtod_req_t, size)},
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_memcpy_dtod_req_t, stream), .width = HV_WIDTH(hvgpu_memcpy_dtod_req_t, stream)},
        }},
    [S_MEMSET] = { /* cuMemsetD8Async, cuMemsetD16Async, cuMemsetD32Async */
        .fixed = sizeof(hvgpu_memset_req_t), .payload = 0, .n_vars = 0,
        .var_len = {0},
        .n_checks = 3, .checks = {
            {.kind = HV_CHECK_ONE_OF, .at = HV_FIELD(hvgpu_memset_req_t, width), .width = HV_WIDTH(hvgpu_memset_req_t, width), .allowed = 1ull << 1 | 1ull << 2 | 1ull << 4},
            {.kind = HV_CHECK_RANGE, .at = HV_FIELD(hvgpu_memset_req_t, dst), .width = HV_WIDTH(hvgpu_memset_req_t, dst), .size_at = HV_FIELD(hvgpu_memset_req_t, count), .size_width = HV_WIDTH(hvgpu_memset_req_t, count), .times_at = HV_FIELD(hvgpu_memset_req_t, width), .times_width = HV_WIDTH(hvgpu_memset_req_t, width)},
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_memset_req_t, stream), .width = HV_WIDTH(hvgpu_memset_req_t, stream)},
        }},
    [S_LAUNCH_KERNEL] = { /* cuLaunchKernel */
        .fixed = sizeof(hvgpu_launch_kernel_req_t), .payload = 0, .n_vars = 1,
        .var_len = {HV_FIELD(hvgpu_launch_kernel_req_t, params_len)},
        .n_checks = 3, .checks = {
            {.kind = HV_CHECK_FUNCTION, .at = HV_FIELD(hvgpu_launch_kernel_req_t, function), .width = HV_WIDTH(hvgpu_launch_kernel_req_t, function)},
            {.kind = HV_CHECK_PARAMS, .at = HV_FIELD(hvgpu_launch_kernel_req_t, params_len), .width = HV_WIDTH(hvgpu_launch_kernel_req_t, params_len), .var = 0},
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_launch_kernel_req_t, stream), .width = HV_WIDTH(hvgpu_launch_kernel_req_t, stream)},
        }},
    [S_LAUNCH_KERNEL_EX] = { /* cuLaunchKernelEx */
        .fixed = sizeof(hvgpu_launch_kernel_ex_req_t), .payload = 0, .n_vars = 2,
        .var_len = {HV_FIELD(hvgpu_launch_kernel_ex_req_t, params_len), HV_FIELD(hvgpu_launch_kernel_ex_req_t, attrs_len)},
        .n_checks = 4, .checks = {
            {.kind = HV_CHECK_FUNCTION, .at = HV_FIELD(hvgpu_launch_kernel_ex_req_t, function), .width = HV_WIDTH(hvgpu_launch_kernel_ex_req_t, function)},
            {.kind = HV_CHECK_PARAMS, .at = HV_FIELD(hvgpu_launch_kernel_ex_req_t, params_len), .width = HV_WIDTH(hvgpu_launch_kernel_ex_req_t, params_len), .var = 0},
            {.kind = HV_CHECK_ATTRS, .at = HV_FIELD(hvgpu_launch_kernel_ex_req_t, attrs_len), .width = HV_WIDTH(hvgpu_launch_kernel_ex_req_t, attrs_len), .var = 1},
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_launch_kernel_ex_req_t, stream), .width = HV_WIDTH(hvgpu_launch_kernel_ex_req_t, stream)},
        }},
    [S_STREAM_WAIT_EVENT] = { /* cuStreamWaitEvent */
        .fixed = sizeof(hvgpu_stream_wait_event_req_t), .payload = 0, .n_vars = 0,
        .var_len = {0},
        .n_checks = 2, .checks = {
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_stream_wait_event_req_t, stream), .width = HV_WIDTH(hvgpu_stream_wait_event_req_t, stream)},
            {.kind = HV_CHECK_EVENT, .at = HV_FIELD(hvgpu_stream_wait_event_req_t, event), .width = HV_WIDTH(hvgpu_stream_wait_event_req_t, event)},
        }},
    [S_EVENT_RECORD] = { /* cuEventRecord */
        .fixed = sizeof(hvgpu_event_record_req_t), .payload = 0, .n_vars = 0,
        .var_len = {0},
        .n_checks = 2, .checks = {
            {.kind = HV_CHECK_EVENT, .at = HV_FIELD(hvgpu_event_record_req_t, event), .width = HV_WIDTH(hvgpu_event_record_req_t, event)},
            {.kind = HV_CHECK_STREAM, .at = HV_FIELD(hvgpu_event_record_req_t, stream), .width = HV_WIDTH(hvgpu_event_record_req_t, stream)},
        }},
};

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
