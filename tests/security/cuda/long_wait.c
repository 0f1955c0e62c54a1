/* Driver calls against an agent that may be silent or slow: initialise, and with
 * an argument N, run the test double's `sleep_ms` kernel for N ms and synchronise;
 * with a second argument M, copy M MiB to the device while the kernel runs and
 * back after. Prints each call's status; a hang or a signal is what the test catches. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

int cuInit(unsigned flags);
int cuGetErrorName(int error, const char **name);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuMemAlloc_v2(unsigned long long *dptr, size_t size);
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);

static void report(const char *what, int r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    printf("%s: %d %s\n", what, r, name);
    fflush(stdout);
}

int main(int argc, char **argv) {
    static const char ptx[] = ".version 8.0\n.target sm_90\n.visible .entry sleep_ms(\n)\n{\n ret;\n}\n";
    void *ctx, *module, *fn;
    int r = cuInit(0);
    report("init", r);
    if (r || argc < 2) return 0;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&module, ptx) || cuModuleGetFunction(&fn, module, "sleep_ms")) {
        printf("setup failed\n");
        return 1;
    }
    int ms = atoi(argv[1]);
    size_t n = argc > 2 ? (size_t)atoi(argv[2]) << 20 : 0;
    unsigned char *host = n ? malloc(n) : NULL;
    unsigned long long dev = 0;
    if (n && (!host || cuMemAlloc_v2(&dev, n))) {
        printf("allocation failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7);
    void *params[] = { &ms };
    report("launch", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    if (n) report("copy", cuMemcpyHtoD_v2(dev, host, n)); /* the executor takes nothing meanwhile */
    report("sync", cuCtxSynchronize());
    if (n) {
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) host[i] = 0;
        int r = cuMemcpyDtoH_v2(host, dev, n);
        for (size_t i = 0; i < n; i++) wrong += host[i] != (unsigned char)(i * 7);
        const char *name = "?";
        cuGetErrorName(r, &name);
        printf("copy back: %d %s, %zu wrong\n", r, name, wrong);
    }
    return 0;
}
