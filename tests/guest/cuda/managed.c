/* Managed memory through the shim (CI, against the GPU test double, whose PTX "saxpy"
 * computes y = a*x + y): the host and the device see the same bytes at the same
 * address, under the rules for a device without concurrent managed access.
 * `quota`: managed memory past the slice is refused as the driver refuses it. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry saxpy(.param .f32 a) { ret; }\n";

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "quota")) {
        CUdeviceptr big, small;
        EXPECT(cuMemAllocManaged(&big, (size_t)1 << 30, CU_MEM_ATTACH_GLOBAL),
               CUDA_ERROR_OUT_OF_MEMORY);
        EXPECT(cuMemAllocManaged(&small, 1000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
        size_t free_, total;
        EXPECT(cuMemGetInfo(&free_, &total), CUDA_SUCCESS);
        printf("quota: past the slice refused; 1000 bytes take %zu KiB of it\n",
               (total - free_) >> 10);
        return 0;
    }
    int managed, concurrent;
    EXPECT(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev), 0);
    EXPECT(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                                dev), 0);
    printf("managed memory %d, concurrent managed access %d\n", managed, concurrent);

    CUmodule mod;
    CUfunction f;
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    int n = 1 << 20; /* 4 MiB each: two 2 MiB pages */
    CUdeviceptr x, y, plain;
    EXPECT(cuMemAllocManaged(&x, n * sizeof(float), CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemAllocManaged(&y, n * sizeof(float), CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&plain, 4096), CUDA_SUCCESS);
    float *hx = (float *)(uintptr_t)x, *hy = (float *)(uintptr_t)y, a = 2.0f;
    for (int i = 0; i < n; i++) { hx[i] = 1.0f; hy[i] = 2.0f; }
    void *params[] = { &a, &x, &y, &n };
    EXPECT(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    printf("after a launch and a synchronize: y[0] %g, y[n-1] %g\n", hy[0], hy[n - 1]);
    hy[0] = 10.0f; /* the host's write reaches the device before the next launch */
    hx[n - 1] = 0.0f;
    EXPECT(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    printf("host writes went to the device: y[0] %g, y[1] %g, y[n-1] %g\n", hy[0], hy[1],
           hy[n - 1]);
    float back[2];
    EXPECT(cuMemcpyDtoH(back, y, sizeof back), CUDA_SUCCESS);
    float from_host[2] = { 7.0f, 8.0f };
    EXPECT(cuMemcpyHtoD(y, from_host, sizeof from_host), CUDA_SUCCESS);
    printf("copies: from y %g %g; into y, seen by the host: %g %g\n", back[0], back[1],
           hy[0], hy[1]);

    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuStreamAttachMemAsync(s, y, 0, CU_MEM_ATTACH_SINGLE), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    for (int i = 0; i < n; i++) hy[i] = 1.0f;
    EXPECT(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("attached to a stream, synchronised by it: y[5] %g\n", hy[5]);

    unsigned is_managed = 7, plain_managed = 7;
    EXPECT(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, y + 64), 0);
    EXPECT(cuPointerGetAttribute(&plain_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain), 0);
    CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, 0 }, host = { CU_MEM_LOCATION_TYPE_HOST, 0 };
    EXPECT(cuMemAdvise(x, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, loc), CUDA_SUCCESS);
    EXPECT(cuMemAdvise(x, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host), 0);
    EXPECT(cuMemPrefetchAsync(x, n * sizeof(float), loc, 0, NULL), CUDA_SUCCESS);
    int read_mostly = -5, preferred = -5, last = -5;
    EXPECT(cuMemRangeGetAttribute(&read_mostly, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, x, 4096), 0);
    EXPECT(cuMemRangeGetAttribute(&preferred, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, x,
                                  4096), 0);
    EXPECT(cuMemRangeGetAttribute(&last, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, x,
                                  4096), 0);
    EXPECT(cuMemAdvise(plain, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, loc), CUDA_ERROR_INVALID_VALUE);
    printf("attributes: managed %u, plain %u; read mostly %d, preferred %d, last prefetch %d\n",
           is_managed, plain_managed, read_mostly, preferred, last);
    EXPECT(cuMemFree(x), CUDA_SUCCESS);
    EXPECT(cuMemFree(y), CUDA_SUCCESS);
    EXPECT(cuMemAllocManaged(&x, 4, 0), CUDA_ERROR_INVALID_VALUE);
    printf("managed: ok\n");
    return 0;
}
