/* Driver entry points for CUDA IPC between the processes of one VM
 * (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle and the event pair).
 *
 * Every process of the VM talks to the same executor for a vGPU, which serves IPC
 * itself (hvgpu/host/executor/ipc.py): a handle's 64 bytes are the executor's
 * unguessable token, which the program passes to its other processes as it would
 * the driver's, and which opens there on the same vGPU. Memory opened from a handle
 * is a range of its own kind here (HV_RANGE_IPC): copyable, never cuMemFree'd, let
 * go by cuIpcCloseMemHandle once closed as often as it was opened.
 *
 * A handle opens on the vGPU of the opener's current context: each vGPU's executor
 * is its own process, so one vGPU's handle names nothing on another's (the executor
 * says CUDA_ERROR_INVALID_VALUE, as for any handle it does not know).
 */
#define _GNU_SOURCE
#include <string.h>

#include "shim.h"

typedef struct { char reserved[HVGPU_IPC_HANDLE_SIZE]; } hv_ipc_handle; /* CUipc*Handle */
_Static_assert(sizeof(hv_ipc_handle) == 64, "cuda.h's CU_IPC_HANDLE_SIZE");

/* A call whose reply is a token, copied into *out. */
static CUresult token_call(int device, uint16_t op, const void *q, uint32_t qlen,
                           hv_ipc_handle *out) {
    unsigned char rep[sizeof(hvgpu_ipc_get_mem_handle_rep_t) + HVGPU_IPC_HANDLE_SIZE];
    uint32_t n = 0;
    CUresult r = HV_ON(device, hv_call(op, q, qlen, NULL, 0, rep, sizeof rep, &n, NULL, 0));
    if (r) return r;
    hvgpu_ipc_get_mem_handle_rep_view_t v; /* both ops' replies are one bytes field */
    if (hvgpu_ipc_get_mem_handle_rep_decode(rep, n, &v) || v.handle.len != sizeof *out)
        return CUDA_ERROR_UNKNOWN;
    memcpy(out->reserved, v.handle.data, sizeof *out);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuIpcGetMemHandle(hv_ipc_handle *handle, CUdeviceptr dptr) {
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    int device = hv_alloc_owner(dptr);
    if (device < 0) return CUDA_ERROR_INVALID_VALUE; /* no allocation of this process */
    hvgpu_ipc_get_mem_handle_req_t q = { dptr };
    return token_call(device, HVGPU_OP_IPC_GET_MEM_HANDLE, &q, sizeof q, handle);
}

HV_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, hv_ipc_handle handle,
                                         unsigned int flags) {
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    struct __attribute__((packed)) {
        hvgpu_ipc_open_mem_handle_req_t q;
        hv_ipc_handle h;
    } body = { { flags, sizeof handle }, handle };
    hvgpu_ipc_open_mem_handle_rep_t v;
    r = hv_call(HVGPU_OP_IPC_OPEN_MEM_HANDLE, &body, sizeof body, NULL, 0, &v, sizeof v, NULL,
                NULL, 0);
    if (r) return r;
    /* Opened before: the executor counted one more reference; the range is here. */
    int device = hv_routed_device();
    if (hv_range_kind(v.dptr) != HV_RANGE_IPC || hv_alloc_owner(v.dptr) != device)
        hv_range_add(v.dptr, v.size, HV_RANGE_IPC);
    *pdptr = v.dptr;
    return CUDA_SUCCESS;
}

/* cuda.h before 11.0 named the same entry point without _v2. */
HV_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, hv_ipc_handle handle,
                                      unsigned int flags) {
    return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

HV_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    CUresult r = cuInit(0);
    if (r) return r;
    int device = hv_alloc_owner(dptr);
    if (device < 0 || hv_range_kind(dptr) != HV_RANGE_IPC) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_ipc_close_mem_handle_req_t q = { dptr };
    hvgpu_ipc_close_mem_handle_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_IPC_CLOSE_MEM_HANDLE, &q, sizeof q, NULL, 0, &v, sizeof v,
                              NULL, NULL, 0));
    if (!r && !v.left) hv_range_remove(device, dptr, HV_RANGE_IPC);
    return r;
}

HV_EXPORT CUresult cuIpcGetEventHandle(hv_ipc_handle *handle, CUevent event) {
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_created(event)) return CUDA_ERROR_INVALID_HANDLE;
    hvgpu_ipc_get_event_handle_req_t q = { hv_untag(event) };
    return token_call(hv_tag_device(event), HVGPU_OP_IPC_GET_EVENT_HANDLE, &q, sizeof q, handle);
}

HV_EXPORT CUresult cuIpcOpenEventHandle(CUevent *event, hv_ipc_handle handle) {
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuInit(0);
    if (r) return r;
    struct __attribute__((packed)) {
        hvgpu_ipc_open_event_handle_req_t q;
        hv_ipc_handle h;
    } body = { { sizeof handle }, handle };
    hvgpu_ipc_open_event_handle_rep_t v;
    r = hv_call(HVGPU_OP_IPC_OPEN_EVENT_HANDLE, &body, sizeof body, NULL, 0, &v, sizeof v, NULL,
                NULL, 0);
    if (!r) *event = hv_tag(hv_routed_device(), v.event);
    return r;
}
