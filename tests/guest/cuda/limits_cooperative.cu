// Context limits and cooperative launches as the cuda-samples use them (interval,
// newdelete, simpleAttributes, reductionMultiBlockCG): printed the same natively and
// through the shim (test_shim_issue27_gpu.py). Nothing printed depends on the GPU's size.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

__device__ int depth(int n) { return n ? 1 + depth(n - 1) : 0; }  // uses the stack

__global__ void recurse(int n, int *out) { *out = depth(n); }

__global__ void heap(int *out) {
    int *p = (int *)malloc(1 << 20);  // from the heap cudaLimitMallocHeapSize sized
    *out = p != nullptr;
    free(p);
}

// Each block sums its part, the grid synchronises, block 0 adds the parts.
__global__ void reduce(const int *in, int n, int *parts, int *total) {
    cg::grid_group grid = cg::this_grid();
    int sum = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) sum += in[i];
    atomicAdd(&parts[blockIdx.x], sum);
    grid.sync();
    if (grid.thread_rank() == 0) {
        int t = 0;
        for (unsigned b = 0; b < gridDim.x; b++) t += parts[b];
        *total = t;
    }
}

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("%s: %s\n", #call, cudaGetErrorName(e_)); return 1; } } while (0)

int main() {
    // cuCtxCreate with CUctxCreateParams (CUDA 12.5+), as nvrtc_helper.h makes its context
    CUdevice dev;
    CUcontext ctx;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    CUctxCreateParams none = {};
    printf("cuCtxCreate(empty params): %d\n", (int)cuCtxCreate(&ctx, &none, 0, dev));
    printf("cuCtxCreate(NULL params): %d\n", (int)cuCtxCreate(&ctx, nullptr, 0, dev));
    cuCtxDestroy(ctx);

    size_t stack = 0, fifo = 0, heap_size = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 16 * 1024));
    CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4 << 20));
    CHECK(cudaDeviceGetLimit(&fifo, cudaLimitPrintfFifoSize));
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 64 << 20));
    CHECK(cudaDeviceGetLimit(&heap_size, cudaLimitMallocHeapSize));
    printf("limits: stack %zu, printf fifo %zu, heap %zu\n", stack, fifo, heap_size);
    int *out;
    CHECK(cudaMalloc(&out, sizeof(int)));
    recurse<<<1, 1>>>(200, out);
    int got = 0;
    CHECK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    printf("recursion depth %d\n", got);
    heap<<<1, 1>>>(out);
    CHECK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    printf("device malloc of 1 MiB: %s\n", got ? "ok" : "failed");
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t persisting = prop.persistingL2CacheMaxSize / 2;
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, persisting));
    size_t back = 0;
    CHECK(cudaDeviceGetLimit(&back, cudaLimitPersistingL2CacheSize));
    printf("persisting L2: %s\n", back >= persisting ? "set" : "not set");

    int coop = 0;
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    printf("cooperative launch: %d\n", coop);
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reduce, 256, 0));
    int blocks = per_sm * prop.multiProcessorCount, n = 1 << 20;
    int *in, *parts, *total;
    CHECK(cudaMalloc(&in, n * sizeof(int)));
    CHECK(cudaMalloc(&parts, (blocks + 1) * sizeof(int)));
    CHECK(cudaMalloc(&total, sizeof(int)));
    int *ones = new int[n];
    for (int i = 0; i < n; i++) ones[i] = 1;
    CHECK(cudaMemcpy(in, ones, n * sizeof(int), cudaMemcpyHostToDevice));
    for (int grid : {blocks, blocks / 2}) {
        CHECK(cudaMemset(parts, 0, (blocks + 1) * sizeof(int)));
        void *args[] = {&in, &n, &parts, &total};
        CHECK(cudaLaunchCooperativeKernel((void *)reduce, grid, 256, args, 0, 0));
        CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
        printf("cooperative sum over %s grid: %d\n", grid == blocks ? "a full" : "half a", got);
    }
    void *args[] = {&in, &n, &parts, &total};
    cudaError_t e = cudaLaunchCooperativeKernel((void *)reduce, blocks + 1, 256, args, 0, 0);
    printf("one block too many: %s at the call\n", cudaGetErrorName(e));
    CHECK(cudaDeviceSynchronize());
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = blocks;
    cfg.blockDim = 256;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cudaMemset(parts, 0, (blocks + 1) * sizeof(int)));
    CHECK(cudaLaunchKernelEx(&cfg, reduce, (const int *)in, n, parts, total));
    CHECK(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost));
    printf("cudaLaunchKernelEx(cooperative) sum: %d\n", got);
    cfg.gridDim = blocks + 1;
    e = cudaLaunchKernelEx(&cfg, reduce, (const int *)in, n, parts, total);
    printf("cudaLaunchKernelEx, one block too many: %s at the call\n", cudaGetErrorName(e));
    CHECK(cudaDeviceSynchronize());
    printf("limits_cooperative: ok\n");
    return 0;
}
