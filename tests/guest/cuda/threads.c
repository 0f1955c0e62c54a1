/* Several threads of one program share the shim's connection: each allocates,
 * copies, launches the test double's `saxpy` and checks what comes back. */
#include <pthread.h>
#include <stdio.h>
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuMemAlloc_v2(CUdeviceptr *p, size_t n);
int cuMemFree_v2(CUdeviceptr p);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);

static void *ctx, *fn;
enum { N = 4096, ROUNDS = 50, THREADS = 4 };

static void *work(void *arg) {
    long id = (long)arg, bad = 0;
    float x[N], y[N];
    cuCtxSetCurrent(ctx);
    for (int r = 0; r < ROUNDS; r++) {
        CUdeviceptr dx, dy;
        if (cuMemAlloc_v2(&dx, sizeof x) || cuMemAlloc_v2(&dy, sizeof y)) return (void *)-1L;
        for (int i = 0; i < N; i++) { x[i] = (float)i; y[i] = (float)id; }
        cuMemcpyHtoD_v2(dx, x, sizeof x);
        cuMemcpyHtoD_v2(dy, y, sizeof y);
        float a = (float)r;
        int n = N;
        void *params[] = { &a, &dx, &dy, &n };
        if (cuLaunchKernel(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL)) return (void *)-1L;
        if (cuMemcpyDtoH_v2(y, dy, sizeof y)) return (void *)-1L;
        for (int i = 0; i < N; i++) bad += y[i] != a * (float)i + (float)id;
        cuMemFree_v2(dx);
        cuMemFree_v2(dy);
    }
    return (void *)bad;
}

int main(void) {
    static const char ptx[] = ".version 8.0\n.target sm_90\n.visible .entry saxpy(\n)\n{\n ret;\n}\n";
    void *module;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&module, ptx) || cuModuleGetFunction(&fn, module, "saxpy")) {
        printf("setup failed\n");
        return 1;
    }
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, (void *)i);
    long total = 0;
    for (int i = 0; i < THREADS; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        total += (long)bad;
    }
    printf("threads=%d rounds=%d wrong=%ld\n", THREADS, ROUNDS, total);
    return total != 0;
}
