/* Driver entry points for modules, libraries, kernels and launches.
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
 * What a function's queries answer is kept per function and vGPU: its
 * attributes come in one reply (FUNC_GET_ATTRIBUTES) the first time one is
 * asked for, and each occupancy answer is kept under its arguments. The
 * program's own cuFuncSetAttribute and cuFuncSetCacheConfig travel one-way (an
 * error the agent finds surfaces at a later call, as CUDA's asynchronous errors
 * do) and change what is kept as CUDA documents: the attribute set reads back
 * as set, and the function's occupancy answers are asked for again. After the
 * agent reports any error of a one-way frame, all is asked for again.
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
    f->nparams = -1;
    pthread_mutex_init(&f->lock, NULL);
    if (hv_trace_enabled() > 1) hv_log("kernel %s (module %llu)", name, (unsigned long long)module);
    *out = f;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
    return HV_ON(hv_tag_device(module), get_function(f, hv_untag(module), name));
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

/* Where a function runs and its handle there: a module's function on its module's
   vGPU; a library kernel on the routed vGPU (looked up there the first time). */
static CUresult resolve(struct hv_func *f, int *device, uint64_t *handle) {
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

/* -- attributes and occupancy ---------------------------------------------------- */

/* A call about one function, on its vGPU, with its handle there as the first field. */
#define ABOUT_FUNCTION(f, q, call) ({ int dev_; uint64_t h_; CUresult r_ = resolve(f, &dev_, &h_); \
    if (!r_) { (q).function = h_; r_ = HV_ON(dev_, call); } r_; })

/* The same, for a function of this file that takes (f, its handle there, ...). */
#define ON_FUNCTION(f, fn, ...) ({ int dev_; uint64_t h_; CUresult r_ = resolve(f, &dev_, &h_); \
    r_ ? r_ : HV_ON(dev_, fn(f, h_, __VA_ARGS__)); })

#define FUNC_ATTRS 32           /* CUfunction_attribute 0..31 asked for at once (cuda.h 13.0 has 16) */
#define ATTR_SHARED_SIZE 1      /* static shared memory */
#define ATTR_FIRST_SETTABLE 8   /* 0..7 are read-only: CUDA refuses to set them */
#define ATTR_MAX_DYNAMIC_SHARED 8
#define ATTR_CARVEOUT 9
#define DEVICE_SHARED_OPTIN 97  /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
#define CACHE_PREFER_NONE 0     /* a function's cache preference before any is set */
#define OCC_FIRST 64            /* occupancy answers kept per function: a power of two ... */
#define OCC_MOST 4096           /* ... that doubles up to this; when full, it starts over */

enum { OCC_MAX_BLOCKS, OCC_AVAILABLE_SMEM };

struct occ_entry {
    int used, kind, a, b;       /* kind; block size and flags, or blocks and block size */
    uint64_t smem;
    int64_t value;
};

struct hv_answers {
    int filled;                 /* attr[] holds the agent's answers and the sets since */
    unsigned failures;          /* hv_oneway_failures() when this was last checked */
    uint32_t known;             /* bit i: the agent's driver has attribute i */
    int attr[FUNC_ATTRS];
    int cache_config;           /* the preference last sent; -1: not known */
    struct occ_entry *occ;      /* open addressing over occ_cap slots */
    unsigned occ_cap, occ_len;
};

static void forget_occupancy(struct hv_answers *a) {
    if (a->occ) memset(a->occ, 0, a->occ_cap * sizeof *a->occ);
    a->occ_len = 0;
}

/* The function's answers on the routed vGPU (its handle is valid there), with
   f->lock held; NULL (lock released) when out of memory. What was kept before
   the agent reported an error of a one-way frame is dropped: that frame may have
   been one of the sets the answers assumed. */
static struct hv_answers *answers(struct hv_func *f) {
    int d = hv_routed_device();
    pthread_mutex_lock(&f->lock);
    struct hv_answers *a = f->answers[d];
    if (!a) {
        a = f->answers[d] = calloc(1, sizeof *a);
        if (!a) { pthread_mutex_unlock(&f->lock); return NULL; }
        a->cache_config = CACHE_PREFER_NONE;
        a->failures = hv_oneway_failures();
    }
    unsigned failures = hv_oneway_failures();
    if (a->failures != failures) {
        a->failures = failures;
        a->filled = 0;
        a->cache_config = -1;
        forget_occupancy(a);
    }
    return a;
}

static CUresult fill(struct hv_answers *a, uint64_t handle) {
    if (a->filled) return CUDA_SUCCESS;
    hvgpu_func_get_attributes_req_t q = { handle, FUNC_ATTRS };
    unsigned char rep[sizeof(hvgpu_func_get_attributes_rep_t) + 4 * FUNC_ATTRS];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_FUNC_GET_ATTRIBUTES, &q, sizeof q, NULL, 0, rep, sizeof rep, &n,
                         NULL, 0);
    if (r) return r;
    hvgpu_func_get_attributes_rep_t v;
    if (n < sizeof v) return CUDA_ERROR_INVALID_VALUE;
    memcpy(&v, rep, sizeof v);
    uint32_t count = (n - (uint32_t)sizeof v) / 4;
    if (v.values_len / 4 < count) count = v.values_len / 4;
    memset(a->attr, 0, sizeof a->attr);
    memcpy(a->attr, rep + sizeof v, 4 * count);
    a->known = v.known & (count >= 32 ? 0xFFFFFFFFu : (1u << count) - 1);
    a->filled = 1;
    return CUDA_SUCCESS;
}

static CUresult get_attribute(struct hv_func *f, uint64_t handle, int *value, int attrib) {
    if (attrib < 0 || attrib >= FUNC_ATTRS) { /* past what is kept: the agent's driver says */
        hvgpu_func_get_attribute_req_t q = { handle, attrib };
        hvgpu_func_get_attribute_rep_t v;
        CUresult r = hv_call(HVGPU_OP_FUNC_GET_ATTRIBUTE, &q, sizeof q, NULL, 0, &v, sizeof v,
                             NULL, NULL, 0);
        if (!r) *value = v.value;
        return r;
    }
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fill(a, handle);
    if (!r && !(a->known >> attrib & 1)) r = CUDA_ERROR_INVALID_VALUE; /* unknown there */
    if (!r) *value = a->attr[attrib];
    pthread_mutex_unlock(&f->lock);
    return r;
}

static CUresult set_attribute(struct hv_func *f, uint64_t handle, int attrib, int value) {
    if (attrib >= 0 && attrib < ATTR_FIRST_SETTABLE) return CUDA_ERROR_INVALID_VALUE; /* read-only */
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    /* The dynamic shared memory limit and the carveout preference read back as set;
       how the cluster attributes (and any newer ones) combine is the driver's, so
       after a set of one of those, all are asked for again. */
    int reads_back = attrib == ATTR_MAX_DYNAMIC_SHARED || attrib == ATTR_CARVEOUT;
    if (reads_back) {
        r = fill(a, handle);
        if (!r && attrib == ATTR_MAX_DYNAMIC_SHARED) {
            int optin = 0;
            if (value < 0 || (cuDeviceGetAttribute(&optin, DEVICE_SHARED_OPTIN,
                                                   hv_routed_device()) == CUDA_SUCCESS &&
                              optin > 0 && value > optin - a->attr[ATTR_SHARED_SIZE]))
                r = CUDA_ERROR_INVALID_VALUE; /* more than the device lets a block have */
        }
        if (!r && (a->known >> attrib & 1) && a->attr[attrib] == value) goto out; /* as it is */
    }
    if (!r) {
        hvgpu_func_set_attribute_req_t q = { handle, attrib, value };
        r = hv_oneway(HVGPU_OP_FUNC_SET_ATTRIBUTE, &q, sizeof q, NULL, 0);
    }
    if (!r) {
        if (reads_back) a->attr[attrib] = value;
        else a->filled = 0;
        forget_occupancy(a);
    }
out:
    pthread_mutex_unlock(&f->lock);
    return r;
}

static CUresult set_cache_config(struct hv_func *f, uint64_t handle, int config) {
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    if (a->cache_config != config) {
        hvgpu_func_set_cache_config_req_t q = { handle, (uint32_t)config };
        r = hv_oneway(HVGPU_OP_FUNC_SET_CACHE_CONFIG, &q, sizeof q, NULL, 0);
        if (!r) {
            a->cache_config = config;
            forget_occupancy(a); /* the preference may change how much shared memory an SM has */
        }
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static unsigned occ_slot(const struct occ_entry *e, unsigned cap) {
    uint64_t h = (uint64_t)(unsigned)e->kind * 0x9E3779B97F4A7C15ull;
    h = (h ^ (unsigned)e->a) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (unsigned)e->b) * 0x94D049BB133111EBull;
    h = (h ^ e->smem) * 0x9E3779B97F4A7C15ull;
    return (unsigned)(h >> 32) & (cap - 1);
}

static struct occ_entry *occ_find(struct hv_answers *a, const struct occ_entry *key) {
    if (!a->occ) return NULL;
    for (unsigned i = occ_slot(key, a->occ_cap);; i = (i + 1) & (a->occ_cap - 1)) {
        struct occ_entry *e = &a->occ[i];
        if (!e->used) return NULL;
        if (e->kind == key->kind && e->a == key->a && e->b == key->b && e->smem == key->smem)
            return e;
    }
}

static void occ_keep(struct hv_answers *a, struct occ_entry *entry) {
    if (2 * (a->occ_len + 1) > a->occ_cap) { /* kept at most half full */
        unsigned cap = a->occ_cap ? 2 * a->occ_cap : OCC_FIRST;
        struct occ_entry *old = a->occ, *grown = cap <= OCC_MOST ? calloc(cap, sizeof *grown) : NULL;
        if (!grown) { /* at the limit (or out of memory): start over */
            forget_occupancy(a);
            if (!a->occ) return;
        } else {
            unsigned old_cap = a->occ_cap;
            a->occ = grown;
            a->occ_cap = cap;
            a->occ_len = 0;
            for (unsigned i = 0; i < old_cap; i++)
                if (old[i].used) occ_keep(a, &old[i]);
            free(old);
        }
    }
    unsigned i = occ_slot(entry, a->occ_cap);
    while (a->occ[i].used) i = (i + 1) & (a->occ_cap - 1);
    a->occ[i] = *entry;
    a->occ[i].used = 1;
    a->occ_len++;
}

/* An occupancy answer: kept, or asked for (op, request q) and kept. */
static CUresult occupancy(struct hv_func *f, struct occ_entry key, uint16_t op, const void *q,
                          uint32_t qlen, int64_t *value) {
    struct hv_answers *a = answers(f);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    struct occ_entry *e = occ_find(a, &key);
    if (e) {
        *value = e->value;
    } else {
        union {
            hvgpu_occupancy_max_blocks_rep_t blocks;
            hvgpu_occupancy_available_smem_rep_t smem;
        } v;
        r = hv_call(op, q, qlen, NULL, 0, &v, sizeof v, NULL, NULL, 0);
        if (!r) {
            key.value = *value = key.kind == OCC_MAX_BLOCKS ? v.blocks.blocks : (int64_t)v.smem.bytes;
            occ_keep(a, &key);
        }
    }
    pthread_mutex_unlock(&f->lock);
    return r;
}

static CUresult max_blocks(struct hv_func *f, uint64_t handle, int *blocks, int block_size,
                           size_t smem, unsigned flags) {
    hvgpu_occupancy_max_blocks_req_t q = { handle, block_size, smem, flags };
    struct occ_entry key = { 0, OCC_MAX_BLOCKS, block_size, (int)flags, smem, 0 };
    int64_t value;
    CUresult r = occupancy(f, key, HVGPU_OP_OCCUPANCY_MAX_BLOCKS, &q, sizeof q, &value);
    if (!r) *blocks = (int)value;
    return r;
}

static CUresult available_smem(struct hv_func *f, uint64_t handle, size_t *bytes, int blocks,
                               int block_size) {
    hvgpu_occupancy_available_smem_req_t q = { handle, blocks, block_size };
    struct occ_entry key = { 0, OCC_AVAILABLE_SMEM, blocks, block_size, 0, 0 };
    int64_t value;
    CUresult r = occupancy(f, key, HVGPU_OP_OCCUPANCY_AVAILABLE_SMEM, &q, sizeof q, &value);
    if (!r) *bytes = (size_t)value;
    return r;
}

HV_EXPORT CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f) {
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, get_attribute, value, attrib);
}

HV_EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, set_attribute, attrib, value);
}

HV_EXPORT CUresult cuKernelGetAttribute(int *value, int attrib, CUkernel k, CUdevice dev) {
    return HV_ON(dev, cuFuncGetAttribute(value, attrib, k));
}

HV_EXPORT CUresult cuKernelSetAttribute(int attrib, int value, CUkernel k, CUdevice dev) {
    return HV_ON(dev, cuFuncSetAttribute(k, attrib, value));
}

HV_EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    if (config < 0 || config > 3) return CUDA_ERROR_INVALID_VALUE; /* not a CUfunc_cache */
    return ON_FUNCTION(f, set_cache_config, config);
}

HV_EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev) {
    return HV_ON(dev, cuFuncSetCacheConfig(k, config));
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *blocks, CUfunction f, int block_size, size_t smem, unsigned flags) {
    if (!blocks || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, max_blocks, blocks, block_size, smem, flags);
}

HV_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                               int block_size, size_t smem) {
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, smem, 0);
}

HV_EXPORT CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *bytes, CUfunction f,
                                                           int blocks, int block_size) {
    if (!bytes || !f) return CUDA_ERROR_INVALID_VALUE;
    return ON_FUNCTION(f, available_smem, bytes, blocks, block_size);
}

/* -- launches ------------------------------------------------------------------------ */

static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult layout(struct hv_func *f) {
    if (__atomic_load_n(&f->nparams, __ATOMIC_ACQUIRE) >= 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&layout_lock);
    CUresult r = CUDA_SUCCESS;
    if (f->nparams < 0) {
        hvgpu_func_get_param_info_req_t q = { 0 };
        static unsigned char rep[4 + MAX_PARAMS * 2];
        uint32_t n = 0;
        r = ABOUT_FUNCTION(f, q, hv_call(HVGPU_OP_FUNC_GET_PARAM_INFO, &q, sizeof q, NULL, 0, rep,
                                         sizeof rep, &n, NULL, 0));
        if (!r) {
            uint32_t len = 0;
            if (n >= 4) memcpy(&len, rep, 4);
            if (len > (n >= 4 ? n - 4 : 0)) len = n >= 4 ? n - 4 : 0;
            int count = (int)(len / 8);
            free(f->offsets);
            free(f->sizes);
            f->offsets = calloc((size_t)count + 1, sizeof *f->offsets);
            f->sizes = calloc((size_t)count + 1, sizeof *f->sizes);
            if (!f->offsets || !f->sizes) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                uint32_t end = 0;
                for (int i = 0; i < count && !r; i++) {
                    memcpy(&f->offsets[i], rep + 4 + 8 * i, 4);
                    memcpy(&f->sizes[i], rep + 8 + 8 * i, 4);
                    /* Each parameter is copied where this says, into a buffer of MAX_PARAMS:
                       the agent's word is checked (in 64 bits: an end past 2^32 must not
                       wrap into a small one). */
                    uint64_t at = (uint64_t)f->offsets[i] + f->sizes[i];
                    if (at > MAX_PARAMS) r = CUDA_ERROR_INVALID_VALUE;
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
                           f->name ? f->name : "a kernel", MAX_PARAMS);
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
    if (need > MAX_PARAMS) return refuse_pack(f, "parameters larger than the shim carries");
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
    CUresult r = resolve(f, device, handle);
    return r ? r : pack(f, params, extra, buf, size);
}

/* A launch runs where its function lives; a stream of another vGPU is CUDA's
   invalid handle (it belongs to another context). */
static CUresult launch_target(struct hv_func *f, CUstream stream, int *device, uint64_t *handle) {
    CUresult r = resolve(f, device, handle);
    if (!r && hv_created(stream) && hv_tag_device(stream) != *device)
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r && hv_trace_enabled())
        hv_log("launch of %s refused: %s (%d)", f->name ? f->name : "?", r == CUDA_ERROR_INVALID_HANDLE &&
               hv_created(stream) ? "its stream is another vGPU's" : "no such function there", r);
    return r;
}

static CUresult launch(struct hv_func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                       void **extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    unsigned char body[sizeof(hvgpu_launch_kernel_req_t) + MAX_PARAMS];
    uint32_t need = 0;
    int device;
    uint64_t handle;
    CUresult r = launch_target(f, stream, &device, &handle);
    if (!r) r = pack(f, params, extra, body + sizeof(hvgpu_launch_kernel_req_t), &need);
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

typedef struct {
    int id;
    char pad[4];
    char value[64];
} hv_launch_attribute; /* CUlaunchAttribute */

typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    hv_launch_attribute *attrs;
    unsigned nattrs;
} hv_launch_config; /* CUlaunchConfig */

#define MAX_ATTRS 32

HV_EXPORT CUresult cuLaunchKernelEx(const hv_launch_config *c, CUfunction f, void **params,
                                    void **extra) {
    static int once;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!c->nattrs)
        return launch(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params,
                      extra);
    if (!f || !c->attrs || c->nattrs > MAX_ATTRS) return CUDA_ERROR_INVALID_VALUE;
    if (hv_trace_enabled() > 1)
        for (unsigned i = 0; i < c->nattrs; i++)
            hv_log("cuLaunchKernelEx(%s): attribute %d", f->name, c->attrs[i].id);
    for (unsigned i = 0; i < c->nattrs; i++) {
        int id = c->attrs[i].id;
        if (id == 7 || id == 12) /* they name events, which are the executor's */
            return hv_unsupported("cuLaunchKernelEx with an event attribute", &once);
    }
    static __thread unsigned char body[sizeof(hvgpu_launch_kernel_ex_req_t) + MAX_PARAMS +
                                       MAX_ATTRS * sizeof(hv_launch_attribute)];
    uint32_t need = 0;
    int device;
    uint64_t handle;
    CUresult r = launch_target(f, c->stream, &device, &handle);
    if (!r) r = pack(f, params, extra, body + sizeof(hvgpu_launch_kernel_ex_req_t), &need);
    if (r) return r;
    uint32_t attrs_len = c->nattrs * (uint32_t)sizeof(hv_launch_attribute);
    memcpy(body + sizeof(hvgpu_launch_kernel_ex_req_t) + need, c->attrs, attrs_len);
    hvgpu_launch_kernel_ex_req_t q = { handle, c->gx, c->gy, c->gz, c->bx, c->by, c->bz,
                                       c->smem, hv_untag(c->stream), need, attrs_len };
    memcpy(body, &q, sizeof q);
    return HV_ON(device, hv_oneway(HVGPU_OP_LAUNCH_KERNEL_EX, body,
                                   (uint32_t)(sizeof q + need + attrs_len), NULL, 0));
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
    unsigned char rep[4 + 128];
    uint32_t n = 0;
    CUresult r = hv_call(HVGPU_OP_TENSOR_MAP_ENCODE_TILED, body, (uint32_t)(p - body), NULL, 0,
                         rep, sizeof rep, &n, NULL, 0);
    if (r) return r;
    if (n < sizeof rep) return CUDA_ERROR_INVALID_VALUE;
    memcpy(map, rep + 4, 128);
    return CUDA_SUCCESS;
}

static CUresult clusters(int which, int *value, CUfunction f, const hv_launch_config *c) {
    if (!value || !f || !c || c->nattrs > MAX_ATTRS || (c->nattrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char body[sizeof(hvgpu_occupancy_clusters_req_t) +
                       MAX_ATTRS * sizeof(hv_launch_attribute)];
    uint32_t attrs_len = c->nattrs * (uint32_t)sizeof(hv_launch_attribute);
    hvgpu_occupancy_clusters_req_t q = { (uint32_t)which, 0, c->gx, c->gy, c->gz,
                                         c->bx, c->by, c->bz, c->smem, attrs_len };
    int device;
    uint64_t handle;
    CUresult r = resolve(f, &device, &handle);
    if (r) return r;
    q.function = handle;
    memcpy(body, &q, sizeof q);
    if (attrs_len) memcpy(body + sizeof q, c->attrs, attrs_len);
    hvgpu_occupancy_clusters_rep_t v;
    r = HV_ON(device, hv_call(HVGPU_OP_OCCUPANCY_CLUSTERS, body, (uint32_t)(sizeof q + attrs_len),
                              NULL, 0, &v, sizeof v, NULL, NULL, 0));
    if (!r) *value = v.value;
    return r;
}

HV_EXPORT CUresult cuOccupancyMaxActiveClusters(int *clusters_, CUfunction f,
                                                const hv_launch_config *c) {
    return clusters(0, clusters_, f, c);
}

HV_EXPORT CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                                      const hv_launch_config *c) {
    return clusters(1, size, f, c);
}

/* The block size with the most resident threads, asked block size by block size
   (the callback for dynamic shared memory runs here, in the guest). */
HV_EXPORT CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(
    int *min_grid, int *block_size, CUfunction f, size_t (*smem_for)(int), size_t smem,
    int limit, unsigned flags) {
    if (!min_grid || !block_size || !f) return CUDA_ERROR_INVALID_VALUE;
    int max_threads = 0, sms = 0, dev = hv_current_or_primary()->device;
    CUresult r = cuFuncGetAttribute(&max_threads, 0 /* MAX_THREADS_PER_BLOCK */, f);
    if (!r) r = cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, dev);
    if (r) return r;
    if (limit > 0 && limit < max_threads) max_threads = limit;
    int best_threads = 0, best_size = 0, best_blocks = 0;
    for (int size = (max_threads / 32) * 32; size > 0; size -= 32) {
        int blocks = 0;
        r = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            &blocks, f, size, smem_for ? smem_for(size) : smem, flags);
        if (r) return r;
        if (blocks * size > best_threads) {
            best_threads = blocks * size;
            best_size = size;
            best_blocks = blocks;
        }
    }
    *block_size = best_size;
    *min_grid = best_blocks * sms;
    return CUDA_SUCCESS;
}

HV_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                    size_t (*smem_for)(int), size_t smem,
                                                    int limit) {
    return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, smem_for, smem,
                                                     limit, 0);
}
