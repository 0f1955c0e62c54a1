/* Driver entry points for kernel launches: parameter layouts, packing, launches.
 *
 * A function carries its parameter layout, fetched from the agent
 * (cuFuncGetParamInfo on the real function) at the first launch, so a launch
 * is one one-way frame built from kernelParams or from the `extra` buffer.
 * Must not guess a layout: a kernel whose layout cannot be had is not launched.
 * A launch runs on the vGPU its function lives on (module.c resolves it).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult layout(struct hv_func *f) {
    if (__atomic_load_n(&f->nparams, __ATOMIC_ACQUIRE) >= 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&layout_lock);
    CUresult r = CUDA_SUCCESS;
    if (f->nparams < 0) {
        hvgpu_func_get_param_info_req_t q = { 0 };
        /* a (u32 offset, u32 size) pair per parameter, each at least 4 bytes long */
        static unsigned char rep[sizeof(hvgpu_func_get_param_info_rep_t) + HVGPU_MAX_PARAMS * 2];
        uint32_t n = 0;
        r = ABOUT_FUNCTION(f, q, hv_call(HVGPU_OP_FUNC_GET_PARAM_INFO, &q, sizeof q, NULL, 0, rep,
                                         sizeof rep, &n, NULL, 0));
        if (!r) {
            hvgpu_func_get_param_info_rep_view_t v; /* too short: no parameters */
            hvgpu_func_get_param_info_rep_decode(rep, n, &v);
            int count = (int)(v.layout.len / 8);
            free(f->offsets);
            free(f->sizes);
            f->offsets = calloc((size_t)count + 1, sizeof *f->offsets);
            f->sizes = calloc((size_t)count + 1, sizeof *f->sizes);
            if (!f->offsets || !f->sizes) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                uint32_t end = 0;
                for (int i = 0; i < count && !r; i++) {
                    memcpy(&f->offsets[i], v.layout.data + 8 * i, 4);
                    memcpy(&f->sizes[i], v.layout.data + 8 * i + 4, 4);
                    /* Each parameter is copied where this says, into a buffer of
                       HVGPU_MAX_PARAMS: the agent's word is checked (in 64 bits: an end
                       past 2^32 must not wrap into a small one). */
                    uint64_t at = (uint64_t)f->offsets[i] + f->sizes[i];
                    if (at > HVGPU_MAX_PARAMS) r = CUDA_ERROR_INVALID_VALUE;
                    else if (at > end) end = (uint32_t)at;
                }
                if (!r) {
                    f->params_size = end;
                    __atomic_store_n(&f->nparams, count, __ATOMIC_RELEASE);
                }
            }
            if (r) {
                if (hv_trace_enabled())
                    hv_log("the agent's parameter layout of %s runs past %d bytes: refused",
                           f->name ? f->name : "a kernel", HVGPU_MAX_PARAMS);
                free(f->offsets);
                free(f->sizes);
                f->offsets = f->sizes = NULL;
            }
        }
    }
    pthread_mutex_unlock(&layout_lock);
    return r;
}

HV_EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = layout(f);
    if (r) return r;
    if (index >= (size_t)f->nparams) return CUDA_ERROR_INVALID_VALUE;
    if (offset) *offset = f->offsets[index];
    if (size) *size = f->sizes[index];
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t *offset, size_t *size) {
    return cuFuncGetParamInfo(k, index, offset, size);
}

#define LAUNCH_PARAM_END ((void *)0)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)2)

/* Packs the parameters as the kernel lays them out (from kernelParams or `extra`).
   A refusal says why under HVGPU_SHIM_TRACE: the program only sees the status. */
static CUresult refuse_pack(struct hv_func *f, const char *why) {
    if (hv_trace_enabled())
        hv_log("launch of %s refused: %s (%d parameters, %u bytes)", f->name ? f->name : "?",
               why, f->nparams, f->params_size);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult pack(struct hv_func *f, void **params, void **extra, unsigned char *buf,
                     uint32_t *size) {
    CUresult r = layout(f);
    if (r) return r;
    uint32_t need = f->params_size;
    if (need > HVGPU_MAX_PARAMS) return refuse_pack(f, "parameters larger than the shim carries");
    if (params) {
        for (int i = 0; i < f->nparams; i++) {
            if (!params[i]) return refuse_pack(f, "a NULL entry in kernelParams");
            memcpy(buf + f->offsets[i], params[i], f->sizes[i]);
        }
    } else if (extra) {
        void *src = NULL;
        size_t len = (size_t)-1;
        for (int i = 0; extra[i] != LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == LAUNCH_PARAM_BUFFER_POINTER) src = extra[i + 1];
            else if (extra[i] == LAUNCH_PARAM_BUFFER_SIZE) len = *(size_t *)extra[i + 1];
            else return refuse_pack(f, "an unknown key in `extra`");
        }
        if (!src && need) return refuse_pack(f, "`extra` without a parameter buffer");
        if (len != (size_t)-1 && len < need)
            return refuse_pack(f, "`extra`'s buffer is smaller than the parameters");
        if (need) memcpy(buf, src, need);
    } else if (need) {
        return refuse_pack(f, "neither kernelParams nor `extra` for a kernel with parameters");
    }
    *size = need;
    return CUDA_SUCCESS;
}

CUresult hv_kernel_pack(struct hv_func *f, void **params, void **extra, unsigned char *buf,
                        uint32_t *size, int *device, uint64_t *handle) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = hv_func_resolve(f, device, handle);
    return r ? r : pack(f, params, extra, buf, size);
}

/* A launch runs where its function lives; a stream of another vGPU is CUDA's
   invalid handle (it belongs to another context). */
static CUresult launch_target(struct hv_func *f, CUstream stream, int *device, uint64_t *handle) {
    CUresult r = hv_func_resolve(f, device, handle);
    if (!r && hv_created(stream) && hv_tag_device(stream) != *device)
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r && hv_trace_enabled())
        hv_log("launch of %s refused: %s (%d)", f->name ? f->name : "?", r == CUDA_ERROR_INVALID_HANDLE &&
               hv_created(stream) ? "its stream is another vGPU's" : "no such function there", r);
    return r;
}

/* Refused here, as the driver refuses it at the call: sent one-way, the refusal would
   only surface at a later call, after the program went on as if it ran. */
static CUresult checked(struct hv_func *f, int device, uint64_t handle, unsigned gx,
                        unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem) {
    const unsigned grid[3] = { gx, gy, gz }, block[3] = { bx, by, bz };
    return HV_ON(device, hv_launch_check(f, handle, grid, block, smem));
}

static CUresult launch(struct hv_func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                       void **extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    unsigned char body[sizeof(hvgpu_launch_kernel_req_t) + HVGPU_MAX_PARAMS];
    uint32_t need = 0;
    int device;
    uint64_t handle;
    CUresult r = launch_target(f, stream, &device, &handle);
    if (!r) r = checked(f, device, handle, gx, gy, gz, bx, by, bz, smem);
    if (!r) r = pack(f, params, extra, body + sizeof(hvgpu_launch_kernel_req_t), &need);
    if (!r) r = hv_managed_before(device, stream);
    if (r) return r;
    hvgpu_launch_kernel_req_t q = { handle, gx, gy, gz, bx, by, bz, smem, hv_untag(stream), need };
    memcpy(body, &q, sizeof q);
    return HV_ON(device, hv_oneway(HVGPU_OP_LAUNCH_KERNEL, body, (uint32_t)(sizeof q + need),
                                   NULL, 0));
}

HV_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                  CUstream stream, void **params, void **extra) {
    return launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}

static int is_cooperative(const hv_launch_attribute *attrs, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        int on;
        memcpy(&on, attrs[i].value, sizeof on);
        if (attrs[i].id == HVGPU_LAUNCH_ATTR_COOPERATIVE && on) return 1;
    }
    return 0;
}

HV_EXPORT CUresult cuLaunchKernelEx(const hv_launch_config *c, CUfunction f, void **params,
                                    void **extra) {
    static int once;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!c->nattrs)
        return launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params,
                      extra);
    if (!f || !c->attrs || c->nattrs > HVGPU_MAX_LAUNCH_ATTRS) return CUDA_ERROR_INVALID_VALUE;
    if (hv_trace_enabled() > 1)
        for (unsigned i = 0; i < c->nattrs; i++)
            hv_log("cuLaunchKernelEx(%s): attribute %d", f->name, c->attrs[i].id);
    for (unsigned i = 0; i < c->nattrs; i++) {
        int id = c->attrs[i].id;
        if (id == HVGPU_LAUNCH_ATTR_PROGRAMMATIC_EVENT ||
            id == HVGPU_LAUNCH_ATTR_LAUNCH_COMPLETION_EVENT) /* the executor's events */
            return hv_unsupported("cuLaunchKernelEx with an event attribute", &once);
    }
    /* A cooperative launch is answered: the driver refuses a grid of more blocks than
       can be resident at once at the call (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE), and
       the program must see that there, not at its next synchronisation. */
    int cooperative = is_cooperative(c->attrs, c->nattrs);
    static __thread unsigned char body[sizeof(hvgpu_launch_kernel_ex_req_t) + HVGPU_MAX_PARAMS +
                                       HVGPU_MAX_LAUNCH_ATTRS * sizeof(hv_launch_attribute)];
    _Static_assert(sizeof(hvgpu_launch_kernel_ex_req_t) == sizeof(hvgpu_launch_cooperative_req_t),
                   "a cooperative launch is laid out as cuLaunchKernelEx's");
    uint32_t need = 0;
    int device;
    uint64_t handle;
    CUresult r = launch_target(f, c->stream, &device, &handle);
    if (!r) r = checked(f, device, handle, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem);
    if (!r) r = pack(f, params, extra, body + sizeof(hvgpu_launch_kernel_ex_req_t), &need);
    if (!r) r = hv_managed_before(device, c->stream);
    if (r) return r;
    uint32_t attrs_len = c->nattrs * (uint32_t)sizeof(hv_launch_attribute);
    memcpy(body + sizeof(hvgpu_launch_kernel_ex_req_t) + need, c->attrs, attrs_len);
    hvgpu_launch_kernel_ex_req_t q = { handle, c->gx, c->gy, c->gz, c->bx, c->by, c->bz,
                                       c->smem, hv_untag(c->stream), need, attrs_len };
    memcpy(body, &q, sizeof q);
    uint32_t len = (uint32_t)(sizeof q + need + attrs_len);
    if (cooperative)
        return HV_ON(device, hv_call(HVGPU_OP_LAUNCH_COOPERATIVE, body, len, NULL, 0, NULL, 0,
                                     NULL, NULL, 0));
    return HV_ON(device, hv_oneway(HVGPU_OP_LAUNCH_KERNEL_EX, body, len, NULL, 0));
}

HV_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                             unsigned bx, unsigned by, unsigned bz,
                                             unsigned smem, CUstream stream, void **params) {
    hv_launch_attribute a = { HVGPU_LAUNCH_ATTR_COOPERATIVE, { 0 }, { 0 } };
    int on = 1;
    memcpy(a.value, &on, sizeof on);
    hv_launch_config c = { gx, gy, gz, bx, by, bz, smem, stream, &a, 1 };
    return cuLaunchKernelEx(&c, f, params, NULL);
}

/* Im2col tensor maps, as cuTensorMapEncodeTiled's: the host's driver encodes them.
   wide: cuTensorMapEncodeIm2colWide, whose corners are one width each. */
static CUresult im2col(void *map, int dtype, uint32_t rank, void *address, const uint64_t *dims,
                       const uint64_t *strides, const int *lower, const int *upper, int wide,
                       uint32_t channels, uint32_t pixels, const uint32_t *element_strides,
                       int interleave, int mode, int swizzle, int l2, int oob) {
    if (!map || !dims || !element_strides || rank < 3 || rank > 5 || !strides ||
        (!wide && (!lower || !upper)))
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t corners = wide ? 4 : (rank - 2) * 4;
    unsigned char body[sizeof(hvgpu_tensor_map_encode_im2col_req_t) + 5 * 8 * 2 + 3 * 4 * 2 +
                       5 * 4];
    hvgpu_tensor_map_encode_im2col_req_t q = {
        (uint32_t)dtype, rank, (uint64_t)(uintptr_t)address, rank * 8, (rank - 1) * 8, corners,
        corners, channels, pixels, rank * 4, (uint32_t)interleave, (uint32_t)swizzle,
        (uint32_t)l2, (uint32_t)oob, (uint32_t)wide, (uint32_t)mode };
    unsigned char *p = body + sizeof q;
    memcpy(p, dims, rank * 8); p += rank * 8;
    memcpy(p, strides, (rank - 1) * 8); p += (rank - 1) * 8;
    memcpy(p, lower, corners); p += corners;
    memcpy(p, upper, corners); p += corners;
    memcpy(p, element_strides, rank * 4); p += rank * 4;
    memcpy(body, &q, sizeof q);
    unsigned char rep[sizeof(hvgpu_tensor_map_encode_im2col_rep_t) + HVGPU_TENSOR_MAP_SIZE];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_TENSOR_MAP_ENCODE_IM2COL, body, (uint32_t)(p - body), NULL, 0,
                         rep, sizeof rep, &n, NULL, 0);
    if (r) return r;
    hvgpu_tensor_map_encode_im2col_rep_view_t v;
    if (hvgpu_tensor_map_encode_im2col_rep_decode(rep, n, &v) < 0 ||
        v.map.len < HVGPU_TENSOR_MAP_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(map, v.map.data, HVGPU_TENSOR_MAP_SIZE);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuTensorMapEncodeIm2col(void *map, int dtype, uint32_t rank, void *address,
                                           const uint64_t *dims, const uint64_t *strides,
                                           const int *lower, const int *upper, uint32_t channels,
                                           uint32_t pixels, const uint32_t *element_strides,
                                           int interleave, int swizzle, int l2, int oob) {
    return im2col(map, dtype, rank, address, dims, strides, lower, upper, 0, channels, pixels,
                  element_strides, interleave, 0, swizzle, l2, oob);
}

HV_EXPORT CUresult cuTensorMapEncodeIm2colWide(void *map, int dtype, uint32_t rank, void *address,
                                               const uint64_t *dims, const uint64_t *strides,
                                               int lower, int upper, uint32_t channels,
                                               uint32_t pixels, const uint32_t *element_strides,
                                               int interleave, int mode, int swizzle, int l2,
                                               int oob) {
    return im2col(map, dtype, rank, address, dims, strides, &lower, &upper, 1, channels, pixels,
                  element_strides, interleave, mode, swizzle, l2, oob);
}

HV_EXPORT CUresult cuTensorMapReplaceAddress(void *map, void *address) {
    if (!map) return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_tensor_map_replace_address_req_t) + HVGPU_TENSOR_MAP_SIZE];
    hvgpu_tensor_map_replace_address_req_t q = { HVGPU_TENSOR_MAP_SIZE,
                                                 (uint64_t)(uintptr_t)address };
    memcpy(body, &q, sizeof q);
    memcpy(body + sizeof q, map, HVGPU_TENSOR_MAP_SIZE);
    unsigned char rep[sizeof(hvgpu_tensor_map_replace_address_rep_t) + HVGPU_TENSOR_MAP_SIZE];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_TENSOR_MAP_REPLACE_ADDRESS, body, sizeof body, NULL, 0, rep,
                         sizeof rep, &n, NULL, 0);
    if (r) return r;
    hvgpu_tensor_map_replace_address_rep_view_t v;
    if (hvgpu_tensor_map_replace_address_rep_decode(rep, n, &v) < 0 ||
        v.map.len < HVGPU_TENSOR_MAP_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(map, v.map.data, HVGPU_TENSOR_MAP_SIZE);
    return CUDA_SUCCESS;
}

/* -- the deprecated launch API (cuFuncSetBlockShape .. cuLaunchGridAsync) ----------
 *
 * Still in cuda.h 13: a function carries a block shape, a dynamic shared memory size and
 * a parameter buffer the program fills at byte offsets, and cuLaunch/cuLaunchGrid launch
 * it with them, as cuLaunchKernel with that buffer in `extra` would. The state is the
 * function's, kept here; not guarded, as the driver's is not (one thread sets it up). */
struct hv_legacy {
    unsigned block[3], shared;
    uint32_t size;            /* cuParamSetSize's */
    unsigned char params[HVGPU_MAX_PARAMS];
};

static struct hv_legacy *legacy(struct hv_func *f) {
    if (!f->legacy) {
        struct hv_legacy *l = calloc(1, sizeof *l);
        if (l && __atomic_compare_exchange_n(&f->legacy, &(struct hv_legacy *){ NULL }, l, 0,
                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return l;
        free(l);
    }
    return f->legacy;
}

HV_EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (x <= 0 || y <= 0 || z <= 0) return CUDA_ERROR_INVALID_VALUE;
    struct hv_legacy *l = legacy(f);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->block[0] = (unsigned)x; l->block[1] = (unsigned)y; l->block[2] = (unsigned)z;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuFuncSetSharedSize(CUfunction f, unsigned bytes) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    struct hv_legacy *l = legacy(f);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->shared = bytes;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuParamSetSize(CUfunction f, unsigned n) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (n > HVGPU_MAX_PARAMS) return CUDA_ERROR_INVALID_VALUE;
    struct hv_legacy *l = legacy(f);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    l->size = n;
    return CUDA_SUCCESS;
}

static CUresult param_set(CUfunction f, int offset, const void *value, unsigned n) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (offset < 0 || (n && !value) || (uint64_t)offset + n > HVGPU_MAX_PARAMS)
        return CUDA_ERROR_INVALID_VALUE;
    struct hv_legacy *l = legacy(f);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    if (n) memcpy(l->params + offset, value, n);
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuParamSeti(CUfunction f, int offset, unsigned value) {
    return param_set(f, offset, &value, sizeof value);
}
HV_EXPORT CUresult cuParamSetf(CUfunction f, int offset, float value) {
    return param_set(f, offset, &value, sizeof value);
}
HV_EXPORT CUresult cuParamSetv(CUfunction f, int offset, void *ptr, unsigned n) {
    return param_set(f, offset, ptr, n);
}

HV_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int width, int height, CUstream stream) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (width <= 0 || height <= 0) return CUDA_ERROR_INVALID_VALUE;
    struct hv_legacy *l = legacy(f);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = l->size;
    void *extra[] = { LAUNCH_PARAM_BUFFER_POINTER, l->params, LAUNCH_PARAM_BUFFER_SIZE, &size,
                      LAUNCH_PARAM_END };
    /* no block shape set: 0 threads, which the launch check refuses as the driver does */
    return launch(f, (unsigned)width, (unsigned)height, 1, l->block[0], l->block[1],
                  l->block[2], l->shared, stream, NULL, extra);
}

HV_EXPORT CUresult cuLaunchGrid(CUfunction f, int width, int height) {
    return cuLaunchGridAsync(f, width, height, NULL);
}

HV_EXPORT CUresult cuLaunch(CUfunction f) { return cuLaunchGridAsync(f, 1, 1, NULL); }

/* CUDA_LAUNCH_PARAMS, as cuda.h lays it out. */
typedef struct {
    CUfunction function;
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    void **params;
} hv_launch_params;

/* Deprecated by CUDA; one grid across several GPUs synchronising with each other
   (multi_grid) needs the GPUs to reach each other, and a VM's vGPUs are contexts of
   separate executors, perhaps on separate GPUs: the device says it cannot
   (COOPERATIVE_MULTI_DEVICE_LAUNCH reads 0), and the launch is refused as the driver
   refuses it on such a device. */
HV_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(hv_launch_params *list, unsigned n,
                                                        unsigned flags) {
    static int once;
    (void)flags;
    if (!list || !n) return CUDA_ERROR_INVALID_VALUE;
    if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
        hv_log("cuLaunchCooperativeKernelMultiDevice refused: a VM's vGPUs cannot "
               "synchronise one grid across them (cuLaunchCooperativeKernel works on each)");
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* A TMA descriptor holds a device address of the executor's context, so the
   host's driver encodes it; the guest gets the 128 bytes. */
HV_EXPORT CUresult cuTensorMapEncodeTiled(void *map, int dtype, uint32_t rank, void *address,
                                          const uint64_t *dims, const uint64_t *strides,
                                          const uint32_t *box, const uint32_t *element_strides,
                                          int interleave, int swizzle, int l2, int oob) {
    if (!map || !dims || !box || !element_strides || rank < 1 || rank > 5 ||
        (rank > 1 && !strides))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_tensor_map_encode_tiled_req_t) + 5 * 8 * 2 + 5 * 4 * 2];
    hvgpu_tensor_map_encode_tiled_req_t q = {
        (uint32_t)dtype, rank, (uint64_t)(uintptr_t)address, rank * 8, (rank - 1) * 8, rank * 4,
        rank * 4, (uint32_t)interleave, (uint32_t)swizzle, (uint32_t)l2, (uint32_t)oob };
    unsigned char *p = body + sizeof q;
    memcpy(p, dims, rank * 8); p += rank * 8;
    if (rank > 1) { memcpy(p, strides, (rank - 1) * 8); p += (rank - 1) * 8; }
    memcpy(p, box, rank * 4); p += rank * 4;
    memcpy(p, element_strides, rank * 4); p += rank * 4;
    memcpy(body, &q, sizeof q);
    unsigned char rep[sizeof(hvgpu_tensor_map_encode_tiled_rep_t) + HVGPU_TENSOR_MAP_SIZE];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_TENSOR_MAP_ENCODE_TILED, body, (uint32_t)(p - body), NULL, 0,
                         rep, sizeof rep, &n, NULL, 0);
    if (r) return r;
    hvgpu_tensor_map_encode_tiled_rep_view_t v;
    if (hvgpu_tensor_map_encode_tiled_rep_decode(rep, n, &v) < 0 ||
        v.map.len < HVGPU_TENSOR_MAP_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(map, v.map.data, HVGPU_TENSOR_MAP_SIZE);
    return CUDA_SUCCESS;
}
