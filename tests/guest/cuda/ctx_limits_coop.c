/* Context creation parameters, context limits and cooperative launches through the
 * shim (CI, against the GPU test double, whose PTX "saxpy" is its own kernel).
 * `quota`: a limit whose reservation does not fit the slice is refused.
 * Prints one line per step; any other status than the one expected says which. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)

static const char PTX[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry saxpy(.param .f32 a) { ret; }\n";

static int quota(void) {
    size_t v;
    EXPECT(cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
    EXPECT(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)1 << 30), CUDA_ERROR_OUT_OF_MEMORY);
    size_t after;
    EXPECT(cuCtxGetLimit(&after, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
    EXPECT(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, (size_t)16 << 20), CUDA_SUCCESS);
    printf("quota: a heap past the slice refused, the limit left at %s; 16 MiB taken\n",
           after == v ? "its value" : "another value");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CUexecAffinityParam aff = { CU_EXEC_AFFINITY_TYPE_SM_COUNT, { { 1 } } };
    CUctxCigParam cig = { CIG_DATA_TYPE_D3D12_COMMAND_QUEUE, NULL };
    CUctxCreateParams none = { NULL, 0, NULL }, affinity = { &aff, 1, NULL },
                      graphics = { NULL, 0, &cig };
    EXPECT(cuCtxCreate(&ctx, &affinity, 0, dev), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
    EXPECT(cuCtxCreate(&ctx, &graphics, 0, dev), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuCtxCreate(&ctx, &none, 0, dev), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy(ctx), CUDA_SUCCESS);
    EXPECT(cuCtxCreate(&ctx, NULL, 0, dev), CUDA_SUCCESS);
    printf("cuCtxCreate: NULL and empty params made a context; affinity and CIG refused\n");
    if (argc > 1 && !strcmp(argv[1], "quota")) return quota();

    size_t stack, heap;
    EXPECT(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4001), CUDA_SUCCESS);
    EXPECT(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE), CUDA_SUCCESS);
    EXPECT(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 32 << 20), CUDA_SUCCESS);
    EXPECT(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
    EXPECT(cuCtxSetLimit(CU_LIMIT_CIG_ENABLED, 1), CUDA_ERROR_UNSUPPORTED_LIMIT);
    printf("limits: stack %zu, heap %zu MiB\n", stack, heap >> 20);

    int coop, sms, per_sm;
    EXPECT(cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), CUDA_SUCCESS);
    CUmodule mod;
    CUfunction f;
    EXPECT(cuModuleLoadData(&mod, PTX), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    EXPECT(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, 256, 0), CUDA_SUCCESS);
    CUdeviceptr x, y;
    EXPECT(cuMemAlloc(&x, 4096), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&y, 4096), CUDA_SUCCESS);
    float a = 2.0f, ones[1024], out[1024];
    int n = 1024;
    for (int i = 0; i < n; i++) ones[i] = 1.0f;
    EXPECT(cuMemcpyHtoD(x, ones, sizeof ones), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(y, ones, sizeof ones), CUDA_SUCCESS);
    void *params[] = { &a, &x, &y, &n };
    unsigned most = (unsigned)(per_sm * sms);
    EXPECT(cuLaunchCooperativeKernel(f, most + 1, 1, 1, 256, 1, 1, 0, NULL, params),
           CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    EXPECT(cuLaunchCooperativeKernel(f, 4, 1, 1, 256, 1, 1, 0, NULL, params), CUDA_SUCCESS);
    CUlaunchAttribute attr = { .id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value.cooperative = 1 };
    CUlaunchConfig cfg = { most + 1, 1, 1, 256, 1, 1, 0, NULL, &attr, 1 };
    EXPECT(cuLaunchKernelEx(&cfg, f, params, NULL), CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    cfg.gridDimX = most;
    EXPECT(cuLaunchKernelEx(&cfg, f, params, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(out, y, sizeof out), CUDA_SUCCESS);
    CUDA_LAUNCH_PARAMS both = { f, 1, 1, 1, 256, 1, 1, 0, NULL, params };
    EXPECT(cuLaunchCooperativeKernelMultiDevice(&both, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
    printf("cooperative: supported %d; a grid past the resident blocks refused at the call, "
           "two launches ran: y = %g\n", coop, out[0]);
    printf("ctx_limits_coop: ok\n");
    return 0;
}
