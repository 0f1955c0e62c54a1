/* cuGetExportTable: the private tables the CUDA runtime asks its driver for.
 *
 * A statically linked libcudart (nvcc's default) and the libraries built on
 * it reach the driver through these tables as well as through the documented
 * entry points: to load the fatbins a program registers, to find a device's
 * primary context, to keep per-context state, and to check that the driver is
 * one it trusts. What each slot must do was learnt from what the runtime asks
 * and from public notes of projects that answer the same questions (ZLUDA's
 * dark_api); nothing of NVIDIA's code is here. Slots the runtime was not seen
 * to call are left empty, as those notes found works.
 *
 * Must not load fatbins any other way than the documented cuModuleLoadData.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

typedef void (*fnptr)(void);
#define SLOTS(n) ((fnptr)(uintptr_t)((n) * sizeof(void *))) /* slot 0: the table's size */

/* -- the runtime's interface: modules and the primary context ------------------- */

static CUresult module_from_wrapper(CUmodule *module, const void *wrapper) {
    if (!module || !wrapper) return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(module, wrapper);
}

static CUresult module_from_wrapper_ext1(CUmodule *module, const void *wrapper, void *a3,
                                         void *a4, unsigned a5) {
    static int once;
    if (a3 || a4 || a5) return hv_unsupported("the runtime's module load with options", &once);
    return module_from_wrapper(module, wrapper);
}

static CUresult module_from_fatbin_ext2(const void *fatbin, CUmodule *module, void *a3, void *a4,
                                        unsigned a5) {
    static int once;
    if (a3 || a4 || a5) return hv_unsupported("the runtime's module load with options", &once);
    return module_from_wrapper(module, fatbin);
}

static CUresult primary_context(CUcontext *pctx, CUdevice dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    int n = 0;
    CUresult r = cuDeviceGetCount(&n);
    if (r) return r;
    if (dev < 0 || dev >= n) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = hv_primary(dev); /* without retaining it, as the runtime expects */
    return CUDA_SUCCESS;
}

static void runtime_notice(size_t arg) { (void)arg; }

static CUresult load_compilers(void) { return CUDA_SUCCESS; } /* the host's driver compiles */

static fnptr cudart_interface[13] = {
    SLOTS(13), (fnptr)module_from_wrapper, (fnptr)primary_context, NULL, NULL, NULL,
    (fnptr)module_from_wrapper_ext1, (fnptr)runtime_notice, (fnptr)module_from_fatbin_ext2,
    NULL, NULL, NULL, (fnptr)load_compilers,
};

/* -- tools hooks: buffers the runtime writes its callback state into ----------- */

static uint32_t hooks_buffer1[1024], hooks_buffer2[14];

static void hooks_buffer_1(void **ptr, size_t *size) {
    *ptr = hooks_buffer1;
    *size = sizeof hooks_buffer1 / sizeof *hooks_buffer1;
}

static void hooks_buffer_2(void **ptr, size_t *size) {
    *ptr = hooks_buffer2;
    *size = sizeof hooks_buffer2 / sizeof *hooks_buffer2;
}

static fnptr tools_hooks[7] = { SLOTS(7), NULL, (fnptr)hooks_buffer_1, NULL, NULL, NULL,
                                (fnptr)hooks_buffer_2 };

/* cuBLASLt asks slot 2 for the calling thread's context (its per-context cache key). */
static CUresult tls_current_context(CUcontext *ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = hv_current();
    return CUDA_SUCCESS;
}

static fnptr tools_tls[4] = { SLOTS(4), NULL, (fnptr)tls_current_context, NULL };

/* -- the context table: what a context is, for libraries that cache per context --
 * Slot 4 gives a context's number, slots 39 and 51 streams' identities; the other
 * slots were not seen called: they say so once and return CUDA_ERROR_NOT_SUPPORTED. */

/* Slots 51 and 39, as cuBLAS uses them to key its per-stream state: a stream
   handle made concrete (the default stream stands as CU_STREAM_LEGACY), then
   that stream's identity. */
static CUresult context_stream(CUcontext ctx, CUstream stream, CUstream *out) {
    (void)ctx;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)stream == UINTPTR_MAX) return CUDA_ERROR_INVALID_HANDLE;
    *out = stream ? stream : (CUstream)(uintptr_t)1;
    return CUDA_SUCCESS;
}

static CUresult context_stream_id(CUcontext ctx, CUstream stream, unsigned long long *id) {
    (void)ctx;
    if (!id || !stream) return CUDA_ERROR_INVALID_VALUE;
    *id = (unsigned long long)(uintptr_t)stream;
    return CUDA_SUCCESS;
}

static CUresult context_number(CUcontext ctx, unsigned long long *number) {
    if (!number) return CUDA_ERROR_INVALID_VALUE;
    *number = ctx ? (unsigned long long)ctx->device + 1 : 0;
    return CUDA_SUCCESS;
}

#define CONTEXT_SLOTS 95
#define SLOT_FN(n)                                                                    \
    static CUresult context_slot_##n(void) {                                          \
        static int once;                                                              \
        return hv_unsupported("slot " #n " of the driver's private context table",   \
                              &once);                                                 \
    }
#define TEN(t) SLOT_FN(t##0) SLOT_FN(t##1) SLOT_FN(t##2) SLOT_FN(t##3) SLOT_FN(t##4) \
               SLOT_FN(t##5) SLOT_FN(t##6) SLOT_FN(t##7) SLOT_FN(t##8) SLOT_FN(t##9)
SLOT_FN(1) SLOT_FN(2) SLOT_FN(3) SLOT_FN(5) SLOT_FN(6) SLOT_FN(7) SLOT_FN(8) SLOT_FN(9)
TEN(1) TEN(2)
SLOT_FN(30) SLOT_FN(31) SLOT_FN(32) SLOT_FN(33) SLOT_FN(34) SLOT_FN(35) SLOT_FN(36) SLOT_FN(37)
SLOT_FN(38)
TEN(4)
SLOT_FN(50) SLOT_FN(52) SLOT_FN(53) SLOT_FN(54) SLOT_FN(55) SLOT_FN(56) SLOT_FN(57) SLOT_FN(58)
SLOT_FN(59)
TEN(6) TEN(7) TEN(8)
SLOT_FN(90) SLOT_FN(91) SLOT_FN(92) SLOT_FN(93) SLOT_FN(94)
#define S(n) (fnptr)context_slot_##n
#define STEN(t) S(t##0), S(t##1), S(t##2), S(t##3), S(t##4), S(t##5), S(t##6), S(t##7), \
                S(t##8), S(t##9)
static fnptr context_table[CONTEXT_SLOTS] = {
    SLOTS(CONTEXT_SLOTS), S(1), S(2), S(3), (fnptr)context_number, S(5), S(6), S(7), S(8), S(9),
    STEN(1), STEN(2),
    S(30), S(31), S(32), S(33), S(34), S(35), S(36), S(37), S(38), (fnptr)context_stream_id,
    STEN(4),
    S(50), (fnptr)context_stream, S(52), S(53), S(54), S(55), S(56), S(57), S(58), S(59),
    STEN(6), STEN(7), STEN(8),
    S(90), S(91), S(92), S(93), S(94),
};

/* -- the tools' module table: a module's functions without their names ----------
 * cuFFT loads each of its kernels as a module of one function and has slot 7 hand
 * it that function: slot 7(context, module, callback, opaque) calls
 * callback(opaque, function, owner) for each function of the module and returns how
 * many it handed out (cuFFT wants exactly 1). The other slots were not seen called:
 * they say so once and return CUDA_ERROR_NOT_SUPPORTED. */

long hv_module_each_function(CUmodule module, void (*fn)(void *, CUfunction, uint64_t),
                             void *opaque, CUresult *r); /* module.c */

static long module_functions(CUcontext ctx, CUmodule module,
                             void (*fn)(void *, CUfunction, uint64_t), void *opaque) {
    static int once;
    (void)ctx; /* a module belongs to one vGPU: its handle says which */
    if (!fn) return 0;
    CUresult r;
    long n = hv_module_each_function(module, fn, opaque, &r);
    if (n < 0 || r) {
        if (!__atomic_exchange_n(&once, 1, __ATOMIC_RELAXED))
            hv_log("the tools' module table could not list module %p's functions: %d",
                   module, r);
        return n < 0 ? 0 : n;
    }
    return n;
}

#define MODULE_SLOTS 64
#define MSLOT_FN(n)                                                                   \
    static CUresult module_slot_##n(void) {                                           \
        static int once;                                                              \
        return hv_unsupported("slot " #n " of the driver's private module table",    \
                              &once);                                                 \
    }
#define MTEN(t) MSLOT_FN(t##0) MSLOT_FN(t##1) MSLOT_FN(t##2) MSLOT_FN(t##3) MSLOT_FN(t##4) \
                MSLOT_FN(t##5) MSLOT_FN(t##6) MSLOT_FN(t##7) MSLOT_FN(t##8) MSLOT_FN(t##9)
MSLOT_FN(1) MSLOT_FN(2) MSLOT_FN(3) MSLOT_FN(4) MSLOT_FN(5) MSLOT_FN(6) MSLOT_FN(8)
MSLOT_FN(9)
MTEN(1) MTEN(2) MTEN(3) MTEN(4) MTEN(5)
MSLOT_FN(60) MSLOT_FN(61) MSLOT_FN(62) MSLOT_FN(63)
#define M(n) (fnptr)module_slot_##n
#define MSTEN(t) M(t##0), M(t##1), M(t##2), M(t##3), M(t##4), M(t##5), M(t##6), M(t##7), \
                 M(t##8), M(t##9)
static fnptr module_table[MODULE_SLOTS] = {
    SLOTS(MODULE_SLOTS), M(1), M(2), M(3), M(4), M(5), M(6), (fnptr)module_functions, M(8),
    M(9), MSTEN(1), MSTEN(2), MSTEN(3), MSTEN(4), MSTEN(5),
    M(60), M(61), M(62), M(63),
};

/* -- context-local storage: the runtime's per-context state -------------------- */

typedef void (*cls_dtor)(CUcontext, void *, void *);
static struct { CUcontext ctx; void *key, *value; cls_dtor dtor; } cls[256];
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

/* NULL is the calling thread's current context, and a thread with none has no storage:
   the runtime reads that as "this thread's context is not set up yet" and makes the
   primary context current on it, as the driver would have it (answering with the
   primary's storage left new threads without a current context, which cuBLAS then
   finds missing: PyTorch's autograd threads warned so). */
static CUcontext ctx_or_current(CUcontext ctx) {
    return ctx ? ctx : hv_current();
}

static CUresult cls_put(CUcontext ctx, void *key, void *value, cls_dtor dtor) {
    ctx = ctx_or_current(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&cls_lock);
    int free_slot = -1;
    for (int i = 0; i < 256; i++) {
        if (cls[i].key == key && cls[i].ctx == ctx) { free_slot = i; break; }
        if (!cls[i].key && free_slot < 0) free_slot = i;
    }
    if (free_slot >= 0) {
        cls[free_slot].ctx = ctx;
        cls[free_slot].key = key;
        cls[free_slot].value = value;
        cls[free_slot].dtor = dtor;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&cls_lock);
    return r;
}

static CUresult cls_delete(CUcontext ctx, void *key) {
    ctx = ctx_or_current(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    for (int i = 0; i < 256; i++)
        if (cls[i].key == key && cls[i].ctx == ctx) cls[i].key = NULL;
    pthread_mutex_unlock(&cls_lock);
    return CUDA_SUCCESS;
}

static CUresult cls_get(void **value, CUcontext ctx, void *key) {
    ctx = ctx_or_current(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&cls_lock);
    for (int i = 0; i < 256; i++) {
        if (cls[i].key == key && cls[i].ctx == ctx) {
            *value = cls[i].value;
            r = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&cls_lock);
    return r;
}

/* A reset context drops the runtime's state, through the runtime's own destructors. */
void hv_cls_reset(CUcontext ctx) {
    for (;;) {
        cls_dtor dtor = NULL;
        void *key = NULL, *value = NULL;
        pthread_mutex_lock(&cls_lock);
        for (int i = 0; i < 256; i++) {
            if (cls[i].key && cls[i].ctx == ctx) {
                dtor = cls[i].dtor;
                key = cls[i].key;
                value = cls[i].value;
                cls[i].key = NULL;
                break;
            }
        }
        pthread_mutex_unlock(&cls_lock);
        if (!key) return;
        if (dtor) dtor(ctx, key, value);
    }
}

static fnptr context_storage[4] = { (fnptr)cls_put, (fnptr)cls_delete, (fnptr)cls_get, NULL };

/* -- context checks --------------------------------------------------------------- */

static CUresult context_check(CUcontext ctx, uint32_t *result, const void **unused) {
    (void)ctx; (void)unused;
    if (result) *result = 0;
    return CUDA_SUCCESS;
}

static uint32_t context_check_3(void) { return 0; }

static fnptr context_checks[4] = { SLOTS(4), NULL, (fnptr)context_check, (fnptr)context_check_3 };

/* -- the integrity check ------------------------------------------------------------
 * The runtime asks the driver for a keyed digest (HMAC over MD2, RFC 2104 and
 * RFC 1319) of the caller's view of the process: driver version, request
 * version, process and thread, where these tables are, a time stamp, and
 * every device's UUID and PCI location. It compares the answer with its own,
 * so every value must be the one this shim reports through the API.
 */

static const unsigned char MD2_S[256] = { /* RFC 1319's permutation of 0..255, from pi */
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19,
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202,
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122,
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33,
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198,
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241,
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15,
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38,
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82,
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57,
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10,
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
};

struct md2 {
    unsigned char x[48], checksum[16], block[16];
    unsigned count;
};

static void md2_init(struct md2 *m) { memset(m, 0, sizeof *m); }

static void md2_compress(struct md2 *m) {
    for (int i = 0; i < 16; i++) {
        m->x[16 + i] = m->block[i];
        m->x[32 + i] = m->x[i] ^ m->block[i];
    }
    unsigned char l = m->checksum[15];
    for (int i = 0; i < 16; i++) l = m->checksum[i] ^= MD2_S[m->block[i] ^ l];
    unsigned t = 0;
    for (int j = 0; j < 18; j++) {
        for (int k = 0; k < 48; k++) t = m->x[k] ^= MD2_S[t];
        t = (t + (unsigned)j) & 0xff;
    }
}

static void md2_update(struct md2 *m, const void *data, size_t n) {
    const unsigned char *p = data;
    while (n--) {
        m->block[m->count++] = *p++;
        if (m->count == 16) {
            md2_compress(m);
            m->count = 0;
        }
    }
}

static void md2_final(struct md2 *m, unsigned char out[16]) {
    unsigned char pad[16];
    unsigned n = 16 - m->count;
    memset(pad, (int)n, n);
    md2_update(m, pad, n);
    unsigned char sum[16];
    memcpy(sum, m->checksum, 16);
    md2_update(m, sum, 16);
    memcpy(out, m->x, 16);
}

/* Exposed for the shim's tests: RFC 1319's own test vectors check it. */
HV_EXPORT void hvgpu_shim_md2(const void *data, size_t n, unsigned char out[16]) {
    struct md2 m;
    md2_init(&m);
    md2_update(&m, data, n);
    md2_final(&m, out);
}

static const unsigned char INTEGRITY_KEY[16] = {
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
};

static fnptr integrity_table[3];

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t result[2]) {
    if (!result) return CUDA_ERROR_INVALID_VALUE;
    if (version % 10 < 2) { /* the first two request kinds have fixed answers */
        result[0] = version % 10 ? 0x1841181C03CB675Cull : 0x3341181C03CB675Cull;
        result[1] = 0x8ED383AA1F4CD1E8ull;
        return CUDA_SUCCESS;
    }
    int count = 0;
    CUresult r = cuDeviceGetCount(&count);
    if (r) return r;
    struct __attribute__((packed)) {
        uint32_t driver_version, version, process, thread;
        const void *cudart_table, *integrity_table, *check_fn;
        uint64_t unix_seconds;
    } msg = { (uint32_t)hv_driver_version(), version, (uint32_t)getpid(),
              (uint32_t)(uintptr_t)pthread_self(), cudart_interface, integrity_table,
              (const void *)integrity_table[1], unix_seconds };
    unsigned char pad[16], inner[16];
    struct md2 m;
    md2_init(&m);
    for (int i = 0; i < 16; i++) pad[i] = INTEGRITY_KEY[i] ^ 0x36;
    md2_update(&m, pad, 16);
    md2_update(&m, &msg, sizeof msg);
    for (int d = 0; d < count; d++) {
        struct __attribute__((packed)) { unsigned char uuid[16]; int32_t domain, bus, device; } dev;
        memcpy(dev.uuid, hv_uuids[d], 16);
        dev.domain = hv_attrs[d][50];
        dev.bus = hv_attrs[d][33];
        dev.device = hv_attrs[d][34];
        md2_update(&m, &dev, sizeof dev);
    }
    md2_final(&m, inner);
    md2_init(&m);
    for (int i = 0; i < 16; i++) pad[i] = INTEGRITY_KEY[i] ^ 0x5c;
    md2_update(&m, pad, 16);
    md2_update(&m, inner, 16);
    md2_final(&m, (unsigned char *)result);
    return CUDA_SUCCESS;
}

static fnptr integrity_table[3] = { SLOTS(3), (fnptr)integrity_check, NULL };

/* -- clusters: thread-block cluster settings of functions ---------------------------
 * cuBLASLt's matmul heuristics ask for this table on GPUs with thread-block clusters
 * (sm90) and call into it without checking that the driver gave one (a NULL table
 * crashed them at slot 4). Its slots get and set a function's cluster settings and
 * answer cluster occupancy, all of which the documented driver API also carries
 * (function attributes 10-15, cuOccupancyMaxPotentialClusterSize/MaxActiveClusters,
 * device attribute 120), so each slot here is that documented call, forwarded like
 * any other. The slots that describe the GPU's internal layout (which GPC each TPC
 * sits in), override driver limits or report features the shim does not carry say
 * so and give nothing: no slot hands back memory or state the shim does not own. */

enum {
    FUNC_CLUSTER_SIZE_MUST_BE_SET = 10,
    FUNC_REQUIRED_CLUSTER_WIDTH = 11, /* HEIGHT 12, DEPTH 13 */
    FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14,
    FUNC_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 15,
    DEVICE_CLUSTER_LAUNCH = 120,
    LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
};

CUresult cuFuncGetAttribute(int *value, int attrib, CUfunction f);
CUresult cuFuncSetAttribute(CUfunction f, int attrib, int value);

typedef struct { int id; char pad[4]; char value[64]; } cluster_launch_attribute;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    CUstream stream;
    cluster_launch_attribute *attrs;
    unsigned nattrs;
} cluster_launch_config; /* CUlaunchConfig, as cuOccupancy*Cluster* take it */
CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f, const cluster_launch_config *c);
CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                            const cluster_launch_config *c);

static CUresult cluster_set_dim(CUfunction f, int x, int y, int z) {
    CUresult r = cuFuncSetAttribute(f, FUNC_REQUIRED_CLUSTER_WIDTH, x);
    if (!r) r = cuFuncSetAttribute(f, FUNC_REQUIRED_CLUSTER_WIDTH + 1, y);
    return r ? r : cuFuncSetAttribute(f, FUNC_REQUIRED_CLUSTER_WIDTH + 2, z);
}

static CUresult cluster_set_policy(CUfunction f, int policy) {
    return cuFuncSetAttribute(f, FUNC_CLUSTER_SCHEDULING_POLICY_PREFERENCE, policy);
}

static CUresult cluster_set_non_portable(CUfunction f, int enable) {
    return cuFuncSetAttribute(f, FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, enable);
}

static CUresult cluster_gpc_layout(unsigned char **vgpc, unsigned char **mtpc) {
    static int once;
    if (vgpc) *vgpc = NULL;
    if (mtpc) *mtpc = NULL;
    return hv_unsupported("the GPU's TPC-to-GPC layout (cluster table slot 4)", &once);
}

static CUresult cluster_get_dim(CUfunction f, int *x, int *y, int *z) {
    if (!x || !y || !z) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuFuncGetAttribute(x, FUNC_REQUIRED_CLUSTER_WIDTH, f);
    if (!r) r = cuFuncGetAttribute(y, FUNC_REQUIRED_CLUSTER_WIDTH + 1, f);
    return r ? r : cuFuncGetAttribute(z, FUNC_REQUIRED_CLUSTER_WIDTH + 2, f);
}

static CUresult cluster_get_policy(CUfunction f, int *policy) {
    return cuFuncGetAttribute(policy, FUNC_CLUSTER_SCHEDULING_POLICY_PREFERENCE, f);
}

static CUresult cluster_get_non_portable(CUfunction f, int *enable) {
    return cuFuncGetAttribute(enable, FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, f);
}

static CUresult cluster_launch_supported(CUdevice dev, int *supported) {
    return cuDeviceGetAttribute(supported, DEVICE_CLUSTER_LAUNCH, dev);
}

static CUresult cluster_max_size(CUfunction f, int block, size_t smem, int *size) {
    if (!size || block <= 0 || smem > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
    cluster_launch_config c = { 1, 1, 1, (unsigned)block, 1, 1, (unsigned)smem, NULL, NULL, 0 };
    return cuOccupancyMaxPotentialClusterSize(size, f, &c);
}

static CUresult cluster_max_active(CUfunction f, int block, size_t smem, int cluster, int *n) {
    if (!n || block <= 0 || cluster <= 0 || smem > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
    cluster_launch_attribute a = { LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, { 0 }, { 0 } };
    unsigned dims[3] = { (unsigned)cluster, 1, 1 };
    memcpy(a.value, dims, sizeof dims);
    cluster_launch_config c = { (unsigned)cluster, 1, 1, (unsigned)block, 1, 1, (unsigned)smem,
                                NULL, &a, 1 };
    return cuOccupancyMaxActiveClusters(n, f, &c);
}

/* Returns the limit, not a status: the one it keeps, since the shim overrides nothing. */
static uint32_t cluster_override_max(int device, uint32_t size) {
    static int once;
    (void)size;
    hv_unsupported("overriding the GPU's cluster size limit (cluster table slot 11)", &once);
    int clusters = 0;
    (void)cuDeviceGetAttribute(&clusters, DEVICE_CLUSTER_LAUNCH, device);
    return clusters ? 8 : 0; /* the portable cluster size, the one CUDA guarantees */
}

static CUresult cluster_get_must_be_set(CUfunction f, int *must) {
    return cuFuncGetAttribute(must, FUNC_CLUSTER_SIZE_MUST_BE_SET, f);
}

static CUresult cluster_free_layout(unsigned char *vgpc, unsigned char *mtpc) {
    (void)vgpc; (void)mtpc; /* slot 4 never hands any out */
    return CUDA_SUCCESS;
}

/* Features the shim does not carry: "not supported" is their honest answer. */
static CUresult cluster_feature_absent(int *supported) {
    if (!supported) return CUDA_ERROR_INVALID_VALUE;
    *supported = 0;
    return CUDA_SUCCESS;
}

static CUresult cluster_singleton_base(CUdevice dev, unsigned char *base) {
    static int once;
    (void)dev; (void)base;
    return hv_unsupported("the GPU's singleton GPC base (cluster table slot 15)", &once);
}

static CUresult cluster_preferred_absent(CUdevice dev, int *supported) {
    (void)dev;
    return cluster_feature_absent(supported);
}

static fnptr cluster_table[17] = {
    SLOTS(17), (fnptr)cluster_set_dim, (fnptr)cluster_set_policy,
    (fnptr)cluster_set_non_portable, (fnptr)cluster_gpc_layout, (fnptr)cluster_get_dim,
    (fnptr)cluster_get_policy, (fnptr)cluster_get_non_portable, (fnptr)cluster_launch_supported,
    (fnptr)cluster_max_size, (fnptr)cluster_max_active, (fnptr)cluster_override_max,
    (fnptr)cluster_get_must_be_set, (fnptr)cluster_free_layout, (fnptr)cluster_feature_absent,
    (fnptr)cluster_singleton_base, (fnptr)cluster_preferred_absent,
};

/* -- the lookup ------------------------------------------------------------------ */

static const struct { unsigned char id[16]; const void *table; const char *name; } TABLES[] = {
    { { 0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9 },
      cudart_interface, "runtime interface" },
    { { 0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66 },
      tools_hooks, "tools runtime hooks" },
    { { 0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc },
      tools_tls, "tools thread-local storage" },
    { { 0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93 },
      context_storage, "context-local storage" },
    { { 0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e },
      context_checks, "context checks" },
    { { 0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2 },
      context_table, "context table" },
    { { 0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2 },
      integrity_table, "integrity check" },
    { { 0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca },
      cluster_table, "clusters" },
    { { 0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e },
      module_table, "tools module" },
};

HV_EXPORT CUresult cuGetExportTable(const void **table, const unsigned char *id) {
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof TABLES / sizeof *TABLES; i++) {
        if (!memcmp(TABLES[i].id, id, 16)) {
            *table = TABLES[i].table;
            if (hv_trace_enabled()) hv_log("cuGetExportTable: %s", TABLES[i].name);
            return CUDA_SUCCESS;
        }
    }
    if (hv_trace_enabled())
        hv_log("cuGetExportTable: no table %02x%02x%02x%02x-...", id[0], id[1], id[2], id[3]);
    *table = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
