// Driver API: a module loaded from a cubin file, launched with kernelParams
// and with the `extra` parameter buffer (CU_LAUNCH_PARAM_BUFFER_POINTER).
// Build: nvcc -cubin -arch=sm_90 -o kernel.cubin extra_kernel.cu; nvcc extra_launch.cu -lcuda
#include <cstdio>
#include <cstring>
#include <cuda.h>
#define CHECK(x) do { CUresult e = (x); if (e) { const char *s = 0; cuGetErrorName(e, &s); printf("%s: %s\n", #x, s ? s : "?"); return 1; } } while (0)
int main(int argc, char **argv) {
    if (argc < 2) { printf("usage: extra_launch KERNEL.cubin\n"); return 2; }
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn; CUdeviceptr d;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&fn, mod, "fill"));
    const int n = 4096;
    CHECK(cuMemAlloc(&d, 2 * n * sizeof(int)));
    // fill(int *out, int base, char tag, double step, int n)
    struct { CUdeviceptr out; int base; char tag; double step; int n; } args = { d, 100, 3, 0.5, n };
    size_t offsets[5], sizes[5];
    for (int i = 0; i < 5; i++) CHECK(cuFuncGetParamInfo(fn, i, &offsets[i], &sizes[i]));
    char buf[64] = {0};
    memcpy(buf + offsets[0], &args.out, 8); memcpy(buf + offsets[1], &args.base, 4);
    memcpy(buf + offsets[2], &args.tag, 1); memcpy(buf + offsets[3], &args.step, 8);
    memcpy(buf + offsets[4], &args.n, 4);
    size_t size = offsets[4] + sizes[4];
    void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                      CU_LAUNCH_PARAM_END };
    CHECK(cuLaunchKernel(fn, n / 128, 1, 1, 128, 1, 1, 0, 0, NULL, extra));
    CUdeviceptr second = d + n * sizeof(int);
    int base2 = 7; char tag2 = 1; double step2 = 2.0; int nn = n;
    void *params[] = { &second, &base2, &tag2, &step2, &nn };
    CHECK(cuLaunchKernel(fn, n / 128, 1, 1, 128, 1, 1, 0, 0, params, NULL));
    int h[2 * 4096];
    CHECK(cuMemcpyDtoH(h, d, sizeof h));
    long long s1 = 0, s2 = 0;
    for (int i = 0; i < n; i++) { s1 += h[i]; s2 += h[n + i]; }
    printf("extra_launch: extra-form sum=%lld kernelParams sum=%lld first=%d,%d\n", s1, s2, h[0], h[n]);
    CHECK(cuMemFree(d));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
