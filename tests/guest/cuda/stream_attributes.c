/* Stream attributes (cuStreamSetAttribute, cuStreamGetAttribute, cuStreamCopyAttributes)
 * as NVIDIA's simpleAttributes sample uses them: an access policy window over a buffer
 * of the program's own, then a launch on the stream. Prints the same natively and
 * through the shim. `hostile` (the shim only): a window over memory the program does not
 * own, attributes a stream does not take, bad handles. */
#include <cuda.h>
#include <stdio.h>
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

static int hostile(CUstream s, CUdeviceptr buf) {
    CUstreamAttrValue v;
    memset(&v, 0, sizeof v);
    v.accessPolicyWindow.base_ptr = (void *)(uintptr_t)0x1000; /* not the program's */
    v.accessPolicyWindow.num_bytes = 1 << 20;
    v.accessPolicyWindow.hitRatio = 0.5f;
    v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    v.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v),
           CUDA_ERROR_INVALID_VALUE);
    v.accessPolicyWindow.base_ptr = (void *)(uintptr_t)(buf + (1 << 20)); /* runs past it */
    v.accessPolicyWindow.num_bytes = 2 << 20;
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v),
           CUDA_ERROR_INVALID_VALUE);
    memset(&v, 0, sizeof v);
    v.programmaticEvent.event = (CUevent)(uintptr_t)0xdeadbeef; /* an event's pointer */
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, &v),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT, &v),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, NULL), CUDA_ERROR_INVALID_VALUE);
    CUstream forged = (CUstream)(uintptr_t)0x7777;
    EXPECT(cuStreamGetAttribute(forged, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v),
           CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamCopyAttributes(forged, s), CUDA_ERROR_INVALID_HANDLE);
    printf("hostile: foreign windows, event attributes, NULL values and forged streams refused\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    int window_max, least, greatest;
    EXPECT(cuDeviceGetAttribute(&window_max, CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE,
                                dev), CUDA_SUCCESS);
    EXPECT(cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);

    const unsigned n = 1 << 18; /* 1 MiB of floats each */
    CUdeviceptr x, y;
    EXPECT(cuMemAlloc(&x, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&y, n * 4), CUDA_SUCCESS);
    CUstream s, t;
    EXPECT(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest), CUDA_SUCCESS);
    EXPECT(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "hostile")) return hostile(s, x);

    CUstreamAttrValue v, got;
    memset(&got, 0, sizeof got);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got), CUDA_SUCCESS);
    printf("a new stream's window: %zu bytes\n", got.accessPolicyWindow.num_bytes);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, &got), CUDA_SUCCESS);
    printf("priority: the greatest %s\n", got.priority == greatest ? "yes" : "no");

    memset(&v, 0, sizeof v);
    v.accessPolicyWindow.base_ptr = (void *)(uintptr_t)x;
    v.accessPolicyWindow.num_bytes = (size_t)n * 4 < (size_t)window_max ? (size_t)n * 4
                                                                         : (size_t)window_max;
    v.accessPolicyWindow.hitRatio = 0.6f;
    v.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
    v.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v), CUDA_SUCCESS);
    memset(&got, 0, sizeof got);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got), CUDA_SUCCESS);
    printf("window: over x %s, %zu bytes, hit ratio %.1f, hit %d, miss %d\n",
           got.accessPolicyWindow.base_ptr == (void *)(uintptr_t)x ? "yes" : "no",
           got.accessPolicyWindow.num_bytes, got.accessPolicyWindow.hitRatio,
           got.accessPolicyWindow.hitProp, got.accessPolicyWindow.missProp);
    v.accessPolicyWindow.hitRatio = 1.5f; /* not a ratio */
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v),
           CUDA_ERROR_INVALID_VALUE);

    memset(&v, 0, sizeof v);
    v.syncPolicy = CU_SYNC_POLICY_YIELD;
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &v), CUDA_SUCCESS);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &got), CUDA_SUCCESS);
    printf("sync policy: %d\n", got.syncPolicy);
    memset(&v, 0, sizeof v);
    v.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v), CUDA_SUCCESS);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &got), CUDA_SUCCESS);
    printf("memory sync domain: %d\n", got.memSyncDomain);
    memset(&v, 0, sizeof v);
    v.priority = least;
    EXPECT(cuStreamSetAttribute(t, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v), CUDA_SUCCESS);
    int p;
    EXPECT(cuStreamGetPriority(t, &p), CUDA_SUCCESS);
    printf("priority set on t: the least %s\n", p == least ? "yes" : "no");

    EXPECT(cuStreamCopyAttributes(t, s), CUDA_SUCCESS);
    memset(&got, 0, sizeof got);
    EXPECT(cuStreamGetAttribute(t, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got), CUDA_SUCCESS);
    printf("copied to t: window over x %s, %zu bytes\n",
           got.accessPolicyWindow.base_ptr == (void *)(uintptr_t)x ? "yes" : "no",
           got.accessPolicyWindow.num_bytes);
    EXPECT(cuStreamGetAttribute(t, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &got), CUDA_SUCCESS);
    printf("copied to t: sync policy %d\n", got.syncPolicy);

    /* the work under the window, as simpleAttributes runs it */
    static float hx[1 << 18], hy[1 << 18];
    for (unsigned i = 0; i < n; i++) { hx[i] = (float)(i % 7); hy[i] = 1.0f; }
    EXPECT(cuMemcpyHtoD(x, hx, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(y, hy, n * 4), CUDA_SUCCESS);
    CUmodule mod;
    CUfunction f;
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    float a = 2.0f;
    unsigned count = n;
    void *args[] = { &a, &x, &y, &count };
    EXPECT(cuLaunchKernel(f, n / 256, 1, 1, 256, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(hy, y, n * 4), CUDA_SUCCESS);
    double sum = 0;
    for (unsigned i = 0; i < n; i++) sum += hy[i];
    printf("saxpy under the window: sum %.0f\n", sum);

    memset(&v, 0, sizeof v); /* a window of 0 bytes: the window is gone */
    EXPECT(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &v), CUDA_SUCCESS);
    EXPECT(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got), CUDA_SUCCESS);
    printf("reset: %zu bytes\n", got.accessPolicyWindow.num_bytes);
    EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(t), CUDA_SUCCESS);
    EXPECT(cuMemFree(x), CUDA_SUCCESS);
    EXPECT(cuMemFree(y), CUDA_SUCCESS);
    printf("stream_attributes: ok\n");
    return 0;
}
