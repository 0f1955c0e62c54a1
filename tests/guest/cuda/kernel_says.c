/* Device printf through the shim, against the GPU test double: its `say` kernel prints
 * "kernel says V" per line at the next synchronisation, as a kernel's printf does.
 * The program's own lines go through stdio, fully buffered on a pipe: what the kernel
 * said must land between them where the synchronisation was. */
#include <stdio.h>
#include <stdint.h>

int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra);

static const char ptx[] =
    ".version 8.0\n.target sm_90\n.visible .entry say(\n .param .u32 v\n)\n{\n ret;\n}\n";

#define CHECK(x) do { int r_ = (x); if (r_) { printf("%s: %d\n", #x, r_); return 1; } } while (0)

int main(void) {
    void *ctx, *module, *fn;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&fn, module, "say"));
    printf("host: before\n");
    int value = 7, lines = 2;
    void *params[] = { &value, &lines };
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    printf("host: after\n");
    return 0;
}
