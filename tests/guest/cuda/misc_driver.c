/* Driver entry points programs call that none of the other samples do: context flags
 * and shared memory configuration, execution affinity, a function's module and loading
 * state, libraries loaded from a file, the deprecated launch API (cuFuncSetBlockShape,
 * cuParamSet*, cuLaunchGrid), cuDeviceGetProperties. Prints the same natively and
 * through the shim; where the driver's answer is a status, the status is printed (the
 * native run says what the driver does). `hostile` (the shim only): bad arguments. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

#define N 4096
static float hx[N], hy[N];

/* y = 1, x = i % 7; after saxpy with a: sum of y */
static int reset(CUdeviceptr x, CUdeviceptr y) {
    for (unsigned i = 0; i < N; i++) { hx[i] = (float)(i % 7); hy[i] = 1.0f; }
    EXPECT(cuMemcpyHtoD(x, hx, sizeof hx), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(y, hy, sizeof hy), CUDA_SUCCESS);
    return 0;
}

static double sum_y(CUdeviceptr y) {
    if (cuMemcpyDtoH(hy, y, sizeof hy)) return -1;
    double s = 0;
    for (unsigned i = 0; i < N; i++) s += hy[i];
    return s;
}

static int hostile(CUfunction f) {
    EXPECT(cuFuncGetModule(NULL, f), CUDA_ERROR_INVALID_VALUE);
    CUmodule m;
    EXPECT(cuFuncGetModule(&m, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuFuncIsLoaded(NULL, f), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuFuncSetBlockShape(f, 0, 1, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuFuncSetBlockShape(NULL, 1, 1, 1), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuParamSetv(f, -4, hx, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuParamSetv(f, 1 << 30, hx, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuParamSetv(f, 0, NULL, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuParamSetSize(f, 1u << 20), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchGrid(f, 0, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxSetFlags(0x100), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetProperties(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CUdevprop p;
    EXPECT(cuDeviceGetProperties(&p, 99), CUDA_ERROR_INVALID_DEVICE);
    CUlibrary lib;
    EXPECT(cuLibraryLoadFromFile(&lib, NULL, NULL, NULL, 0, NULL, NULL, 0),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxRecordEvent(NULL, (CUevent)(uintptr_t)0x7777), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuCtxWaitEvent(NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    CUevent forged = (CUevent)(uintptr_t)0x12345678;
    EXPECT(cuCtxRecordEvent(NULL, forged), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuCtxWaitEvent(NULL, forged), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuDeviceGetTexture1DLinearMaxWidth(NULL, CU_AD_FORMAT_FLOAT, 1, 0),
           CUDA_ERROR_INVALID_VALUE);
    size_t w;
    EXPECT(cuDeviceGetTexture1DLinearMaxWidth(&w, CU_AD_FORMAT_FLOAT, 3, 0),
           CUDA_ERROR_INVALID_VALUE);
    unsigned caps[100];
    CUatomicOperation ops[100];
    for (int i = 0; i < 100; i++) ops[i] = CU_ATOMIC_OPERATION_INTEGER_ADD;
    EXPECT(cuDeviceGetHostAtomicCapabilities(caps, ops, 100, 0), CUDA_SUCCESS); /* two frames */
    ops[70] = (CUatomicOperation)99;
    EXPECT(cuDeviceGetHostAtomicCapabilities(caps, ops, 100, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetHostAtomicCapabilities(NULL, ops, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    EXPECT(cuArrayGetMemoryRequirements(&req, (CUarray)(uintptr_t)0x4242, 0),
           CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMipmappedArrayGetMemoryRequirements(&req, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
    CUtensorMap map;
    cuuint64_t dims[3] = { 8, 16, 2 }, strides[2] = { 32, 512 };
    cuuint32_t es[3] = { 1, 1, 1 };
    int lo = -1, hi = 1;
    EXPECT(cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, NULL, dims, strides,
                                   &lo, &hi, 8, 16, es, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuTensorMapReplaceAddress(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    printf("hostile: bad functions, shapes, offsets, sizes, flags and paths refused\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUmodule mod;
    CUfunction f;
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "hostile")) return hostile(f);

    /* contexts */
    unsigned flags;
    EXPECT(cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
    EXPECT(cuCtxGetFlags(&flags), CUDA_SUCCESS);
    printf("context flags: scheduling %u\n", flags & CU_CTX_SCHED_MASK);
    printf("context flags 3: %d\n", cuCtxSetFlags(3));
    EXPECT(cuCtxSetFlags(CU_CTX_SCHED_AUTO), CUDA_SUCCESS);
    CUsharedconfig config;
    EXPECT(cuCtxGetSharedMemConfig(&config), CUDA_SUCCESS);
    printf("shared memory banks: %d\n", config);
    printf("set eight-byte banks: %d\n", cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE));
    EXPECT(cuCtxGetSharedMemConfig(&config), CUDA_SUCCESS);
    printf("shared memory banks then: %d\n", config);
    printf("function banks: %d\n", cuFuncSetSharedMemConfig(f, CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE));
    int support = -1;
    EXPECT(cuDeviceGetExecAffinitySupport(&support, CU_EXEC_AFFINITY_TYPE_SM_COUNT, dev),
           CUDA_SUCCESS);
    CUexecAffinityParam affinity;
    CUresult r = cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT);
    printf("execution affinity: supported %d, context's %d\n", support, r);
    CUdevprop prop;
    int threads, warp;
    EXPECT(cuDeviceGetProperties(&prop, dev), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev),
           CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev), CUDA_SUCCESS);
    printf("properties: threads per block as attribute %s, warp as attribute %s\n",
           prop.maxThreadsPerBlock == threads ? "yes" : "no", prop.SIMDWidth == warp ? "yes" : "no");

    /* functions */
    CUmodule got;
    EXPECT(cuFuncGetModule(&got, f), CUDA_SUCCESS);
    printf("function's module: the one loaded %s\n", got == mod ? "yes" : "no");
    CUfunctionLoadingState state;
    EXPECT(cuFuncIsLoaded(&state, f), CUDA_SUCCESS);
    printf("found by name: loaded %d\n", state == CU_FUNCTION_LOADING_STATE_LOADED);
    EXPECT(cuFuncLoad(f), CUDA_SUCCESS);
    EXPECT(cuFuncIsLoaded(&state, f), CUDA_SUCCESS);
    printf("after cuFuncLoad: loaded %d\n", state == CU_FUNCTION_LOADING_STATE_LOADED);

    CUdeviceptr x, y;
    EXPECT(cuMemAlloc(&x, sizeof hx), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&y, sizeof hy), CUDA_SUCCESS);

    /* the deprecated launch API */
    if (reset(x, y)) return 1;
    float a = 2.0f;
    unsigned n = N;
    EXPECT(cuFuncSetBlockShape(f, 256, 1, 1), CUDA_SUCCESS);
    EXPECT(cuFuncSetSharedSize(f, 0), CUDA_SUCCESS);
    EXPECT(cuParamSetf(f, 0, a), CUDA_SUCCESS);
    EXPECT(cuParamSetv(f, 8, &x, sizeof x), CUDA_SUCCESS);
    EXPECT(cuParamSetv(f, 16, &y, sizeof y), CUDA_SUCCESS);
    EXPECT(cuParamSeti(f, 24, n), CUDA_SUCCESS);
    EXPECT(cuParamSetSize(f, 28), CUDA_SUCCESS);
    EXPECT(cuLaunchGrid(f, N / 256, 1), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    printf("cuLaunchGrid: sum %.0f\n", sum_y(y));
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuLaunchGridAsync(f, N / 256, 1, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("cuLaunchGridAsync: sum %.0f\n", sum_y(y));
    EXPECT(cuParamSeti(f, 24, 256), CUDA_SUCCESS); /* one block: the first 256 once more */
    EXPECT(cuLaunch(f), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    printf("cuLaunch: sum %.0f\n", sum_y(y));

    /* a library from a file */
    char path[] = "/tmp/hvgpu-misc-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, PTX, sizeof PTX) != (ssize_t)sizeof PTX) return 1;
    close(fd);
    CUlibrary lib;
    EXPECT(cuLibraryLoadFromFile(&lib, path, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    unlink(path);
    CUkernel k;
    CUfunction kf;
    EXPECT(cuLibraryGetKernel(&k, lib, "saxpy"), CUDA_SUCCESS);
    EXPECT(cuKernelGetFunction(&kf, k), CUDA_SUCCESS);
    CUmodule lmod, kmod;
    EXPECT(cuLibraryGetModule(&lmod, lib), CUDA_SUCCESS);
    EXPECT(cuFuncGetModule(&kmod, kf), CUDA_SUCCESS);
    printf("library kernel's module: the library's %s\n", kmod == lmod ? "yes" : "no");
    if (reset(x, y)) return 1;
    void *args[] = { &a, &x, &y, &n };
    EXPECT(cuLaunchKernel(kf, N / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    printf("library from a file: sum %.0f\n", sum_y(y));
    EXPECT(cuLibraryUnload(lib), CUDA_SUCCESS);
    printf("a file that is not there: %d\n",
           cuLibraryLoadFromFile(&lib, "/nonexistent/hvgpu.ptx", NULL, NULL, 0, NULL, NULL, 0));

    /* context events, the L2 cache, device queries */
    CUevent e;
    EXPECT(cuEventCreate(&e, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    if (reset(x, y)) return 1;
    EXPECT(cuLaunchKernel(f, N / 256, 1, 1, 256, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
    printf("cuCtxRecordEvent: %d\n", cuCtxRecordEvent(ctx, e));
    EXPECT(cuEventSynchronize(e), CUDA_SUCCESS);
    printf("after the event: sum %.0f\n", sum_y(y));
    printf("cuCtxWaitEvent: %d\n", cuCtxWaitEvent(ctx, e));
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    printf("cuCtxRecordEvent while capturing: %d\n", cuCtxRecordEvent(ctx, e));
    CUgraph g;
    r = cuStreamEndCapture(s, &g);
    if (!r) cuGraphDestroy(g);
    printf("cuCtxResetPersistingL2Cache: %d\n", cuCtxResetPersistingL2Cache());
    size_t width = 0, width4 = 0;
    EXPECT(cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 1, dev), CUDA_SUCCESS);
    EXPECT(cuDeviceGetTexture1DLinearMaxWidth(&width4, CU_AD_FORMAT_FLOAT, 4, dev), CUDA_SUCCESS);
    printf("1D linear texture: at most %zu floats, %zu float4s\n", width, width4);
    CUatomicOperation ops[] = { CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_CAS,
                                CU_ATOMIC_OPERATION_FLOAT_ADD };
    unsigned caps[3] = { 0 };
    printf("host atomics: %d", cuDeviceGetHostAtomicCapabilities(caps, ops, 3, dev));
    printf(", add %#x, cas %#x, float add %#x\n", caps[0], caps[1], caps[2]);
    printf("peer atomics with itself: %d\n", cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, dev, dev));

    /* arrays' memory requirements */
    CUDA_ARRAY3D_DESCRIPTOR ad = { 64, 64, 0, CU_AD_FORMAT_FLOAT, 1, 0 };
    CUarray arr;
    CUmipmappedArray mip;
    EXPECT(cuArray3DCreate(&arr, &ad), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayCreate(&mip, &ad, 3), CUDA_SUCCESS);
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    r = cuArrayGetMemoryRequirements(&req, arr, dev);
    printf("array's memory requirements: %d\n", r);
    r = cuMipmappedArrayGetMemoryRequirements(&req, mip, dev);
    printf("mipmapped array's memory requirements: %d\n", r);
    EXPECT(cuArrayDestroy(arr), CUDA_SUCCESS);
    EXPECT(cuMipmappedArrayDestroy(mip), CUDA_SUCCESS);

    /* im2col tensor maps: 16 pixels of 8 channels, 2 images */
    CUtensorMap map, before;
    cuuint64_t dims[3] = { 8, 16, 2 }, strides[2] = { 8 * 4, 8 * 4 * 16 };
    int lower[1] = { -1 }, upper[1] = { 1 };
    cuuint32_t estrides[3] = { 1, 1, 1 };
    r = cuTensorMapEncodeIm2col(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, (void *)(uintptr_t)x,
                                dims, strides, lower, upper, 8, 16, estrides,
                                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    printf("im2col tensor map: %d\n", r);
    before = map;
    r = cuTensorMapReplaceAddress(&map, (void *)(uintptr_t)y);
    printf("address replaced: %d, map changed %s\n", r,
           memcmp(&map, &before, sizeof map) ? "yes" : "no");
    printf("unaligned address: %d\n", cuTensorMapReplaceAddress(&map, (void *)(uintptr_t)(y + 4)));

    printf("misc_driver: ok\n");
    return 0;
}
