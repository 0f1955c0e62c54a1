/* Stream-ordered allocation as a framework's training step does it: every tensor
 * allocated with cuMemAllocAsync and freed with cuMemFreeAsync, each step the same
 * sizes, the pools keeping what is freed (PyTorch's backend:cudaMallocAsync sets the
 * release threshold to UINT64_MAX).
 *
 *   pool_reuse steps N [default]  N steps of allocations, copies, saxpy launches,
 *                                 one read back (the step's own round trip) and
 *                                 frees, with the threshold at UINT64_MAX, or left
 *                                 at its default, 0
 *   pool_reuse semantics          what a freed block kept for reuse may and may not be
 *   pool_reuse oom                fills a slice, frees it all, then allocates on
 *                                 another stream (through the shim only)
 *   pool_reuse threads            threads allocating and freeing on their own streams
 *   pool_reuse destroyed          a kept block after its pool is destroyed (through
 *                                 the shim only)
 *   pool_reuse fork               a forked child allocates from pools of its own
 *                                 (through the shim only: CUDA is not usable in a
 *                                 child of a process that initialised it)
 *
 * It runs natively too. Through the shim it also checks what it can count: the
 * shim's round trips (hvgpu_shim_round_trips) and the bytes it keeps
 * (hvgpu_shim_pool_kept). Prints what it saw; exits 1 at the first call that did not
 * do what it should.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef unsigned long long CUdeviceptr;
typedef struct {                                             /* CUmemPoolProps */
    int alloc_type, handle_types;
    struct { int type, id; } location;
    void *win32;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} pool_props;

int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);
int cuStreamCreate(void **stream, unsigned flags);
int cuStreamDestroy_v2(void *stream);
int cuStreamSynchronize(void *stream);
int cuMemAllocAsync(CUdeviceptr *p, size_t n, void *stream);
int cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *stream);
int cuMemFreeAsync(CUdeviceptr p, void *stream);
int cuDeviceGetDefaultMemPool(void **pool, int dev);
int cuMemPoolCreate(void **pool, const pool_props *props);
int cuMemPoolDestroy(void *pool);
int cuMemPoolSetAttribute(void *pool, int attr, void *value);
int cuMemPoolGetAttribute(void *pool, int attr, void *value);
int cuMemPoolTrimTo(void *pool, size_t keep);
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream);
int cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *stream);
int cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
int cuMemGetInfo_v2(size_t *free_bytes, size_t *total);

enum { INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_FOUND = 500, THRESHOLD = 4, RESERVED = 5,
       USED = 7, USED_HIGH = 8, PINNED = 1, ON_DEVICE = 1 };

/* saxpy(a, x, y, n): y = a * x + y; the test double runs its own kernel of that name. */
static const char ptx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u32 n)\n"
    "{\n"
    " .reg .pred %p<2>;\n .reg .f32 %f<5>;\n .reg .b32 %r<6>;\n .reg .b64 %rd<8>;\n"
    " ld.param.f32 %f1, [a];\n ld.param.u64 %rd1, [x];\n ld.param.u64 %rd2, [y];\n"
    " ld.param.u32 %r1, [n];\n"
    " mov.u32 %r2, %ctaid.x;\n mov.u32 %r3, %ntid.x;\n mov.u32 %r4, %tid.x;\n"
    " mad.lo.s32 %r5, %r2, %r3, %r4;\n setp.ge.u32 %p1, %r5, %r1;\n @%p1 bra DONE;\n"
    " cvta.to.global.u64 %rd3, %rd1;\n cvta.to.global.u64 %rd4, %rd2;\n"
    " mul.wide.u32 %rd5, %r5, 4;\n add.s64 %rd6, %rd3, %rd5;\n add.s64 %rd7, %rd4, %rd5;\n"
    " ld.global.f32 %f2, [%rd6];\n ld.global.f32 %f3, [%rd7];\n"
    " fma.rn.f32 %f4, %f1, %f2, %f3;\n st.global.f32 [%rd7], %f4;\n"
    "DONE:\n ret;\n}\n";

#define CHECK(call) do { int r_ = (call); if (r_) { \
    printf("%s: %d (line %d)\n", #call, r_, __LINE__); exit(1); } } while (0)
#define EXPECT(what, got, want) do { long long g_ = (long long)(got), w_ = (long long)(want); \
    if (g_ != w_) { printf("%s: %lld, expected %lld (line %d)\n", what, g_, w_, __LINE__); \
    exit(1); } } while (0)
#define ASSERT(cond) do { if (!(cond)) { printf("expected %s (line %d)\n", #cond, __LINE__); \
    exit(1); } } while (0)

static uint64_t (*round_trips)(void); /* set through the shim only */
static uint64_t (*shim_kept)(void);
static void *ctx, *saxpy;
static const uint64_t KEEP_ALL = UINT64_MAX;

static uint64_t rt(void) { return round_trips ? round_trips() : 0; }

static void setup(void) {
    round_trips = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "hvgpu_shim_round_trips");
    shim_kept = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "hvgpu_shim_pool_kept");
    void *module;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&saxpy, module, "saxpy"));
}

static uint64_t attribute(void *pool, int attr) {
    uint64_t v = 0;
    CHECK(cuMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static void *new_pool(uint64_t threshold) {
    pool_props props;
    memset(&props, 0, sizeof props);
    props.alloc_type = PINNED;
    props.location.type = ON_DEVICE;
    void *pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, &threshold));
    return pool;
}

static void launch_saxpy(float a, CUdeviceptr x, CUdeviceptr y, unsigned n, void *stream) {
    void *params[] = { &a, &x, &y, &n };
    CHECK(cuLaunchKernel(saxpy, (n + 255) / 256, 1, 1, 256, 1, 1, 0, stream, params, NULL));
}

/* -- steps --------------------------------------------------------------------------- */

enum { K = 4, MAX_N = 20000 };
static const unsigned sizes[K] = { 1000, 3000, 7000, 20000 }; /* floats */
static float hx[MAX_N], hy[MAX_N];

static int steps(int count, int keep) {
    setup();
    void *pool, *s;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    if (keep) CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, (void *)&KEEP_ALL));
    CHECK(cuStreamCreate(&s, 0)); /* blocking: the read back on the legacy stream waits */
    for (int i = 0; i < MAX_N; i++) hx[i] = (float)(i % 1000);
    uint64_t after_first = 0;
    for (int step = 0; step < count; step++) {
        if (step == 1) after_first = rt();
        CUdeviceptr x[K], y[K];
        for (int k = 0; k < K; k++) {
            CHECK(cuMemAllocAsync(&x[k], sizes[k] * 4, s));
            CHECK(cuMemAllocAsync(&y[k], sizes[k] * 4, s));
        }
        for (int k = 0; k < K; k++) {
            CHECK(cuMemcpyHtoDAsync_v2(x[k], hx, sizes[k] * 4, s));
            CHECK(cuMemsetD32Async(y[k], 0x3f800000u /* 1.0f */, sizes[k], s));
            launch_saxpy(2.0f, x[k], y[k], sizes[k], s);
        }
        int k = step % K; /* the step's one read back, as a loss.item() */
        CHECK(cuMemcpyDtoH_v2(hy, y[k], sizes[k] * 4));
        for (unsigned i = 0; i < sizes[k]; i++)
            if (hy[i] != 2.0f * hx[i] + 1.0f) {
                printf("step %d: y[%u] = %g, expected %g\n", step, i, hy[i], 2.0f * hx[i] + 1.0f);
                return 1;
            }
        for (int k = 0; k < K; k++) {
            CHECK(cuMemFreeAsync(x[k], s));
            CHECK(cuMemFreeAsync(y[k], s));
        }
    }
    if (round_trips && count > 1)
        printf("round trips after the first step: %llu\n",
               (unsigned long long)(round_trips() - after_first));
    CHECK(cuStreamSynchronize(s));
    EXPECT("bytes in use after the steps", attribute(pool, USED), 0);
    printf("steps=%d ok\n", count);
    return 0;
}

/* -- semantics ----------------------------------------------------------------------- */

static int semantics(void) {
    setup();
    int shim = round_trips != NULL;
    void *pool, *s1, *s2, *s3;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, (void *)&KEEP_ALL));
    CHECK(cuStreamCreate(&s1, 0));
    CHECK(cuStreamCreate(&s2, 0));
    CUdeviceptr a, b, c, d, e, f;
    uint64_t before;

    /* Freed on a stream, taken back on it: no round trip; a size that rounds to the same
       512 bytes is served too. */
    CHECK(cuMemAllocAsync(&a, 3000, s1));
    CHECK(cuMemFreeAsync(a, s1));
    if (shim) EXPECT("bytes kept after a free", shim_kept(), 3072);
    before = rt();
    CHECK(cuMemAllocAsync(&b, 3000, s1));
    if (shim) {
        EXPECT("round trips of an allocation on the freeing stream", rt() - before, 0);
        ASSERT(b == a);
    }
    CHECK(cuMemFreeAsync(b, s1));
    before = rt();
    CHECK(cuMemAllocAsync(&c, 2900, s1));
    if (shim) {
        EXPECT("round trips of a size in the same 512 bytes", rt() - before, 0);
        ASSERT(c == a);
    }
    CHECK(cuMemFreeAsync(c, s1));
    printf("reused on the stream that freed it\n");

    /* Never on another stream. */
    before = rt();
    CHECK(cuMemAllocAsync(&d, 3000, s2));
    if (shim) {
        EXPECT("round trips of an allocation on another stream", rt() - before, 1);
        ASSERT(d != a);
    }
    before = rt();
    CHECK(cuMemAllocAsync(&e, 3000, s1));
    if (shim) {
        EXPECT("round trips back on the freeing stream", rt() - before, 0);
        ASSERT(e == a);
    }
    printf("not reused on another stream\n");

    /* What is written through a reused block reads back. */
    static unsigned pattern[750], back[750];
    for (int i = 0; i < 750; i++) pattern[i] = 0x9e3779b9u * (unsigned)i;
    CHECK(cuStreamSynchronize(s2)); /* d, allocated on s2, is used on s1 */
    CHECK(cuMemcpyHtoDAsync_v2(e, pattern, sizeof pattern, s1));
    CHECK(cuMemcpyDtoDAsync_v2(d, e, sizeof pattern, s1));
    CHECK(cuStreamSynchronize(s1));
    CHECK(cuMemcpyDtoH_v2(back, d, sizeof back));
    ASSERT(!memcmp(back, pattern, sizeof back));
    printf("data through a reused block reads back\n");

    /* In use: what the program holds, not what is kept. */
    if (shim) {
        EXPECT("bytes in use", attribute(pool, USED), 2 * 3072);
        EXPECT("most bytes in use", attribute(pool, USED_HIGH), 2 * 3072);
    } else {
        ASSERT(attribute(pool, USED) >= 6000);
    }
    CHECK(cuMemFreeAsync(e, s1));
    CHECK(cuMemFreeAsync(d, s2));
    CHECK(cuStreamSynchronize(s1));
    CHECK(cuStreamSynchronize(s2));
    EXPECT("bytes in use once all is freed", attribute(pool, USED), 0);
    ASSERT(attribute(pool, RESERVED) > 0); /* the pool holds it, by its threshold */
    uint64_t zero = 0;
    CHECK(cuMemAllocAsync(&f, 3000, s1));
    CHECK(cuMemPoolSetAttribute(pool, USED_HIGH, &zero));
    if (shim) EXPECT("most bytes in use after a reset", attribute(pool, USED_HIGH), 3072);
    CHECK(cuMemFreeAsync(f, s1));
    CHECK(cuStreamSynchronize(s1));
    printf("kept blocks are not in use\n");

    /* A kept block is freed memory to the program (through the shim only: natively
       freed memory is not checked). */
    if (shim) {
        CUdeviceptr live, base;
        size_t size;
        CHECK(cuMemAllocAsync(&live, 8192, s1));
        EXPECT("a second free", cuMemFreeAsync(f, s1), INVALID_VALUE);
        EXPECT("a second free on another stream", cuMemFreeAsync(f, s2), INVALID_VALUE);
        EXPECT("a copy into it", cuMemcpyHtoDAsync_v2(f + 8, pattern, 16, s1), INVALID_VALUE);
        EXPECT("a copy into it", cuMemcpyHtoD_v2(f, pattern, 16), INVALID_VALUE);
        EXPECT("a copy from it", cuMemcpyDtoDAsync_v2(live, f, 16, s1), INVALID_VALUE);
        EXPECT("a copy across it", cuMemcpyDtoDAsync_v2(f - 4096, live, 8192, s1),
               INVALID_VALUE);
        EXPECT("a memset of it", cuMemsetD32Async(f + 64, 0, 4, s1), INVALID_VALUE);
        EXPECT("its address range", cuMemGetAddressRange_v2(&base, &size, f + 4), NOT_FOUND);
        CHECK(cuMemcpyHtoDAsync_v2(live, pattern, 16, s1)); /* its neighbours are not */
        CHECK(cuMemFreeAsync(live, s1));
        CHECK(cuCtxSynchronize());
        printf("a kept block is freed memory: refused\n");
    }

    /* Never from another pool. */
    void *mine = new_pool(KEEP_ALL);
    CUdeviceptr p[8];
    CHECK(cuMemAllocAsync(&a, 1024, s1));
    CHECK(cuMemFreeAsync(a, s1));
    before = rt();
    CHECK(cuMemAllocFromPoolAsync(&b, 1024, mine, s1));
    if (shim) {
        EXPECT("round trips of another pool's allocation", rt() - before, 1);
        ASSERT(b != a);
    }
    CHECK(cuMemFreeAsync(b, s1));
    CHECK(cuMemPoolTrimTo(mine, 0));
    printf("not reused from another pool\n");

    /* A lowered threshold gives back the oldest first. */
    uint64_t base = shim ? shim_kept() : 0; /* the default pool's */
    for (int i = 0; i < 8; i++) CHECK(cuMemAllocFromPoolAsync(&p[i], 1024, mine, s1));
    for (int i = 0; i < 8; i++) CHECK(cuMemFreeAsync(p[i], s1));
    uint64_t two = 2048;
    if (shim) EXPECT("kept", shim_kept() - base, 8 * 1024);
    CHECK(cuMemPoolSetAttribute(mine, THRESHOLD, &two));
    if (shim) EXPECT("kept under a lower threshold", shim_kept() - base, 2048);
    before = rt();
    CUdeviceptr q[8];
    for (int i = 0; i < 8; i++) CHECK(cuMemAllocFromPoolAsync(&q[i], 1024, mine, s1));
    if (shim) {
        EXPECT("round trips past the two kept", rt() - before, 6);
        ASSERT(q[0] == p[7] && q[1] == p[6]); /* the last freed, first */
    }
    for (int i = 0; i < 8; i++) CHECK(cuMemFreeAsync(q[i], s1)); /* each past two: freed */
    if (shim) EXPECT("kept under the threshold", shim_kept() - base, 2048);
    printf("a lower threshold gives back the oldest\n");

    /* A destroyed stream's blocks go with it. */
    CHECK(cuStreamCreate(&s3, 0));
    CHECK(cuMemPoolSetAttribute(mine, THRESHOLD, (void *)&KEEP_ALL));
    CHECK(cuMemAllocFromPoolAsync(&a, 5000, mine, s3));
    CHECK(cuMemFreeAsync(a, s3));
    if (shim) EXPECT("kept with the stream's", shim_kept() - base, 2048 + 5120);
    CHECK(cuStreamDestroy_v2(s3));
    if (shim) EXPECT("kept once the stream is destroyed", shim_kept() - base, 2048);
    printf("a destroyed stream's blocks are freed\n");

    /* Trimmed: what is kept is freed, and the pool gives the memory back. */
    CHECK(cuMemAllocAsync(&a, 4096, s2));
    CHECK(cuMemFreeAsync(a, s2));
    CHECK(cuCtxSynchronize()); /* the driver trims only frees it has seen done */
    CHECK(cuMemPoolTrimTo(pool, 0));
    EXPECT("reserved after a trim", attribute(pool, RESERVED), 0);
    if (shim) EXPECT("kept after the default pool's trim", shim_kept(), 2048);
    before = rt();
    CHECK(cuMemAllocAsync(&a, 4096, s2));
    if (shim) EXPECT("round trips after a trim", rt() - before, 1);
    CHECK(cuMemFreeAsync(a, s2));
    printf("a trim frees what is kept\n");

    /* Destroyed: what is kept is freed first, so the pool goes. */
    CHECK(cuMemPoolDestroy(mine));
    if (shim) EXPECT("kept after the pool is destroyed", shim_kept(), 4096);
    CHECK(cuCtxSynchronize());
    printf("semantics ok\n");
    return 0;
}

/* -- out of memory ------------------------------------------------------------------- */

static int oom(void) {
    setup();
    enum { MAX = 4096 };
    static CUdeviceptr p[MAX];
    void *pool, *s1, *s2;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, (void *)&KEEP_ALL));
    CHECK(cuStreamCreate(&s1, 0));
    CHECK(cuStreamCreate(&s2, 0));
    size_t big = (2u << 20) - 4096; /* a granule each */
    int m = 0, r = 0;
    while (m < MAX && (r = cuMemAllocAsync(&p[m], big, s1)) == 0) m++;
    EXPECT("allocating past the slice", r, OUT_OF_MEMORY);
    ASSERT(m >= 8);
    for (int i = 0; i < m; i++) CHECK(cuMemFreeAsync(p[i], s1));
    ASSERT(!shim_kept || shim_kept() == (uint64_t)m * big);
    CUdeviceptr other;
    CHECK(cuMemAllocAsync(&other, 1u << 20, s2)); /* the kept blocks are freed for it */
    ASSERT(!shim_kept || shim_kept() == 0);
    CHECK(cuMemFreeAsync(other, s2));
    CHECK(cuCtxSynchronize());
    printf("oom: %d blocks kept, freed for an allocation on another stream\n", m);
    return 0;
}

/* -- threads ------------------------------------------------------------------------- */

enum { THREADS = 4, ROUNDS = 100 };

static void *worker(void *arg) {
    long id = (long)arg, wrong = 0;
    void *s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
    static __thread unsigned mine[1024], got[1024];
    for (int round = 0; round < ROUNDS; round++) {
        CUdeviceptr p[3];
        for (int k = 0; k < 3; k++) CHECK(cuMemAllocAsync(&p[k], (size_t)(k + 1) * 2048, s));
        for (int i = 0; i < 1024; i++) mine[i] = (unsigned)(id << 24 | round << 12 | i);
        CHECK(cuMemcpyHtoDAsync_v2(p[2], mine, 4096, s));
        CHECK(cuMemcpyDtoDAsync_v2(p[1], p[2], 4096, s));
        if (round % 25 == 24) {
            CHECK(cuStreamSynchronize(s));
            CHECK(cuMemcpyDtoH_v2(got, p[1], 4096));
            wrong += memcmp(got, mine, 4096) != 0;
        }
        for (int k = 0; k < 3; k++) CHECK(cuMemFreeAsync(p[k], s));
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy_v2(s));
    return (void *)wrong;
}

static int threads(void) {
    setup();
    void *pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, (void *)&KEEP_ALL));
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    long wrong = 0;
    for (int i = 0; i < THREADS; i++) {
        void *w;
        pthread_join(t[i], &w);
        wrong += (long)w;
    }
    EXPECT("bytes in use after the threads", attribute(pool, USED), 0);
    ASSERT(!shim_kept || shim_kept() == 0); /* each stream's went with it */
    printf("threads=%d rounds=%d wrong=%ld\n", THREADS, ROUNDS, wrong);
    return wrong != 0;
}

/* -- a destroyed pool ---------------------------------------------------------------- */

static int destroyed(void) {
    setup();
    void *s;
    size_t free0, free1, total;
    CHECK(cuStreamCreate(&s, 0));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemGetInfo_v2(&free0, &total));
    void *pool = new_pool(KEEP_ALL);
    CUdeviceptr p[4], q;
    for (int i = 0; i < 4; i++) CHECK(cuMemAllocFromPoolAsync(&p[i], 1u << 20, pool, s));
    for (int i = 0; i < 4; i++) CHECK(cuMemFreeAsync(p[i], s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemGetInfo_v2(&free1, &total));
    ASSERT(free1 < free0); /* kept: still the program's, still charged */
    CHECK(cuMemPoolDestroy(pool));
    ASSERT(!shim_kept || shim_kept() == 0);
    ASSERT(cuMemAllocFromPoolAsync(&q, 1u << 20, pool, s) != 0); /* nothing handed out */
    CHECK(cuCtxSynchronize());
    CHECK(cuMemGetInfo_v2(&free1, &total));
    EXPECT("free memory once the pool is destroyed", free1, free0);
    /* Its blocks are nobody's now: the executor refuses a copy into one. */
    unsigned word = 7;
    int r = cuMemcpyHtoD_v2(p[0], &word, sizeof word);
    if (!r) r = cuCtxSynchronize(); /* one-way: the refusal comes at the next sync */
    ASSERT(r != 0);
    printf("destroyed: its kept blocks freed, the memory given back, a copy refused\n");
    return 0;
}

/* -- fork ------------------------------------------------------------------------------ */

static int forked(void) {
    setup();
    ASSERT(round_trips);
    void *pool;
    CUdeviceptr a, b;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CHECK(cuMemPoolSetAttribute(pool, THRESHOLD, (void *)&KEEP_ALL));
    CHECK(cuMemAllocAsync(&a, 4096, NULL));
    CHECK(cuMemFreeAsync(a, NULL));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) { /* the parent's kept block is its executor's memory, not the child's */
        EXPECT("kept in the child", shim_kept(), 0);
        uint64_t before = rt();
        CHECK(cuMemAllocAsync(&b, 4096, NULL));
        CHECK(cuMemFreeAsync(b, NULL));
        CHECK(cuCtxSynchronize());
        ASSERT(rt() - before >= 2); /* its own default pool, then the allocation */
        printf("child: allocated from its own pool\n");
        fflush(stdout);
        _exit(0);
    }
    int status = 1;
    ASSERT(child > 0 && waitpid(child, &status, 0) == child);
    EXPECT("the child's exit", status, 0);
    uint64_t before = rt();
    CHECK(cuMemAllocAsync(&b, 4096, NULL));
    EXPECT("round trips in the parent after the fork", rt() - before, 0);
    ASSERT(b == a);
    CHECK(cuMemFreeAsync(b, NULL));
    printf("parent: reused its kept block\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "steps"))
        return steps(atoi(argv[2]), !(argc > 3 && !strcmp(argv[3], "default")));
    if (argc == 2 && !strcmp(argv[1], "semantics")) return semantics();
    if (argc == 2 && !strcmp(argv[1], "oom")) return oom();
    if (argc == 2 && !strcmp(argv[1], "threads")) return threads();
    if (argc == 2 && !strcmp(argv[1], "destroyed")) return destroyed();
    if (argc == 2 && !strcmp(argv[1], "fork")) return forked();
    fprintf(stderr, "usage: pool_reuse steps N [default] | semantics | oom | threads | "
            "destroyed | fork\n");
    return 2;
}
