/* Driver entry points for modules, libraries, kernels and launches.
 *
 * A module image (PTX, cubin, fatbin, or the runtime's fatbin wrapper) is
 * measured here and shipped once per load; functions are looked up once and
 * carry their parameter layout, fetched from the agent (cuFuncGetParamInfo on
 * the real function) at the first launch, so a launch is one one-way frame
 * built from kernelParams or from the `extra` buffer. Must not guess a
 * layout: a kernel whose layout cannot be had is not launched.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBINC_MAGIC 0x466243B1u
#define MAX_PARAMS 32764

/* Bytes of an image whose length the API does not pass, or 0. */
static size_t image_size(const void *image, const void **start) {
    const unsigned char *p = image;
    uint32_t magic;
    memcpy(&magic, p, 4);
    *start = image;
    if (magic == FATBINC_MAGIC) { /* { magic, version, const fatbin *data, ... } */
        const void *data;
        memcpy(&data, p + 8, sizeof data);
        return data ? image_size(data, start) : 0;
    }
    if (magic == FATBIN_MAGIC) { /* { magic, u16 version, u16 header_size, u64 files_size } */
        uint16_t header;
        uint64_t files;
        memcpy(&header, p + 6, 2);
        memcpy(&files, p + 8, 8);
        return header + files;
    }
    if (!memcmp(p, "\x7f" "ELF", 4) && p[4] == 2) { /* ELF64 cubin */
        uint64_t shoff, phoff;
        uint16_t phentsize, phnum, shentsize, shnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        uint64_t end = shoff + (uint64_t)shentsize * shnum, pend = phoff + (uint64_t)phentsize * phnum;
        return (size_t)(end > pend ? end : pend);
    }
    return strlen((const char *)image) + 1; /* PTX text */
}

static CUresult load(uint64_t *module, const void *image) {
    if (!image) return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = image_size(image, &start);
    if (!n) return CUDA_ERROR_INVALID_IMAGE;
    hvgpu_module_load_data_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MODULE_LOAD_DATA, NULL, 0, start, n, &v, sizeof v, NULL, NULL, 0);
    if (!r) *module = v.module;
    if (r && hv_trace_enabled()) hv_log("module load of %zu bytes failed: %d", n, r);
    return r;
}

HV_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    uint64_t m;
    CUresult r = load(&m, image);
    if (!r) *module = (CUmodule)(uintptr_t)m;
    return r;
}

HV_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned n,
                                      void *options, void **values) {
    (void)n; (void)options; (void)values; /* JIT options: the host's driver compiles */
    return cuModuleLoadData(module, image);
}

HV_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatbin) {
    return cuModuleLoadData(module, fatbin);
}

HV_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path) {
    if (!module || !path) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (cap - len < 65536) {
            char *nb = realloc(buf, cap = cap * 2 + 65536 + 1);
            if (!nb) { free(buf); fclose(f); return CUDA_ERROR_OUT_OF_MEMORY; }
            buf = nb;
        }
        got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
    } while (got);
    fclose(f);
    buf[len] = 0;
    hvgpu_module_load_data_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MODULE_LOAD_DATA, NULL, 0, buf, len + 1, &v, sizeof v, NULL,
                         NULL, 0);
    free(buf);
    if (!r) *module = (CUmodule)(uintptr_t)v.module;
    return r;
}

HV_EXPORT CUresult cuModuleUnload(CUmodule module) {
    hvgpu_module_unload_req_t q = { (uint64_t)(uintptr_t)module };
    return hv_call(HVGPU_OP_MODULE_UNLOAD, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0);
}

static CUresult get_function(struct hv_func **out, uint64_t module, const char *name) {
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    size_t len = strlen(name);
    if (len > 4096) return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_module_get_function_req_t) + 4096];
    hvgpu_module_get_function_req_t q = { module, (uint32_t)len };
    memcpy(body, &q, sizeof q);
    memcpy(body + sizeof q, name, len);
    hvgpu_module_get_function_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MODULE_GET_FUNCTION, body, (uint32_t)(sizeof q + len), NULL, 0,
                         &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    struct hv_func *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    f->handle = v.function;
    f->nparams = -1;
    snprintf(f->name, sizeof f->name, "%s", name);
    *out = f;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
    return get_function(f, (uint64_t)(uintptr_t)module, name);
}

static CUresult get_global(CUdeviceptr *dptr, size_t *bytes, uint64_t module, const char *name) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    size_t len = strlen(name);
    if (len > 4096) return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_module_get_global_req_t) + 4096];
    hvgpu_module_get_global_req_t q = { module, (uint32_t)len };
    memcpy(body, &q, sizeof q);
    memcpy(body + sizeof q, name, len);
    hvgpu_module_get_global_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MODULE_GET_GLOBAL, body, (uint32_t)(sizeof q + len), NULL, 0,
                         &v, sizeof v, NULL, NULL, 0);
    if (r) return r;
    if (!hv_alloc_find(v.dptr, NULL, NULL)) hv_alloc_add(v.dptr, v.size, 1);
    if (dptr) *dptr = v.dptr;
    if (bytes) *bytes = (size_t)v.size;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule module,
                                        const char *name) {
    return get_global(dptr, bytes, (uint64_t)(uintptr_t)module, name);
}

HV_EXPORT CUresult cuModuleGetLoadingMode(int *mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    /* Lazy, as CUDA's default since 12.2, unless the program asks for eager:
       the runtime then ships each module when its first kernel is needed. */
    const char *env = getenv("CUDA_MODULE_LOADING");
    *mode = env && !strcasecmp(env, "EAGER") ? 1 : 2;
    return CUDA_SUCCESS;
}

/* -- libraries (CUDA 12's context-independent modules) ------------------------- */

HV_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv,
                                     unsigned njo, void *lo, void **lv, unsigned nlo) {
    (void)jo; (void)jv; (void)njo; (void)lo; (void)lv; (void)nlo;
    if (!lib) return CUDA_ERROR_INVALID_VALUE;
    struct hv_library *l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = load(&l->module, code);
    if (r) { free(l); return r; }
    *lib = l;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = cuModuleUnload((CUmodule)(uintptr_t)lib->module);
    free(lib);
    return r;
}

HV_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary lib, const char *name) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    return get_function(kernel, lib->module, name);
}

HV_EXPORT CUresult cuLibraryGetModule(CUmodule *module, CUlibrary lib) {
    if (!module || !lib) return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)(uintptr_t)lib->module;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib,
                                      const char *name) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    return get_global(dptr, bytes, lib->module, name);
}

HV_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel kernel) {
    if (!f || !kernel) return CUDA_ERROR_INVALID_VALUE;
    *f = kernel; /* one handle serves both: the executor's function */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuFuncGetName(const char **name, CUfunction f) {
    if (!name || !f) return CUDA_ERROR_INVALID_VALUE;
    *name = f->name;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuKernelGetName(const char **name, CUkernel k) { return cuFuncGetName(name, k); }

/* -- attributes and occupancy ---------------------------------------------------- */

HV_EXPORT CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f) {
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_func_get_attribute_req_t q = { f->handle, attrib };
    hvgpu_func_get_attribute_rep_t v;
    CUresult r = hv_call(HVGPU_OP_FUNC_GET_ATTRIBUTE, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                         NULL, 0);
    if (!r) *value = v.value;
    return r;
}

HV_EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_func_set_attribute_req_t q = { f->handle, attrib, value };
    return hv_call(HVGPU_OP_FUNC_SET_ATTRIBUTE, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0);
}

HV_EXPORT CUresult cuKernelGetAttribute(int *value, int attrib, CUkernel k, CUdevice dev) {
    (void)dev;
    return cuFuncGetAttribute(value, attrib, k);
}

HV_EXPORT CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
    (void)dev;
    return cuFuncSetAttribute(k, attrib, value);
}

HV_EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
    (void)f; (void)config; /* a preference CUDA itself may ignore */
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev) {
    (void)k; (void)config; (void)dev;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *blocks, CUfunction f, int block_size, size_t smem, unsigned flags) {
    if (!blocks || !f) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_occupancy_max_blocks_req_t q = { f->handle, block_size, smem, flags };
    hvgpu_occupancy_max_blocks_rep_t v;
    CUresult r = hv_call(HVGPU_OP_OCCUPANCY_MAX_BLOCKS, &q, sizeof q, NULL, 0, &v, sizeof v, NULL,
                         NULL, 0);
    if (!r) *blocks = v.blocks;
    return r;
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                               int block_size, size_t smem) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, smem, 0);
}

/* -- launches ------------------------------------------------------------------------ */

static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult layout(struct hv_func *f) {
    if (__atomic_load_n(&f->nparams, __ATOMIC_ACQUIRE) >= 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&layout_lock);
    CUresult r = CUDA_SUCCESS;
    if (f->nparams < 0) {
        hvgpu_func_get_param_info_req_t q = { f->handle };
        static unsigned char rep[4 + MAX_PARAMS * 2];
        uint32_t n = 0;
        r = hv_call(HVGPU_OP_FUNC_GET_PARAM_INFO, &q, sizeof q, NULL, 0, rep, sizeof rep, &n, NULL, 0);
        if (!r) {
            uint32_t len;
            memcpy(&len, rep, 4);
            if (len > n - 4) len = n - 4;
            int count = (int)(len / 8);
            f->offsets = calloc((size_t)count + 1, sizeof *f->offsets);
            f->sizes = calloc((size_t)count + 1, sizeof *f->sizes);
            if (!f->offsets || !f->sizes) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                uint32_t end = 0;
                for (int i = 0; i < count; i++) {
                    memcpy(&f->offsets[i], rep + 4 + 8 * i, 4);
                    memcpy(&f->sizes[i], rep + 8 + 8 * i, 4);
                    if (f->offsets[i] + f->sizes[i] > end) end = f->offsets[i] + f->sizes[i];
                }
                f->params_size = end;
                __atomic_store_n(&f->nparams, count, __ATOMIC_RELEASE);
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

static CUresult launch(struct hv_func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                       void **extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = layout(f);
    if (r) return r;
    unsigned char body[sizeof(hvgpu_launch_kernel_req_t) + MAX_PARAMS];
    unsigned char *buf = body + sizeof(hvgpu_launch_kernel_req_t);
    uint32_t need = f->params_size;
    if (need > MAX_PARAMS) return CUDA_ERROR_INVALID_VALUE;
    if (params) {
        for (int i = 0; i < f->nparams; i++) {
            if (!params[i]) return CUDA_ERROR_INVALID_VALUE;
            memcpy(buf + f->offsets[i], params[i], f->sizes[i]);
        }
    } else if (extra) {
        void *src = NULL;
        size_t len = (size_t)-1;
        for (int i = 0; extra[i] != LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == LAUNCH_PARAM_BUFFER_POINTER) src = extra[i + 1];
            else if (extra[i] == LAUNCH_PARAM_BUFFER_SIZE) len = *(size_t *)extra[i + 1];
            else return CUDA_ERROR_INVALID_VALUE;
        }
        if (!src && need) return CUDA_ERROR_INVALID_VALUE;
        if (len != (size_t)-1 && len < need) return CUDA_ERROR_INVALID_VALUE;
        if (need) memcpy(buf, src, need);
    } else if (need) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    hvgpu_launch_kernel_req_t q = { f->handle, gx, gy, gz, bx, by, bz, smem,
                                    (uint64_t)(uintptr_t)stream, need };
    memcpy(body, &q, sizeof q);
    return hv_oneway(HVGPU_OP_LAUNCH_KERNEL, body, (uint32_t)(sizeof q + need), NULL, 0);
}

HV_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                  CUstream stream, void **params, void **extra) {
    return launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}

typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    struct { int id; char pad[4]; char value[64]; } *attrs;
    unsigned nattrs;
} hv_launch_config;

HV_EXPORT CUresult cuLaunchKernelEx(const hv_launch_config *c, CUfunction f, void **params,
                                    void **extra) {
    static int once;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < c->nattrs; i++) {
        int id = c->attrs[i].id;
        if (id == 8 /* PRIORITY */ || id == 0 /* IGNORE */) continue;
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
            hv_log("cuLaunchKernelEx: launch attribute %d is not implemented by the hvgpu shim; "
                   "the launch returns CUDA_ERROR_NOT_SUPPORTED", id);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params, extra);
}
