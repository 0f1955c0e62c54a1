/* Page-locked memory a kernel reads and writes through the program's own pointer, and
 * stream memory operations, as XLA's autotuner and NVIDIA's streamMemOps-style code use
 * them: cuMemHostAlloc(DEVICEMAP) memory handed to a kernel by its host pointer and by
 * cuMemHostGetDevicePointer, its flags and pointer attributes; cuStreamWaitValue32 on
 * one stream released by cuStreamWriteValue32 on another, 64-bit values, a wait the
 * host itself satisfies by writing the pinned memory, a batch. Prints the same natively
 * and through the shim. `hostile` (the shim only): addresses the program does not own,
 * registered memory the device cannot reach, bad flags. */
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

enum { N = 1000 };

static int saxpy(CUfunction f, CUstream s, float a, CUdeviceptr x, CUdeviceptr y) {
    int n = N;
    void *params[] = { &a, &x, &y, &n };
    EXPECT(cuLaunchKernel(f, (N + 127) / 128, 1, 1, 128, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
    return 0;
}

static double sum(const float *v) {
    double t = 0;
    for (int i = 0; i < N; i++) t += v[i];
    return t;
}

static int hostile(CUstream s, CUdeviceptr flag) {
    EXPECT(cuStreamWriteValue32(s, (CUdeviceptr)0x1000, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWaitValue64(s, (CUdeviceptr)(uintptr_t)&flag, 1, 0), CUDA_ERROR_INVALID_VALUE);
    char *mine = aligned_alloc(4096, 8192);
    EXPECT(cuMemHostRegister(mine, 8192, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemHostRegister(mine, 8192, 0), CUDA_SUCCESS);
    CUdeviceptr d;
    EXPECT(cuMemHostGetDevicePointer(&d, mine, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuStreamWriteValue32(s, (CUdeviceptr)(uintptr_t)mine, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemHostUnregister(mine), CUDA_SUCCESS);
    free(mine);
    CUstreamBatchMemOpParams op;
    memset(&op, 0, sizeof op);
    op.operation = 99;
    EXPECT(cuStreamBatchMemOp(s, 1, &op, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamBatchMemOp(s, 0, &op, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamWriteValue32(s, flag, 5, 0), CUDA_SUCCESS); /* still serving */
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("hostile: foreign addresses, registered memory and bad operations refused\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    int map = 0, unified = 0, v1 = 0, b64 = 0, nor = 0;
    cuDeviceGetAttribute(&map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev);
    cuDeviceGetAttribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
    cuDeviceGetAttribute(&v1, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
    cuDeviceGetAttribute(&b64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
    cuDeviceGetAttribute(&nor, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
    printf("attributes: map host memory %d, unified addressing %d, mem ops v1 %d, 64-bit %d, "
           "nor %d\n", map, unified, v1, b64, nor);

    /* a kernel through the host pointer and through the device pointer */
    float *x, *y;
    EXPECT(cuMemHostAlloc((void **)&x, N * sizeof(float),
                          CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    EXPECT(cuMemHostAlloc((void **)&y, N * sizeof(float), CU_MEMHOSTALLOC_DEVICEMAP),
           CUDA_SUCCESS);
    for (int i = 0; i < N; i++) { x[i] = (float)i; y[i] = 1.0f; }
    unsigned fx = 0, fy = 0;
    EXPECT(cuMemHostGetFlags(&fx, x), CUDA_SUCCESS);
    EXPECT(cuMemHostGetFlags(&fy, y), CUDA_SUCCESS);
    CUdeviceptr dx, dy;
    EXPECT(cuMemHostGetDevicePointer(&dx, x, 0), CUDA_SUCCESS);
    EXPECT(cuMemHostGetDevicePointer(&dy, y + 10, 0), CUDA_SUCCESS);
    EXPECT(cuMemHostGetDevicePointer(&dy, y, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostGetDevicePointer(&dy, y, 0), CUDA_SUCCESS);
    printf("flags: %u %u; device pointers are the host's: %d %d\n", fx, fy,
           dx == (CUdeviceptr)(uintptr_t)x, dy == (CUdeviceptr)(uintptr_t)y);
    unsigned type = 0;
    CUdeviceptr dp = 0;
    void *hp = NULL;
    EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dx), CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)(uintptr_t)(x + 3)),
           CUDA_SUCCESS);
    EXPECT(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, dx), CUDA_SUCCESS);
    printf("pointer attributes: type %u, device pointer ok %d, host pointer ok %d\n", type,
           dp == (CUdeviceptr)(uintptr_t)(x + 3), hp == (void *)x);
    CUstream s1, s2;
    EXPECT(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    if (saxpy(f, s1, 2.0f, (CUdeviceptr)(uintptr_t)x, dy)) return 1; /* y = 2x + 1 */
    EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    printf("kernel wrote the host's bytes: y[0]=%g y[999]=%g sum=%.0f\n", y[0], y[N - 1], sum(y));
    for (int i = 0; i < N; i++) x[i] = 0.5f; /* the host's write, seen by the next kernel */
    if (saxpy(f, s1, 4.0f, (CUdeviceptr)(uintptr_t)y, dx)) return 1; /* x = 4y + 0.5 */
    EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    printf("and read them: x[0]=%g x[999]=%g sum=%.0f\n", x[0], x[N - 1], sum(x));

    /* stream memory operations: between two streams, on device and mapped memory */
    unsigned *flag;
    EXPECT(cuMemHostAlloc((void **)&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    memset(flag, 0, 4096);
    CUdeviceptr dflag, d;
    EXPECT(cuMemHostGetDevicePointer(&dflag, flag, 0), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&d, 64), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(d, 0, 64), CUDA_SUCCESS);
    EXPECT(cuStreamWaitValue32(s2, dflag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    EXPECT(cuMemsetD32Async(d, 0xabcd, 4, s2), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue32(s2, dflag + 4, 2, 0), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue32(s1, dflag, 1, 0), CUDA_SUCCESS); /* releases s2 */
    EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
    unsigned got[16];
    EXPECT(cuMemcpyDtoH(got, d, sizeof got), CUDA_SUCCESS);
    printf("wait and write between streams: d[0]=%x flag=%u,%u\n", got[0], flag[0], flag[1]);
    if (b64) {
        EXPECT(cuStreamWriteValue64(s1, d + 16, 0x1122334455667788ull, 0), CUDA_SUCCESS);
        EXPECT(cuStreamWaitValue64(s2, d + 16, 0x1122334455667788ull, CU_STREAM_WAIT_VALUE_EQ),
               CUDA_SUCCESS);
        EXPECT(cuStreamWriteValue64(s2, dflag + 8, 0x99ull << 32, 0), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
        printf("64-bit: flag[3]=%x\n", flag[3]);
    }
    /* the host satisfies a wait by writing the pinned memory itself */
    EXPECT(cuStreamWaitValue32(s2, dflag + 16, 4, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
    EXPECT(cuStreamWriteValue32(s2, d + 32, 77, 0), CUDA_SUCCESS);
    __atomic_store_n(&flag[4], 6u, __ATOMIC_RELEASE);
    EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
    if (nor) {
        EXPECT(cuStreamWaitValue32(s2, dflag, 0, CU_STREAM_WAIT_VALUE_NOR), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s2), CUDA_SUCCESS);
    }
    CUstreamBatchMemOpParams ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = d + 36;
    ops[0].writeValue.value = 7;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[1].waitValue.address = dflag;
    ops[1].waitValue.value = 1;
    ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    ops[2].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[2].writeValue.address = dflag + 20;
    ops[2].writeValue.value = 8;
    EXPECT(cuStreamBatchMemOp(s1, 3, ops, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamBatchMemOp(s1, 3, ops, 0), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s1), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(got, d, sizeof got), CUDA_SUCCESS);
    printf("host-released wait, batch: d[8]=%u d[9]=%u flag[5]=%u\n", got[8], got[9], flag[5]);
    if (argc > 1 && !strcmp(argv[1], "hostile") && hostile(s1, dflag)) return 1;
    EXPECT(cuMemFree(d), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(flag), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(x), CUDA_SUCCESS);
    EXPECT(cuMemFreeHost(y), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s1), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s2), CUDA_SUCCESS);
    printf("done\n");
    return 0;
}
