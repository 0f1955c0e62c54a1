/* CUDA arrays, mipmapped arrays, texture and surface objects, 2D/3D copies.
 *
 * Arrays and mipmapped arrays are the executor's: the program holds their
 * handles, tagged with their vGPU as streams are. Texture and surface objects
 * are the host driver's own values (a kernel reads them as parameters), which
 * the executor serves only to the connection that made them; a destroy goes to
 * the current context's vGPU.
 *
 * A copy between device memory and arrays is one one-way frame. A copy with
 * host memory on one side packs its rows (of the host side's pitch and height)
 * into frames of at most HVGPU_MAX_COPY_3D bytes, whole slices, whole rows or
 * pieces of one row as they fit; bytes back wait for their reply, so the Async
 * forms into host memory finish before returning, as memory.c's copies do.
 * Host pointers never travel. Host to host is copied here, after the stream's
 * earlier work.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "shim.h"

enum { MT_HOST = 1, MT_DEVICE = 2, MT_ARRAY = 3, MT_UNIFIED = 4 };

typedef struct {
    size_t width, height, depth;
    int format;
    unsigned channels, flags;
} array3d_desc; /* CUDA_ARRAY3D_DESCRIPTOR */

typedef struct {
    size_t width, height;
    int format;
    unsigned channels;
} array_desc; /* CUDA_ARRAY_DESCRIPTOR */

typedef struct {
    size_t x, y, z, lod;
    int type;
    const void *host;
    CUdeviceptr device;
    void *array, *context;
    size_t pitch, height;
} memcpy3d_side; /* one side of CUDA_MEMCPY3D (reserved) and CUDA_MEMCPY3D_PEER (context) */

typedef struct {
    memcpy3d_side src, dst;
    size_t width, height, depth;
} memcpy3d;

_Static_assert(sizeof(memcpy3d) == 200, "CUDA_MEMCPY3D's layout");

/* -- arrays ----------------------------------------------------------------------- */

static CUresult create(uint16_t op, const array3d_desc *d, uint32_t levels, void **out) {
    if (!out || !d) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_mipmapped_array_create_req_t q = { d->width, d->height, d->depth, (uint32_t)d->format,
                                             d->channels, d->flags, levels };
    uint64_t handle;
    CUresult r = hv_call(op, &q, op == HVGPU_OP_ARRAY_CREATE ? sizeof(hvgpu_array_create_req_t)
                                                             : sizeof q,
                         NULL, 0, &handle, sizeof handle, NULL, NULL, 0);
    if (!r) *out = hv_tag(hv_routed_device(), handle);
    return r;
}

HV_EXPORT CUresult cuArray3DCreate_v2(void **array, const array3d_desc *d) {
    return create(HVGPU_OP_ARRAY_CREATE, d, 0, array);
}

HV_EXPORT CUresult cuArrayCreate_v2(void **array, const array_desc *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    array3d_desc d3 = { d->width, d->height, 0, d->format, d->channels, 0 };
    return create(HVGPU_OP_ARRAY_CREATE, &d3, 0, array);
}

HV_EXPORT CUresult cuMipmappedArrayCreate(void **mipmap, const array3d_desc *d, unsigned levels) {
    return create(HVGPU_OP_MIPMAPPED_ARRAY_CREATE, d, levels, mipmap);
}

HV_EXPORT CUresult cuArrayDestroy(void *array) {
    if (!hv_created(array)) return CUDA_ERROR_INVALID_HANDLE;
    return hv_call_handle(hv_tag_device(array), HVGPU_OP_ARRAY_DESTROY, hv_untag(array));
}

HV_EXPORT CUresult cuMipmappedArrayDestroy(void *mipmap) {
    if (!hv_created(mipmap)) return CUDA_ERROR_INVALID_HANDLE;
    return hv_call_handle(hv_tag_device(mipmap), HVGPU_OP_MIPMAPPED_ARRAY_DESTROY,
                          hv_untag(mipmap));
}

HV_EXPORT CUresult cuMipmappedArrayGetLevel(void **level, void *mipmap, unsigned n) {
    if (!level) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_created(mipmap)) return CUDA_ERROR_INVALID_HANDLE;
    int device = hv_tag_device(mipmap);
    hvgpu_mipmapped_array_get_level_req_t q = { hv_untag(mipmap), n };
    uint64_t handle;
    CUresult r = HV_ON(device, hv_call(HVGPU_OP_MIPMAPPED_ARRAY_GET_LEVEL, &q, sizeof q, NULL, 0,
                                       &handle, sizeof handle, NULL, NULL, 0));
    if (!r) *level = hv_tag(device, handle);
    return r;
}

static CUresult describe(void *array, hvgpu_array_get_descriptor_rep_t *v) {
    if (!hv_created(array)) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t h = hv_untag(array);
    return HV_ON(hv_tag_device(array), hv_call(HVGPU_OP_ARRAY_GET_DESCRIPTOR, &h, sizeof h, NULL,
                                               0, v, sizeof *v, NULL, NULL, 0));
}

/* CUDA_ARRAY_MEMORY_REQUIREMENTS, as cuda.h lays it out. */
typedef struct { size_t size, alignment; unsigned reserved[4]; } memory_requirements;

static CUresult requirements(memory_requirements *req, void *handle, CUdevice dev,
                             uint32_t mipmapped) {
    if (!req) return CUDA_ERROR_INVALID_VALUE;
    if (!handle) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = hv_check_device(dev);
    if (r) return r;
    if (dev != hv_tag_device(handle)) return CUDA_ERROR_INVALID_DEVICE; /* another vGPU's */
    hvgpu_array_memory_requirements_req_t q = { hv_untag(handle), mipmapped };
    hvgpu_array_memory_requirements_rep_t v;
    r = HV_ON(dev, hv_call(HVGPU_OP_ARRAY_MEMORY_REQUIREMENTS, &q, sizeof q, NULL, 0, &v,
                           sizeof v, NULL, NULL, 0));
    if (!r) *req = (memory_requirements){ (size_t)v.size, (size_t)v.alignment, { 0 } };
    return r;
}

HV_EXPORT CUresult cuArrayGetMemoryRequirements(memory_requirements *req, void *array,
                                                CUdevice dev) {
    return requirements(req, array, dev, 0);
}

HV_EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(memory_requirements *req, void *mipmap,
                                                         CUdevice dev) {
    return requirements(req, mipmap, dev, 1);
}

HV_EXPORT CUresult cuArray3DGetDescriptor_v2(array3d_desc *d, void *array) {
    hvgpu_array_get_descriptor_rep_t v;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = describe(array, &v);
    if (r) return r;
    *d = (array3d_desc){ v.width, v.height, v.depth, (int)v.format, v.channels, v.flags };
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuArrayGetDescriptor_v2(array_desc *d, void *array) {
    hvgpu_array_get_descriptor_rep_t v;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = describe(array, &v);
    if (r) return r;
    *d = (array_desc){ v.width, v.height, (int)v.format, v.channels };
    return CUDA_SUCCESS;
}

/* -- texture and surface objects --------------------------------------------------- */

enum { RES_ARRAY = 0, RES_MIPMAP = 1, RES_LINEAR = 2, RES_PITCH2D = 3 };
#define RESOURCE_DESC_SIZE 144 /* CUDA_RESOURCE_DESC: resType, a 128-byte union at 8, flags */

static uint64_t u64_at(const unsigned char *p, size_t at) { uint64_t v; memcpy(&v, p + at, 8); return v; }
static uint32_t u32_at(const unsigned char *p, size_t at) { uint32_t v; memcpy(&v, p + at, 4); return v; }

HV_EXPORT CUresult cuTexObjectCreate(unsigned long long *object, const void *res_desc,
                                     const void *tex_desc, const void *view_desc) {
    if (!object || !res_desc || !tex_desc) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *res = res_desc;
    uint32_t type = u32_at(res, 0);
    hvgpu_tex_object_create_req_t q = { type, 0, 0, 0, 0, 0, 0, u32_at(res, 136),
                                        HVGPU_TEX_DESC_SIZE, view_desc ? HVGPU_VIEW_DESC_SIZE : 0 };
    int device = hv_routed_device();
    if (type == RES_ARRAY || type == RES_MIPMAP) {
        void *handle = (void *)(uintptr_t)u64_at(res, 8);
        if (!hv_created(handle)) return CUDA_ERROR_INVALID_HANDLE;
        device = hv_tag_device(handle);
        q.resource = hv_untag(handle);
    } else {
        q.resource = u64_at(res, 8);
        q.format = u32_at(res, 16);
        q.channels = u32_at(res, 20);
        q.width = u64_at(res, 24);
        if (type == RES_PITCH2D) {
            q.height = u64_at(res, 32);
            q.pitch = u64_at(res, 40);
        }
        int owner = hv_alloc_owner(q.resource);
        if (owner >= 0) device = owner;
    }
    unsigned char body[sizeof q + HVGPU_TEX_DESC_SIZE + HVGPU_VIEW_DESC_SIZE];
    memcpy(body, &q, sizeof q);
    memcpy(body + sizeof q, tex_desc, HVGPU_TEX_DESC_SIZE);
    if (view_desc) memcpy(body + sizeof q + HVGPU_TEX_DESC_SIZE, view_desc, HVGPU_VIEW_DESC_SIZE);
    uint32_t len = sizeof q + HVGPU_TEX_DESC_SIZE + q.view_desc_len;
    return HV_ON(device, hv_call(HVGPU_OP_TEX_OBJECT_CREATE, body, len, NULL, 0, object,
                                 sizeof *object, NULL, NULL, 0));
}

HV_EXPORT CUresult cuTexObjectDestroy(unsigned long long object) {
    return hv_call(HVGPU_OP_TEX_OBJECT_DESTROY, &object, sizeof object, NULL, 0, NULL, 0, NULL,
                   NULL, 0);
}

HV_EXPORT CUresult cuSurfObjectCreate(unsigned long long *object, const void *res_desc) {
    if (!object || !res_desc) return CUDA_ERROR_INVALID_VALUE;
    const unsigned char *res = res_desc;
    void *array = (void *)(uintptr_t)u64_at(res, 8);
    if (u32_at(res, 0) != RES_ARRAY) return CUDA_ERROR_INVALID_VALUE;
    if (!hv_created(array)) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t h = hv_untag(array);
    return HV_ON(hv_tag_device(array), hv_call(HVGPU_OP_SURF_OBJECT_CREATE, &h, sizeof h, NULL,
                                               0, object, sizeof *object, NULL, NULL, 0));
}

HV_EXPORT CUresult cuSurfObjectDestroy(unsigned long long object) {
    return hv_call(HVGPU_OP_SURF_OBJECT_DESTROY, &object, sizeof object, NULL, 0, NULL, 0, NULL,
                   NULL, 0);
}

/* -- copies ------------------------------------------------------------------------- */

/* Where a side is, once unified addresses and page-locked host memory named as device
   memory are told apart: MT_HOST (host is the address), MT_DEVICE or MT_ARRAY. */
static int resolve(const struct hv_copy_side *s, uintptr_t *host) {
    switch (s->type) {
    case MT_ARRAY: return MT_ARRAY;
    case MT_HOST: *host = (uintptr_t)s->host; return MT_HOST;
    case MT_DEVICE: case MT_UNIFIED:
        if (hv_alloc_find(s->device, NULL, NULL)) return MT_DEVICE;
        if (s->type == MT_UNIFIED || hv_host_find((const void *)(uintptr_t)s->device, NULL, NULL)) {
            *host = (uintptr_t)s->device;
            return MT_HOST;
        }
        return MT_DEVICE; /* the executor judges it */
    default: return 0;
    }
}

static uintptr_t host_row(const struct hv_copy_side *s, uintptr_t base, size_t x, size_t y,
                          size_t z) {
    return base + s->x + x + ((s->z + z) * s->height + s->y + y) * s->pitch;
}

/* The device or array side's kind, where, and position of the piece at (x, y, z). */
static void remote(const struct hv_copy_side *s, int kind, size_t x, size_t y, size_t z,
                   uint32_t *k, uint64_t *where, uint64_t pos[3]) {
    *k = kind == MT_ARRAY ? HVGPU_MEMORY_ARRAY : HVGPU_MEMORY_DEVICE;
    *where = kind == MT_ARRAY ? hv_untag(s->array) : s->device;
    pos[0] = s->x + x; pos[1] = s->y + y; pos[2] = s->z + z;
}

/* One frame: the piece (x, y, z) + (w, h, d) between host memory and the other side. */
static CUresult piece(const struct hv_copy_side *hs, uintptr_t hbase, const struct hv_copy_side *rs,
                      int rkind, int to_host, size_t x, size_t y, size_t z, size_t w, size_t h,
                      size_t d, CUstream stream, unsigned char *buf) {
    uint32_t k;
    uint64_t where, pos[3];
    remote(rs, rkind, x, y, z, &k, &where, pos);
    size_t n = w * h * d;
    if (!to_host) {
        for (size_t i = 0; i < h * d; i++)
            memcpy(buf + i * w, (const void *)host_row(hs, hbase, x, y + i % h, z + i / h), w);
        hvgpu_memcpy_3d_to_req_t q = { k, 0, where, pos[0], pos[1], pos[2], rs->pitch, rs->height,
                                       w, h, d, hv_untag(stream) };
        return hv_oneway(HVGPU_OP_MEMCPY_3D_TO, &q, sizeof q, buf, n);
    }
    hvgpu_memcpy_3d_from_req_t q = { k, 0, where, pos[0], pos[1], pos[2], rs->pitch, rs->height,
                                     w, h, d, hv_untag(stream) };
    CUresult r = hv_call(HVGPU_OP_MEMCPY_3D_FROM, &q, sizeof q, NULL, 0, NULL, 0, NULL, buf, n);
    if (r) return r;
    for (size_t i = 0; i < h * d; i++)
        memcpy((void *)host_row(hs, hbase, x, y + i % h, z + i / h), buf + i * w, w);
    return CUDA_SUCCESS;
}

/* Whole slices a frame, else whole rows, else pieces of a row. */
static CUresult host_side(const struct hv_copy_side *hs, uintptr_t hbase,
                          const struct hv_copy_side *rs, int rkind, int to_host, size_t width,
                          size_t height, size_t depth, CUstream stream) {
    const size_t max = HVGPU_MAX_COPY_3D;
    size_t total = width > max / height / depth ? max : width * height * depth;
    unsigned char *buf = malloc(total);
    if (!buf) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    if (width <= max / height) {
        size_t k = max / (width * height);
        for (size_t z = 0; z < depth && !r; z += k)
            r = piece(hs, hbase, rs, rkind, to_host, 0, 0, z, width, height,
                      depth - z < k ? depth - z : k, stream, buf);
    } else if (width <= max) {
        size_t k = max / width;
        for (size_t z = 0; z < depth && !r; z++)
            for (size_t y = 0; y < height && !r; y += k)
                r = piece(hs, hbase, rs, rkind, to_host, 0, y, z, width,
                          height - y < k ? height - y : k, 1, stream, buf);
    } else {
        for (size_t z = 0; z < depth && !r; z++)
            for (size_t y = 0; y < height && !r; y++)
                for (size_t x = 0; x < width && !r; x += max)
                    r = piece(hs, hbase, rs, rkind, to_host, x, y, z,
                              width - x < max ? width - x : max, 1, 1, stream, buf);
    }
    free(buf);
    return r;
}

static int side_device(const struct hv_copy_side *s, int kind) {
    if (kind == MT_ARRAY) return hv_tag_device(s->array);
    return kind == MT_DEVICE ? hv_alloc_owner(s->device) : -1;
}

CUresult hv_copy3d(const struct hv_copy_side *src, const struct hv_copy_side *dst, size_t width,
                   size_t height, size_t depth, CUstream stream, int wait) {
    (void)wait; /* one-way frames take the bytes at the call; bytes back wait for them */
    if (!width || !height || !depth) return CUDA_SUCCESS;
    uintptr_t sh = 0, dh = 0;
    int sk = resolve(src, &sh), dk = resolve(dst, &dh);
    if (!sk || !dk) return CUDA_ERROR_INVALID_VALUE;
    if ((sk == MT_ARRAY && !hv_created(src->array)) || (dk == MT_ARRAY && !hv_created(dst->array)))
        return CUDA_ERROR_INVALID_HANDLE;
    if (sk == MT_HOST && dk == MT_HOST) { /* here, in stream order */
        CUresult r = cuStreamSynchronize(stream);
        for (size_t i = 0; !r && i < height * depth; i++)
            memmove((void *)host_row(dst, dh, 0, i % height, i / height),
                    (const void *)host_row(src, sh, 0, i % height, i / height), width);
        return r;
    }
    int sd = side_device(src, sk), dd = side_device(dst, dk);
    if (sd >= 0 && dd >= 0 && sd != dd) {
        static int once;
        return hv_unsupported("cuMemcpy3D between two vGPUs", &once);
    }
    int device = hv_created(stream) ? hv_tag_device(stream)
                 : sd >= 0 ? sd : dd >= 0 ? dd : hv_routed_device();
    if (sk == MT_HOST)
        return HV_ON(device, host_side(src, sh, dst, dk, 0, width, height, depth, stream));
    if (dk == MT_HOST)
        return HV_ON(device, host_side(dst, dh, src, sk, 1, width, height, depth, stream));
    uint32_t ks, kd;
    uint64_t ws, wd, ps[3], pd[3];
    remote(src, sk, 0, 0, 0, &ks, &ws, ps);
    remote(dst, dk, 0, 0, 0, &kd, &wd, pd);
    hvgpu_memcpy_3d_req_t q = { ks, kd, ws, ps[0], ps[1], ps[2], src->pitch, src->height,
                                wd, pd[0], pd[1], pd[2], dst->pitch, dst->height,
                                width, height, depth, hv_untag(stream) };
    return HV_ON(device, hv_oneway(HVGPU_OP_MEMCPY_3D, &q, sizeof q, NULL, 0));
}

static struct hv_copy_side side_of(const memcpy3d_side *s) {
    return (struct hv_copy_side){ s->type, s->host, s->device, s->array, s->x, s->y, s->z,
                                  s->pitch, s->height };
}

static CUresult copy3d(const memcpy3d *p, CUstream stream, int wait) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (p->src.lod || p->dst.lod) return CUDA_ERROR_INVALID_VALUE; /* reserved: must be 0 */
    struct hv_copy_side s = side_of(&p->src), d = side_of(&p->dst);
    return hv_copy3d(&s, &d, p->width, p->height, p->depth, stream, wait);
}

HV_EXPORT CUresult cuMemcpy3D_v2(const memcpy3d *p) { return copy3d(p, NULL, 1); }
HV_EXPORT CUresult cuMemcpy3DAsync_v2(const memcpy3d *p, CUstream s) { return copy3d(p, s, 0); }
/* The peer forms name each side's context: the sides' own vGPUs say the same. */
HV_EXPORT CUresult cuMemcpy3DPeer(const memcpy3d *p) { return copy3d(p, NULL, 1); }
HV_EXPORT CUresult cuMemcpy3DPeerAsync(const memcpy3d *p, CUstream s) { return copy3d(p, s, 0); }

/* The 1D array forms: offsets in bytes along the array's first row. */
static struct hv_copy_side array_at(void *array, size_t offset) {
    return (struct hv_copy_side){ MT_ARRAY, NULL, 0, array, offset, 0, 0, 0, 0 };
}
static struct hv_copy_side host_at(const void *p) {
    return (struct hv_copy_side){ MT_HOST, p, 0, NULL, 0, 0, 0, 0, 0 };
}
static struct hv_copy_side device_at(CUdeviceptr p) {
    return (struct hv_copy_side){ MT_DEVICE, NULL, p, NULL, 0, 0, 0, 0, 0 };
}

static CUresult copy1d(struct hv_copy_side s, struct hv_copy_side d, size_t n, CUstream stream,
                       int wait) {
    return hv_copy3d(&s, &d, n, 1, 1, stream, wait);
}

HV_EXPORT CUresult cuMemcpyHtoA_v2(void *dst, size_t off, const void *src, size_t n) {
    return copy1d(host_at(src), array_at(dst, off), n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyHtoAAsync_v2(void *dst, size_t off, const void *src, size_t n, CUstream s) {
    return copy1d(host_at(src), array_at(dst, off), n, s, 0);
}
HV_EXPORT CUresult cuMemcpyAtoH_v2(void *dst, void *src, size_t off, size_t n) {
    return copy1d(array_at(src, off), host_at(dst), n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyAtoHAsync_v2(void *dst, void *src, size_t off, size_t n, CUstream s) {
    return copy1d(array_at(src, off), host_at(dst), n, s, 0);
}
HV_EXPORT CUresult cuMemcpyAtoD_v2(CUdeviceptr dst, void *src, size_t off, size_t n) {
    return copy1d(array_at(src, off), device_at(dst), n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyDtoA_v2(void *dst, size_t off, CUdeviceptr src, size_t n) {
    return copy1d(device_at(src), array_at(dst, off), n, NULL, 1);
}
HV_EXPORT CUresult cuMemcpyAtoA_v2(void *dst, size_t doff, void *src, size_t soff, size_t n) {
    return copy1d(array_at(src, soff), array_at(dst, doff), n, NULL, 1);
}

/* -- batches of copies (CUDA 12.8+) -------------------------------------------------
 *
 * A batch runs in stream order as a whole, its copies in no order among themselves: the
 * shim issues them one by one on the stream, which is one such order. Everything is
 * checked before the first copy is issued, as the driver refuses a batch whole; a copy
 * that fails after names itself in failIdx (SIZE_MAX: the error concerns no one copy). A
 * source CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL names is read before the call returns:
 * its copy is made in the synchronous form. */

typedef struct { int type, id; } mem_location; /* CUmemLocation */
typedef struct {
    int src_access_order;
    mem_location src_hint, dst_hint;
    unsigned flags;
} memcpy_attributes; /* CUmemcpyAttributes */
typedef struct {
    int type; /* CUmemcpy3DOperandType: 1 pointer, 2 array */
    union {
        struct { CUdeviceptr ptr; size_t row_length, layer_height; mem_location hint; } ptr;
        struct { void *array; size_t x, y, z; } array;
    } op;
} memcpy3d_operand; /* CUmemcpy3DOperand */
typedef struct {
    memcpy3d_operand src, dst;
    size_t width, height, depth;
    int src_access_order;
    unsigned flags;
} memcpy3d_batch_op; /* CUDA_MEMCPY3D_BATCH_OP */
_Static_assert(sizeof(memcpy_attributes) == 24, "CUmemcpyAttributes' layout");
_Static_assert(sizeof(memcpy3d_batch_op) == 112, "CUDA_MEMCPY3D_BATCH_OP's layout");

#define ORDER_STREAM 1
#define ORDER_DURING_CALL 2
#define ORDER_ANY 3
#define FLAG_PREFER_OVERLAP 1u

static int valid_order(int order, unsigned flags) {
    return order >= ORDER_STREAM && order <= ORDER_ANY && !(flags & ~FLAG_PREFER_OVERLAP);
}

/* Not the legacy NULL stream, as cuda.h says of both batches. */
static int batch_stream(CUstream stream) { return hv_created(stream) || hv_untag(stream) == 2; }

CUresult hv_batch_copy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream,
                       int wait); /* memory.c */

static CUresult copy_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                           memcpy_attributes *attrs, size_t *idxs, size_t nattrs,
                           size_t *fail_idx, CUstream stream) {
    if (fail_idx) *fail_idx = SIZE_MAX;
    if (!dsts || !srcs || !sizes || !count || !attrs || !idxs || !nattrs || nattrs > count ||
        idxs[0] != 0 || !batch_stream(stream))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < nattrs; k++)
        if ((k && idxs[k] <= idxs[k - 1]) || idxs[k] >= count ||
            !valid_order(attrs[k].src_access_order, attrs[k].flags))
            return CUDA_ERROR_INVALID_VALUE;
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        while (k + 1 < nattrs && idxs[k + 1] <= i) k++;
        CUresult r = hv_batch_copy(dsts[i], srcs[i], sizes[i], stream,
                                   attrs[k].src_access_order == ORDER_DURING_CALL);
        if (r) {
            if (fail_idx) *fail_idx = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

/* CUDA 12.8's, with failIdx; CUDA 13's (_v2) has none. */
HV_EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                      size_t count, memcpy_attributes *attrs, size_t *idxs,
                                      size_t nattrs, size_t *fail_idx, CUstream stream) {
    return copy_batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail_idx, stream);
}

HV_EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                         size_t count, memcpy_attributes *attrs, size_t *idxs,
                                         size_t nattrs, CUstream stream) {
    return copy_batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, NULL, stream);
}

/* The bytes of one element of an array (its format's channel size times its channels). */
static CUresult element_size(void *array, size_t *size) {
    array3d_desc d;
    CUresult r = cuArray3DGetDescriptor_v2(&d, array);
    if (r) return r;
    size_t channel = d.format == 0x01 || d.format == 0x08 ? 1
                     : d.format == 0x02 || d.format == 0x09 || d.format == 0x10 ? 2 : 4;
    *size = channel * d.channels;
    return CUDA_SUCCESS;
}

/* One operand as a copy side, its extent in elements of `elem` bytes. */
static CUresult operand_side(const memcpy3d_operand *o, size_t elem, size_t width, size_t height,
                             struct hv_copy_side *s) {
    if (o->type == 1) {
        size_t row = o->op.ptr.row_length, layer = o->op.ptr.layer_height;
        if ((row && row < width) || (layer && layer < height)) return CUDA_ERROR_INVALID_VALUE;
        *s = (struct hv_copy_side){ MT_UNIFIED, NULL, o->op.ptr.ptr, NULL, 0, 0, 0,
                                    (row ? row : width) * elem, layer ? layer : height };
        return CUDA_SUCCESS;
    }
    if (o->type == 2) {
        if (!o->op.array.array) return CUDA_ERROR_INVALID_HANDLE;
        *s = (struct hv_copy_side){ MT_ARRAY, NULL, 0, o->op.array.array, o->op.array.x * elem,
                                    o->op.array.y, o->op.array.z, 0, 0 };
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* The element size of an operation: 1 between pointers, else its array's (both arrays'
   must agree). */
static CUresult op_element(const memcpy3d_batch_op *op, size_t *elem) {
    size_t s = 1, d = 1;
    CUresult r = CUDA_SUCCESS;
    if (op->src.type == 2) r = element_size(op->src.op.array.array, &s);
    if (!r && op->dst.type == 2) r = element_size(op->dst.op.array.array, &d);
    if (r) return r;
    if (op->src.type == 2 && op->dst.type == 2 && s != d) return CUDA_ERROR_INVALID_VALUE;
    *elem = op->src.type == 2 ? s : d;
    return CUDA_SUCCESS;
}

static CUresult copy3d_batch(size_t n, memcpy3d_batch_op *ops, size_t *fail_idx,
                             unsigned long long flags, CUstream stream) {
    if (fail_idx) *fail_idx = SIZE_MAX;
    if (!n || !ops || flags || !batch_stream(stream)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        const memcpy3d_batch_op *op = &ops[i];
        size_t elem;
        struct hv_copy_side s, d;
        CUresult r = !op->width || !op->height || !op->depth ||
                     !valid_order(op->src_access_order, op->flags)
                         ? CUDA_ERROR_INVALID_VALUE : op_element(op, &elem);
        if (!r) r = operand_side(&op->src, elem, op->width, op->height, &s);
        if (!r) r = operand_side(&op->dst, elem, op->width, op->height, &d);
        if (r) {
            if (fail_idx) *fail_idx = i;
            return r;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const memcpy3d_batch_op *op = &ops[i];
        size_t elem = 1;
        struct hv_copy_side s, d;
        CUresult r = op_element(op, &elem);
        if (!r) r = operand_side(&op->src, elem, op->width, op->height, &s);
        if (!r) r = operand_side(&op->dst, elem, op->width, op->height, &d);
        if (!r) r = hv_copy3d(&s, &d, op->width * elem, op->height, op->depth, stream,
                              op->src_access_order == ORDER_DURING_CALL);
        if (!r && op->src_access_order == ORDER_DURING_CALL) r = cuStreamSynchronize(stream);
        if (r) {
            if (fail_idx) *fail_idx = i;
            return r;
        }
    }
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuMemcpy3DBatchAsync(size_t n, memcpy3d_batch_op *ops, size_t *fail_idx,
                                        unsigned long long flags, CUstream stream) {
    return copy3d_batch(n, ops, fail_idx, flags, stream);
}

HV_EXPORT CUresult cuMemcpy3DBatchAsync_v2(size_t n, memcpy3d_batch_op *ops,
                                           unsigned long long flags, CUstream stream) {
    return copy3d_batch(n, ops, NULL, flags, stream);
}
