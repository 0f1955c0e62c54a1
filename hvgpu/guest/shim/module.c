/* Driver entry points for modules, libraries and kernels (their lookup).
 *
 * A module image (PTX, cubin, fatbin, or the runtime's fatbin wrapper) is
 * measured here and shipped once per load; functions are looked up once and
 * carry their parameter layout, fetched from the agent (cuFuncGetParamInfo on
 * the real function) at the first launch, so a launch is one one-way frame
 * built from kernelParams or from the `extra` buffer. Must not guess a
 * layout: a kernel whose layout cannot be had is not launched.
 *
 * With several vGPUs, a module (and its functions) belongs to the vGPU it was
 * loaded on; a library is loaded on each vGPU the first time it is used there,
 * and its kernels are looked up there by name.
 *
 * A function's attributes and occupancy are occupancy.c's; its parameter
 * layout and launches are launches.c's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBINC_MAGIC 0x466243B1u

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

static CUresult load_bytes(uint64_t *module, const void *start, size_t n) {
    hvgpu_module_load_data_rep_t v;
    CUresult r = hv_call(HVGPU_OP_MODULE_LOAD_DATA, NULL, 0, start, n, &v, sizeof v, NULL, NULL, 0);
    if (!r) *module = v.module;
    if (r && hv_trace_enabled()) hv_log("module load of %zu bytes failed: %d", n, r);
    if (!r && hv_trace_enabled() > 1)
        hv_log("module %llu: %zu bytes (device %d)", (unsigned long long)v.module, n,
               hv_routed_device());
    return r;
}

static CUresult load(uint64_t *module, const void *image) {
    if (!image) return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = image_size(image, &start);
    if (!n) return CUDA_ERROR_INVALID_IMAGE;
    return load_bytes(module, start, n);
}

HV_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    uint64_t m;
    CUresult r = load(&m, image);
    if (!r) *module = hv_tag(hv_routed_device(), m);
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

/* A module or library file, read whole in the guest (malloc'd, NUL-terminated so that
   PTX text is a string; *len excludes the NUL). */
static CUresult read_file(const char *path, char **out, size_t *out_len) {
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
    *out = buf;
    *out_len = len;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path) {
    if (!module || !path) return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t len;
    CUresult r = read_file(path, &buf, &len);
    if (r) return r;
    hvgpu_module_load_data_rep_t v;
    r = hv_call(HVGPU_OP_MODULE_LOAD_DATA, NULL, 0, buf, len + 1, &v, sizeof v, NULL, NULL, 0);
    free(buf);
    if (!r) *module = hv_tag(hv_routed_device(), v.module);
    return r;
}

static CUresult unload(uint64_t module) {
    hvgpu_module_unload_req_t q = { module };
    return hv_call(HVGPU_OP_MODULE_UNLOAD, &q, sizeof q, NULL, 0, NULL, 0, NULL, NULL, 0);
}

HV_EXPORT CUresult cuModuleUnload(CUmodule module) {
    return HV_ON(hv_tag_device(module), unload(hv_untag(module)));
}

#define MAX_NAME 4096

/* MODULE_GET_FUNCTION and MODULE_GET_GLOBAL both ask by (module, name). */
_Static_assert(sizeof(hvgpu_module_get_function_req_t) == sizeof(hvgpu_module_get_global_req_t),
               "the by-name requests share one layout");

static CUresult call_by_name(uint16_t op, uint64_t module, const char *name, void *reply,
                             uint32_t reply_size) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    size_t len = strlen(name);
    if (len > MAX_NAME) return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_module_get_function_req_t) + MAX_NAME];
    hvgpu_module_get_function_req_t q = { module, (uint32_t)len };
    memcpy(body, &q, sizeof q);
    memcpy(body + sizeof q, name, len);
    return hv_call(op, body, (uint32_t)(sizeof q + len), NULL, 0, reply, reply_size, NULL, NULL, 0);
}

static CUresult get_function(struct hv_func **out, uint64_t module, const char *name) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    hvgpu_module_get_function_rep_t v;
    CUresult r = call_by_name(HVGPU_OP_MODULE_GET_FUNCTION, module, name, &v, sizeof v);
    if (r) return r;
    struct hv_func *f = calloc(1, sizeof *f);
    if (f) f->name = strdup(name);
    if (!f || !f->name) { free(f); return CUDA_ERROR_OUT_OF_MEMORY; }
    f->handle = v.function;
    f->device = hv_routed_device();
    f->module = hv_tag(f->device, module);
    f->nparams = -1;
    pthread_mutex_init(&f->lock, NULL);
    if (hv_trace_enabled() > 1) hv_log("kernel %s (module %llu)", name, (unsigned long long)module);
    *out = f;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
    return HV_ON(hv_tag_device(module), get_function(f, hv_untag(module), name));
}

/* The module's function names, NUL-separated, in the driver's order (malloc'd, *len
   bytes), asked of the executor: the guest never parses the image. */
static CUresult function_names(uint64_t module, char **names, uint32_t *len) {
    size_t cap = sizeof(hvgpu_module_function_names_rep_t) + HVGPU_MAX_FUNCTION_NAMES;
    unsigned char *rep = malloc(cap);
    if (!rep) return CUDA_ERROR_OUT_OF_MEMORY;
    hvgpu_module_function_names_req_t q = { module };
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_MODULE_FUNCTION_NAMES, &q, sizeof q, NULL, 0, rep,
                         (uint32_t)cap, &n, NULL, 0);
    hvgpu_module_function_names_rep_view_t v;
    if (!r && hvgpu_module_function_names_rep_decode(rep, n, &v)) r = CUDA_ERROR_UNKNOWN;
    if (!r) {
        *names = malloc(v.names.len + 1);
        if (!*names) r = CUDA_ERROR_OUT_OF_MEMORY;
        else {
            memcpy(*names, v.names.data, v.names.len);
            (*names)[v.names.len] = 0;
            *len = v.names.len;
        }
    }
    free(rep);
    return r;
}

static unsigned count_names(const char *names, uint32_t len) {
    unsigned count = 0;
    for (uint32_t i = 0; i < len; i += (uint32_t)strlen(names + i) + 1) count++;
    return len ? count : 0;
}

static CUresult function_count(unsigned *count, uint64_t module) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    char *names;
    uint32_t len;
    CUresult r = function_names(module, &names, &len);
    if (r) return r;
    *count = count_names(names, len);
    free(names);
    return CUDA_SUCCESS;
}

/* As the driver: the first numFunctions of the module's functions, and an error when
   the array is shorter than the module's count. */
static CUresult enumerate_functions(CUfunction *out, unsigned want, uint64_t module) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    char *names;
    uint32_t len;
    CUresult r = function_names(module, &names, &len);
    if (r) return r;
    if (want < count_names(names, len)) r = CUDA_ERROR_INVALID_VALUE;
    unsigned i = 0;
    for (uint32_t at = 0; !r && at < len && i < want; at += (uint32_t)strlen(names + at) + 1)
        r = get_function(&out[i++], module, names + at);
    free(names);
    return r;
}

/* Each of the module's functions handed to fn, in the driver's order; how many, or -1
   with *r saying why none could be had (the tools table's iterator, dark.c). */
long hv_module_each_function(CUmodule module, void (*fn)(void *, CUfunction, uint64_t),
                             void *opaque, CUresult *r) {
    if (!module) { *r = CUDA_ERROR_INVALID_HANDLE; return -1; }
    int device = hv_tag_device(module);
    uint64_t m = hv_untag(module);
    char *names;
    uint32_t len;
    *r = HV_ON(device, function_names(m, &names, &len));
    if (*r) return -1;
    long count = 0;
    for (uint32_t at = 0; at < len; at += (uint32_t)strlen(names + at) + 1) {
        CUfunction f;
        *r = HV_ON(device, get_function(&f, m, names + at));
        if (*r) break;
        fn(opaque, f, (uint64_t)(uintptr_t)module);
        count++;
    }
    free(names);
    return count;
}

HV_EXPORT CUresult cuModuleGetFunctionCount(unsigned *count, CUmodule module) {
    if (!module) return CUDA_ERROR_INVALID_HANDLE;
    return HV_ON(hv_tag_device(module), function_count(count, hv_untag(module)));
}

HV_EXPORT CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned count,
                                              CUmodule module) {
    if (!module) return CUDA_ERROR_INVALID_HANDLE;
    return HV_ON(hv_tag_device(module), enumerate_functions(functions, count, hv_untag(module)));
}

static CUresult get_global(CUdeviceptr *dptr, size_t *bytes, uint64_t module, const char *name) {
    hvgpu_module_get_global_rep_t v;
    CUresult r = call_by_name(HVGPU_OP_MODULE_GET_GLOBAL, module, name, &v, sizeof v);
    if (r) return r;
    if (!hv_alloc_find(v.dptr, NULL, NULL)) hv_alloc_add(v.dptr, v.size, 1);
    if (dptr) *dptr = v.dptr;
    if (bytes) *bytes = (size_t)v.size;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule module,
                                        const char *name) {
    return HV_ON(hv_tag_device(module), get_global(dptr, bytes, hv_untag(module), name));
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

static pthread_mutex_t library_lock = PTHREAD_MUTEX_INITIALIZER;

/* The library's module on the routed vGPU, loaded there on first use. */
static CUresult library_module(struct hv_library *lib, uint64_t *module) {
    int d = hv_routed_device();
    pthread_mutex_lock(&library_lock);
    CUresult r = CUDA_SUCCESS;
    if (!lib->module[d])
        r = lib->image ? load_bytes(&lib->module[d], lib->image, lib->size)
                       : CUDA_ERROR_INVALID_HANDLE;
    *module = lib->module[d];
    pthread_mutex_unlock(&library_lock);
    return r;
}

HV_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jo, void **jv,
                                     unsigned njo, void *lo, void **lv, unsigned nlo) {
    (void)jo; (void)jv; (void)njo; (void)lo; (void)lv; (void)nlo;
    if (!lib || !code) return CUDA_ERROR_INVALID_VALUE;
    struct hv_library *l = calloc(1, sizeof *l);
    if (!l) return CUDA_ERROR_OUT_OF_MEMORY;
    const void *start;
    l->size = image_size(code, &start);
    l->image = start;
    if (!l->size) { free(l); return CUDA_ERROR_INVALID_IMAGE; }
    uint64_t m;
    CUresult r = library_module(l, &m);
    if (r) { free(l); return r; }
    if (hv_device_count > 1) { /* for the other vGPUs: the caller may free its image */
        void *copy = malloc(l->size);
        if (copy) memcpy(copy, start, l->size);
        l->image = copy;
        l->owned = 1;
    } else {
        l->image = NULL;
    }
    *lib = l;
    return CUDA_SUCCESS;
}

/* Read in the guest, then as cuLibraryLoadData: the executor never sees a guest path. */
HV_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jo, void **jv,
                                         unsigned njo, void *lo, void **lv, unsigned nlo) {
    if (!lib || !path) return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t len;
    CUresult r = read_file(path, &buf, &len);
    if (r) return r;
    r = cuLibraryLoadData(lib, buf, jo, jv, njo, lo, lv, nlo); /* keeps a copy if it must */
    free(buf);
    return r;
}

/* A library's __managed__ variables are the host driver's managed memory, at host
   addresses the guest cannot map as its own (managed.c maps only what it allocated);
   a unified function is host code of the library, which the guest does not hold. */
HV_EXPORT CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib,
                                       const char *name) {
    static int once;
    (void)dptr; (void)bytes;
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    return hv_unsupported("cuLibraryGetManaged (a library's managed variables live in the "
                          "host driver's managed memory, which the guest cannot map)", &once);
}

HV_EXPORT CUresult cuLibraryGetUnifiedFunction(void **fptr, CUlibrary lib, const char *symbol) {
    static int once;
    (void)fptr;
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    if (!symbol) return CUDA_ERROR_INVALID_VALUE;
    return hv_unsupported("cuLibraryGetUnifiedFunction (a unified function's host code is "
                          "loaded by the host driver, not in the guest)", &once);
}

HV_EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = CUDA_SUCCESS;
    for (int d = 0; d < HV_MAX_DEVICES; d++) {
        CUresult rd = lib->module[d] ? HV_ON(d, unload(lib->module[d])) : CUDA_SUCCESS;
        if (!r) r = rd;
    }
    if (lib->owned) free((void *)lib->image);
    free(lib);
    return r;
}

/* One handle per name, as CUDA's: what is kept about a kernel is kept once. */
HV_EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary lib, const char *name) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    if (!kernel || !name) return CUDA_ERROR_INVALID_VALUE;
    uint64_t m;
    CUresult r = library_module(lib, &m);
    if (r) return r;
    pthread_mutex_lock(&library_lock);
    struct hv_func *k = lib->kernels;
    while (k && strcmp(k->name, name)) k = k->next;
    if (!k) {
        r = get_function(&k, m, name);
        if (!r) {
            k->library = lib;
            k->on[k->device] = k->handle;
            k->next = lib->kernels;
            lib->kernels = k;
        }
    }
    pthread_mutex_unlock(&library_lock);
    if (!r) *kernel = k;
    return r;
}

HV_EXPORT CUresult cuLibraryGetKernelCount(unsigned *count, CUlibrary lib) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t m;
    CUresult r = library_module(lib, &m);
    return r ? r : function_count(count, m);
}

/* Each through cuLibraryGetKernel: one handle per name, as there. */
HV_EXPORT CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned count, CUlibrary lib) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    if (!kernels) return CUDA_ERROR_INVALID_VALUE;
    uint64_t m;
    char *names;
    uint32_t len;
    CUresult r = library_module(lib, &m);
    if (!r) r = function_names(m, &names, &len);
    if (r) return r;
    if (count < count_names(names, len)) r = CUDA_ERROR_INVALID_VALUE;
    unsigned i = 0;
    for (uint32_t at = 0; !r && at < len && i < count; at += (uint32_t)strlen(names + at) + 1)
        r = cuLibraryGetKernel(&kernels[i++], lib, names + at);
    free(names);
    return r;
}

/* Where a function runs and its handle there: a module's function on its module's
   vGPU; a library kernel on the routed vGPU (looked up there the first time). */
CUresult hv_func_resolve(struct hv_func *f, int *device, uint64_t *handle) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!f->library) {
        *device = f->device;
        *handle = f->handle;
        return CUDA_SUCCESS;
    }
    int d = hv_routed_device();
    if (!__atomic_load_n(&f->on[d], __ATOMIC_ACQUIRE)) {
        uint64_t m;
        CUresult r = library_module(f->library, &m);
        hvgpu_module_get_function_rep_t v;
        if (!r) r = call_by_name(HVGPU_OP_MODULE_GET_FUNCTION, m, f->name, &v, sizeof v);
        if (r) return r;
        __atomic_store_n(&f->on[d], v.function, __ATOMIC_RELEASE);
    }
    *device = d;
    *handle = f->on[d];
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuKernelGetLibrary(CUlibrary *lib, CUkernel kernel) {
    if (!lib || !kernel) return CUDA_ERROR_INVALID_VALUE;
    if (!kernel->library) return CUDA_ERROR_INVALID_HANDLE;
    *lib = kernel->library;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuLibraryGetModule(CUmodule *module, CUlibrary lib) {
    if (!module || !lib) return CUDA_ERROR_INVALID_VALUE;
    uint64_t m;
    CUresult r = library_module(lib, &m);
    if (!r) *module = hv_tag(hv_routed_device(), m);
    return r;
}

HV_EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary lib,
                                      const char *name) {
    if (!lib) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t m;
    CUresult r = library_module(lib, &m);
    return r ? r : get_global(dptr, bytes, m, name);
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

/* The module a function was found in; a library kernel's is its library's module on the
   routed vGPU (where cuKernelGetFunction's function would be). */
HV_EXPORT CUresult cuFuncGetModule(CUmodule *module, CUfunction f) {
    if (!module) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!f->library) {
        *module = f->module;
        return CUDA_SUCCESS;
    }
    uint64_t m;
    CUresult r = library_module(f->library, &m);
    if (!r) *module = hv_tag(hv_routed_device(), m);
    return r;
}

/* Every function the shim hands out was found by name on the executor
   (cuModuleGetFunction there), which loads it whole: it is loaded, and cuFuncLoad has
   nothing left to do. CU_FUNCTION_LOADING_STATE_LOADED is 1. */
HV_EXPORT CUresult cuFuncIsLoaded(int *state, CUfunction f) {
    if (!state) return CUDA_ERROR_INVALID_VALUE;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    *state = 1;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuFuncLoad(CUfunction f) {
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
