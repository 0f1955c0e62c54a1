/* What a training step asks the driver, through the shim against the GPU test double.
 *
 *   step_cache steps N   N steps shaped like a framework's: the same attribute and
 *                        cache preference set again, many attribute and
 *                        occupancy queries on a few kernels, launches, an event
 *                        and a stream wait, a memset, then the step's one
 *                        synchronisation
 *   step_cache semantics what a set attribute changes, and when its error shows
 *   step_cache vgpus     a library kernel's attributes on each of two vGPUs
 *   step_cache threads   threads asking about the same kernels at once
 *
 * Prints what it saw; exits 1 at the first call that did not do what CUDA says.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long CUdeviceptr;
int cuInit(unsigned flags);
int cuDeviceGetCount(int *count);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLibraryLoadData(void **lib, const void *code, void *jo, void **jv, unsigned njo, void *lo,
                      void **lv, unsigned nlo);
int cuLibraryGetKernel(void **kernel, void *lib, const char *name);
int cuKernelGetAttribute(int *value, int attrib, void *kernel, int dev);
int cuKernelSetAttribute(int attrib, int value, void *kernel, int dev);
int cuKernelGetFunction(void **fn, void *kernel);
int cuKernelGetParamInfo(void *kernel, size_t index, size_t *offset, size_t *size);
int cuFuncGetAttribute(int *value, int attrib, void *fn);
int cuFuncSetAttribute(void *fn, int attrib, int value);
int cuFuncSetCacheConfig(void *fn, int config);
int cuFuncGetParamInfo(void *fn, size_t index, size_t *offset, size_t *size);
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *fn, int block, size_t smem);
int cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, void *fn, int block,
                                                         size_t smem, unsigned flags);
int cuOccupancyAvailableDynamicSMemPerBlock(size_t *bytes, void *fn, int blocks, int block);
int cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block, void *fn, size_t (*smem)(int),
                                     size_t dynamic, int limit);
int cuMemAlloc_v2(CUdeviceptr *p, size_t n);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *stream);
int cuStreamCreate(void **stream, unsigned flags);
int cuStreamWaitEvent(void *stream, void *event, unsigned flags);
int cuEventCreate(void **event, unsigned flags);
int cuEventRecord(void *event, void *stream);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);
typedef struct { int id; char pad[4]; char value[64]; } launch_attribute; /* CUlaunchAttribute */
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, smem;
    void *stream;
    launch_attribute *attrs;
    unsigned nattrs;
} launch_config; /* CUlaunchConfig */
int cuLaunchKernelEx(const launch_config *c, void *f, void **params, void **extra);

enum { MAX_THREADS = 0, SHARED_SIZE = 1, NUM_REGS = 4, MAX_DYNAMIC_SHARED = 8, CARVEOUT = 9,
       CLUSTER_WIDTH = 11, PREFER_SHARED = 1, LAUNCH_PRIORITY = 8, N = 1024 };

static const char ptx[] =
    ".version 8.0\n.target sm_90\n"
    ".visible .entry saxpy(\n)\n{\n ret;\n}\n"
    ".visible .entry matmul(\n)\n{\n ret;\n}\n"
    ".visible .entry noop(\n)\n{\n ret;\n}\n"
    ".visible .entry clustered(\n)\n{\n ret;\n}\n";

#define CHECK(call) do { int r_ = (call); if (r_) { \
    printf("%s: %d (line %d)\n", #call, r_, __LINE__); exit(1); } } while (0)
#define EXPECT(what, got, want) do { long long g_ = (got), w_ = (want); if (g_ != w_) { \
    printf("%s: %lld, expected %lld\n", what, g_, w_); exit(1); } } while (0)

static size_t smem_for(int block) { return (size_t)block * 4; }

static void *setup(void) {
    void *ctx, *module;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&module, ptx));
    return module;
}

static int steps(int count) {
    void *module = setup(), *fns[3], *stream, *event;
    const char *names[3] = { "saxpy", "matmul", "noop" };
    for (int i = 0; i < 3; i++) CHECK(cuModuleGetFunction(&fns[i], module, names[i]));
    CUdeviceptr x, y, scratch;
    static float hx[N], hy[N];
    for (int i = 0; i < N; i++) { hx[i] = (float)i; hy[i] = 1.0f; }
    CHECK(cuMemAlloc_v2(&x, sizeof hx));
    CHECK(cuMemAlloc_v2(&y, sizeof hy));
    CHECK(cuMemAlloc_v2(&scratch, sizeof hy));
    CHECK(cuMemcpyHtoD_v2(x, hx, sizeof hx));
    CHECK(cuMemcpyHtoD_v2(y, hy, sizeof hy));
    CHECK(cuStreamCreate(&stream, 0));
    CHECK(cuEventCreate(&event, 0));
    float a = 2.0f;
    int n = N;
    void *params[] = { &a, &x, &y, &n };
    launch_attribute priority = { LAUNCH_PRIORITY, {0}, {0} };
    launch_config noop_ex = { 1, 1, 1, 32, 1, 1, 0, stream, &priority, 1 };
    /* The shim's own count of round trips, as bench/frameworks.py reads it. */
    uint64_t (*round_trips)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "hvgpu_shim_round_trips");
    uint64_t after_first = 0;
    for (int step = 0; step < count; step++) {
        if (step == 1 && round_trips) after_first = round_trips();
        CHECK(cuFuncSetAttribute(fns[0], MAX_DYNAMIC_SHARED, 40000)); /* as frameworks do, each step */
        CHECK(cuFuncSetCacheConfig(fns[1], PREFER_SHARED));
        for (int i = 0; i < 3; i++) {
            int value, blocks, grid, block;
            size_t bytes, offset, size;
            for (int again = 0; again < 20; again++)
                for (int attrib = 0; attrib <= CARVEOUT; attrib++)
                    CHECK(cuFuncGetAttribute(&value, attrib, fns[i]));
            CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fns[i], 128, 0));
            CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fns[i], 256, 1024));
            CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, fns[i], 256, 0, 1));
            CHECK(cuOccupancyAvailableDynamicSMemPerBlock(&bytes, fns[i], 2, 128));
            CHECK(cuOccupancyMaxPotentialBlockSize(&grid, &block, fns[i], smem_for, 0, 0));
            if (i == 0) CHECK(cuFuncGetParamInfo(fns[i], 1, &offset, &size));
        }
        CHECK(cuLaunchKernel(fns[0], N / 256, 1, 1, 256, 1, 1, 0, stream, params, NULL));
        CHECK(cuLaunchKernel(fns[2], 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        CHECK(cuLaunchKernelEx(&noop_ex, fns[2], NULL, NULL));
        CHECK(cuEventRecord(event, stream));
        CHECK(cuStreamWaitEvent(NULL, event, 0));
        CHECK(cuMemsetD32Async(scratch, 7, N, stream));
        CHECK(cuCtxSynchronize()); /* the step's own synchronisation (a loss.item()) */
    }
    if (round_trips && count > 1)
        printf("round trips after the first step: %llu\n",
               (unsigned long long)(round_trips() - after_first));
    CHECK(cuMemcpyDtoH_v2(hy, y, sizeof hy));
    float want = 1.0f;
    for (int step = 0; step < count; step++) want += a * (float)(N - 1);
    EXPECT("y[last]", (long long)hy[N - 1], (long long)want);
    printf("steps=%d ok\n", count);
    return 0;
}

static int semantics(void) {
    void *module = setup(), *saxpy, *matmul, *clustered;
    CHECK(cuModuleGetFunction(&saxpy, module, "saxpy"));
    CHECK(cuModuleGetFunction(&matmul, module, "matmul"));
    CHECK(cuModuleGetFunction(&clustered, module, "clustered"));
    int value, blocks;
    /* Each function has its own answers. */
    CHECK(cuFuncGetAttribute(&value, NUM_REGS, saxpy));
    EXPECT("saxpy registers", value, 32);
    CHECK(cuFuncGetAttribute(&value, NUM_REGS, matmul));
    EXPECT("matmul registers", value, 64);
    CHECK(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, saxpy));
    EXPECT("saxpy dynamic shared memory before a set", value, 49152);
    /* A set reads back as set, on that function only. */
    CHECK(cuFuncSetAttribute(saxpy, MAX_DYNAMIC_SHARED, 20000));
    CHECK(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, saxpy));
    EXPECT("saxpy dynamic shared memory after a set", value, 20000);
    CHECK(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, matmul));
    EXPECT("matmul dynamic shared memory", value, 49152 - 8192);
    /* What CUDA refuses at once: a read-only attribute, more than the device allows. */
    EXPECT("set of a read-only attribute", cuFuncSetAttribute(saxpy, MAX_THREADS, 64), 1);
    EXPECT("set past the opt-in limit", cuFuncSetAttribute(matmul, MAX_DYNAMIC_SHARED, 49152), 1);
    EXPECT("an unknown cache preference", cuFuncSetCacheConfig(saxpy, 7), 1);
    /* A set changes the function's occupancy: its kept answers are asked for again. */
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, saxpy, 128, 16384));
    printf("blocks before=%d", blocks);
    CHECK(cuFuncSetAttribute(saxpy, CARVEOUT, 50));
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, saxpy, 128, 16384));
    printf(" after carveout=%d", blocks);
    CHECK(cuFuncSetCacheConfig(saxpy, PREFER_SHARED));
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, saxpy, 128, 16384));
    printf(" after cache config=%d\n", blocks);
    /* The agent's refusal of a one-way set surfaces at the next synchronising call;
       what the guest assumed of it is then asked for again. */
    CHECK(cuFuncSetAttribute(saxpy, CARVEOUT, 150)); /* one-way: no error yet */
    CHECK(cuFuncGetAttribute(&value, CARVEOUT, saxpy));
    EXPECT("carveout as the guest assumes it", value, 150);
    printf("next sync: %d", cuCtxSynchronize());
    printf(", the one after: %d\n", cuCtxSynchronize()); /* reported once */
    CHECK(cuFuncGetAttribute(&value, CARVEOUT, saxpy));
    EXPECT("carveout after the refusal", value, 50);
    CHECK(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, saxpy));
    EXPECT("saxpy dynamic shared memory, asked again", value, 20000);
    /* A cluster attribute is asked for again after its set: its refusal shows there. */
    CHECK(cuFuncGetAttribute(&value, CLUSTER_WIDTH, clustered));
    EXPECT("compiled cluster width", value, 2);
    CHECK(cuFuncSetAttribute(clustered, CLUSTER_WIDTH, 4)); /* one-way: no error yet */
    printf("next get: %d", cuFuncGetAttribute(&value, CLUSTER_WIDTH, clustered));
    CHECK(cuFuncGetAttribute(&value, CLUSTER_WIDTH, clustered));
    printf(", then cluster width=%d\n", value);
    printf("semantics ok\n");
    return 0;
}

static int vgpus(void) {
    void *ctx, *lib, *kernel, *again;
    int count, value;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    EXPECT("devices", count, 2);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, "saxpy"));
    CHECK(cuLibraryGetKernel(&again, lib, "saxpy"));
    EXPECT("one handle per kernel name", again == kernel, 1);
    CHECK(cuKernelSetAttribute(MAX_DYNAMIC_SHARED, 30000, kernel, 0));
    for (int i = 0; i < 10; i++) {
        CHECK(cuKernelGetAttribute(&value, MAX_DYNAMIC_SHARED, kernel, 0));
        EXPECT("set on device 0, read there", value, 30000);
        CHECK(cuKernelGetAttribute(&value, MAX_DYNAMIC_SHARED, kernel, 1));
        EXPECT("not set on device 1", value, 49152);
    }
    CHECK(cuKernelSetAttribute(MAX_DYNAMIC_SHARED, 1000, kernel, 1));
    CHECK(cuKernelGetAttribute(&value, MAX_DYNAMIC_SHARED, kernel, 1));
    EXPECT("set on device 1, read there", value, 1000);
    CHECK(cuKernelGetAttribute(&value, MAX_DYNAMIC_SHARED, kernel, 0));
    EXPECT("device 0 kept its own", value, 30000);
    void *fn;
    size_t offset, size;
    CHECK(cuKernelGetFunction(&fn, kernel));
    CHECK(cuFuncGetAttribute(&value, MAX_DYNAMIC_SHARED, fn)); /* the current context's: 0 */
    EXPECT("through cuKernelGetFunction", value, 30000);
    for (int i = 0; i < 3; i++) {
        CHECK(cuKernelGetParamInfo(kernel, 1, &offset, &size));
        CHECK(cuKernelGetParamInfo(again, 2, &offset, &size));
    }
    EXPECT("saxpy's third parameter", (long long)(offset * 100 + size), 1608);
    printf("vgpus ok\n");
    return 0;
}

enum { THREADS = 8, ROUNDS = 200 };
static void *thread_fns[3];

static void *ask(void *arg) {
    long wrong = 0, id = (long)arg;
    for (int round = 0; round < ROUNDS; round++) {
        void *f = thread_fns[(id + round) % 3];
        int regs, blocks, block = 32 * (1 + (round + (int)id) % 32);
        if (cuFuncGetAttribute(&regs, NUM_REGS, f) ||
            cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, block, 0))
            return (void *)-1L;
        int want_regs = f == thread_fns[1] ? 8 : 32; /* the double's noop: 8 */
        wrong += regs != want_regs || blocks != 2048 / block;
    }
    return (void *)wrong;
}

static int threads(void) {
    void *module = setup();
    const char *names[3] = { "saxpy", "noop", "clustered" }; /* no static shared memory */
    for (int i = 0; i < 3; i++) CHECK(cuModuleGetFunction(&thread_fns[i], module, names[i]));
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, ask, (void *)i);
    long wrong = 0;
    for (int i = 0; i < THREADS; i++) {
        void *got;
        pthread_join(t[i], &got);
        wrong += (long)got;
    }
    printf("threads=%d rounds=%d wrong=%ld\n", THREADS, ROUNDS, wrong);
    return wrong != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "steps")) return steps(atoi(argv[2]));
    if (argc == 2 && !strcmp(argv[1], "semantics")) return semantics();
    if (argc == 2 && !strcmp(argv[1], "vgpus")) return vgpus();
    if (argc == 2 && !strcmp(argv[1], "threads")) return threads();
    fprintf(stderr, "usage: step_cache steps N | semantics | vgpus | threads\n");
    return 2;
}
