/* Driver calls against an agent that may be silent or slow: initialise, and with
 * an argument N, run the test double's `sleep_ms` kernel for N ms and synchronise.
 * Prints each call's status; a hang or a signal is what the test catches. */
#include <stdio.h>
#include <stdlib.h>

int cuInit(unsigned flags);
int cuGetErrorName(int error, const char **name);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
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
    void *params[] = { &ms };
    report("launch", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    report("sync", cuCtxSynchronize());
    return 0;
}
