/* Compressible memory as NVIDIA's cudaCompressibleMemory sample makes it: the device
 * says it supports generic compression, cuMemCreate is asked for it with the
 * granularity of compressible memory, the handle's properties say it was granted, and a
 * kernel reads and writes it through a mapping. Prints the same natively and through the
 * shim. `quota N`: N MiB of compressible memory, made and released (a slice's charge). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)

static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry saxpy(.param .f32 saxpy_a, .param .u64 saxpy_x, .param .u64 saxpy_y,"
    " .param .u32 saxpy_n)\n{\n"
    ".reg .pred %p<2>;\n.reg .f32 %f<5>;\n.reg .b32 %r<6>;\n.reg .b64 %rd<8>;\n"
    "ld.param.f32 %f1, [saxpy_a];\nld.param.u64 %rd1, [saxpy_x];\n"
    "ld.param.u64 %rd2, [saxpy_y];\nld.param.u32 %r1, [saxpy_n];\n"
    "mov.u32 %r2, %ctaid.x;\nmov.u32 %r3, %ntid.x;\nmov.u32 %r4, %tid.x;\n"
    "mad.lo.u32 %r5, %r2, %r3, %r4;\nsetp.ge.u32 %p1, %r5, %r1;\n@%p1 bra DONE;\n"
    "cvta.to.global.u64 %rd3, %rd1;\ncvta.to.global.u64 %rd4, %rd2;\n"
    "mul.wide.u32 %rd5, %r5, 4;\nadd.s64 %rd6, %rd3, %rd5;\nadd.s64 %rd7, %rd4, %rd5;\n"
    "ld.global.f32 %f2, [%rd6];\nld.global.f32 %f3, [%rd7];\n"
    "fma.rn.f32 %f4, %f1, %f2, %f3;\nst.global.f32 [%rd7], %f4;\nDONE:\nret;\n}\n";


static CUmemAllocationProp compressible(CUdevice dev) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    return prop;
}

/* reserve, create, map and open size bytes of compressible memory */
static int allocate(CUdevice dev, size_t size, CUdeviceptr *ptr, int *granted) {
    CUmemAllocationProp prop = compressible(dev), got;
    CUmemGenericAllocationHandle h;
    EXPECT(cuMemAddressReserve(ptr, size, 0, 0, 0), CUDA_SUCCESS);
    EXPECT(cuMemCreate(&h, size, &prop, 0), CUDA_SUCCESS);
    memset(&got, 0, sizeof got);
    EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_SUCCESS);
    *granted = got.allocFlags.compressionType;
    EXPECT(cuMemMap(*ptr, size, 0, h, 0), CUDA_SUCCESS);
    EXPECT(cuMemRelease(h), CUDA_SUCCESS); /* the mapping keeps it */
    CUmemAccessDesc access = { { CU_MEM_LOCATION_TYPE_DEVICE, dev },
                               CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    EXPECT(cuMemSetAccess(*ptr, size, &access, 1), CUDA_SUCCESS);
    return 0;
}

static int release(CUdeviceptr ptr, size_t size) {
    EXPECT(cuMemUnmap(ptr, size), CUDA_SUCCESS);
    EXPECT(cuMemAddressFree(ptr, size), CUDA_SUCCESS);
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    int supported, vmm;
    EXPECT(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED,
                                dev), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                dev), CUDA_SUCCESS);
    printf("generic compression supported: %d, vmm %d\n", supported, vmm);
    if (!supported) return 0;

    CUmemAllocationProp prop = compressible(dev), plain = compressible(dev);
    plain.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_NONE;
    size_t g, g_plain, g_rec;
    EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_SUCCESS);
    EXPECT(cuMemGetAllocationGranularity(&g_rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
           CUDA_SUCCESS);
    EXPECT(cuMemGetAllocationGranularity(&g_plain, &plain, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           CUDA_SUCCESS);
    printf("granularity: a multiple of the plain one %s, recommended a multiple %s\n",
           g % g_plain == 0 ? "yes" : "no", g_rec % g == 0 ? "yes" : "no");

    if (argc > 2 && !strcmp(argv[1], "quota")) {
        size_t size = (size_t)atoi(argv[2]) << 20;
        size = (size + g - 1) / g * g;
        CUmemGenericAllocationHandle h;
        CUresult r = cuMemCreate(&h, size, &prop, 0);
        printf("quota: %zu MiB of compressible memory: %d\n", size >> 20, r);
        if (!r) EXPECT(cuMemRelease(h), CUDA_SUCCESS);
        return 0;
    }

    const unsigned n = 1 << 20; /* floats: 4 MiB each, as the sample's vectors */
    size_t size = ((size_t)n * 4 + g - 1) / g * g;
    CUdeviceptr x, y;
    int gx, gy;
    if (allocate(dev, size, &x, &gx) || allocate(dev, size, &y, &gy)) return 1;
    printf("compression granted: %d %d\n", gx, gy);

    static float hx[1 << 20], hy[1 << 20];
    for (unsigned i = 0; i < n; i++) { hx[i] = (float)(i % 5); hy[i] = 0.0f; }
    EXPECT(cuMemcpyHtoD(x, hx, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(y, hy, n * 4), CUDA_SUCCESS);
    CUmodule mod;
    CUfunction f;
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    float a = 3.0f;
    unsigned count = n;
    void *args[] = { &a, &x, &y, &count };
    EXPECT(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(hy, y, n * 4), CUDA_SUCCESS);
    double sum = 0;
    for (unsigned i = 0; i < n; i++) sum += hy[i];
    printf("saxpy on compressible memory: sum %.0f\n", sum);
    EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);
    if (release(x, size) || release(y, size)) return 1;
    printf("compressible: ok\n");
    return 0;
}
