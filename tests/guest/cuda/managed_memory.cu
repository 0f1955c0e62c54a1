// Managed memory as the cuda-samples use it (UnifiedMemoryStreams: OpenMP threads, each
// a stream with its memory attached; conjugateGradientUM; conjugateGradientMultiBlockCG:
// a cooperative kernel on managed memory): printed the same natively and through the
// shim (test_shim_features_gpu.py), which says CONCURRENT_MANAGED_ACCESS 0, so the
// program follows the rules for such a device (it synchronises before touching it).
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
#include <omp.h>

namespace cg = cooperative_groups;

__global__ void scale(float *v, int n, float by) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        v[i] *= by;
}

__global__ void dot(const float *a, const float *b, int n, double *out) {
    cg::grid_group grid = cg::this_grid();
    if (grid.thread_rank() == 0) *out = 0;
    grid.sync();
    double sum = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) sum += a[i] * b[i];
    atomicAdd(out, sum);
}

#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("%s: %s\n", #call, cudaGetErrorName(e_)); return 1; } } while (0)

int main() {
    int managed = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, 0));
    printf("managed memory: %d\n", managed);
    const int n = 1 << 22;
    float *a, *b;
    double *result;
    CHECK(cudaMallocManaged(&a, n * sizeof(float)));
    CHECK(cudaMallocManaged(&b, n * sizeof(float)));
    CHECK(cudaMallocManaged(&result, sizeof(double)));
    for (int i = 0; i < n; i++) { a[i] = 1.0f; b[i] = (float)(i % 7); }
    scale<<<256, 256>>>(a, n, 3.0f);
    CHECK(cudaDeviceSynchronize());
    printf("after scale: a[0] %g a[n-1] %g\n", a[0], a[n - 1]);
    a[0] = 100.0f;  // the host's write reaches the next kernel
    scale<<<256, 256>>>(a, n, 0.5f);
    CHECK(cudaDeviceSynchronize());
    printf("host write then scale: a[0] %g a[1] %g\n", a[0], a[1]);

    int per_sm = 0;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dot, 256, 0));
    int blocks = per_sm * prop.multiProcessorCount;
    int nn = n;
    void *args[] = {&a, &b, &nn, &result};
    CHECK(cudaLaunchCooperativeKernel((void *)dot, blocks, 256, args, 0, 0));
    CHECK(cudaDeviceSynchronize());
    printf("cooperative dot on managed memory: %.1f\n", *result);

    CHECK(cudaMemAdvise(b, n * sizeof(float), cudaMemAdviseSetReadMostly,
                        cudaMemLocation{cudaMemLocationTypeDevice, 0}));
    CHECK(cudaMemPrefetchAsync(b, n * sizeof(float), cudaMemLocation{cudaMemLocationTypeDevice, 0}, 0));
    int read_mostly = 0;
    CHECK(cudaMemRangeGetAttribute(&read_mostly, 4, cudaMemRangeAttributeReadMostly, b,
                                   n * sizeof(float)));
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, b));
    printf("read mostly %d, pointer type managed %d\n", read_mostly,
           pa.type == cudaMemoryTypeManaged);

    // UnifiedMemoryStreams' shape: each thread a stream, its memory attached to it,
    // host work on one task's memory while another task's kernel runs
    const int tasks = 8, m = 1 << 16;
    float *data[tasks];
    cudaStream_t streams[tasks];
    for (int t = 0; t < tasks; t++) {
        CHECK(cudaStreamCreate(&streams[t]));
        CHECK(cudaMallocManaged(&data[t], m * sizeof(float), cudaMemAttachHost));
        CHECK(cudaStreamAttachMemAsync(streams[t], data[t], 0, cudaMemAttachSingle));
        CHECK(cudaStreamSynchronize(streams[t]));
    }
    int bad = 0;
#pragma omp parallel for num_threads(4) reduction(+ : bad)
    for (int t = 0; t < tasks; t++) {
        for (int round = 0; round < 20; round++) {
            for (int i = 0; i < m; i++) data[t][i] = (float)(t + round);
            scale<<<64, 256, 0, streams[t]>>>(data[t], m, 2.0f);
            cudaStreamSynchronize(streams[t]);
            for (int i = 0; i < m; i++) bad += data[t][i] != 2.0f * (t + round);
        }
    }
    printf("8 tasks on 4 threads, 20 rounds each: %d wrong values\n", bad);
    for (int t = 0; t < tasks; t++) {
        CHECK(cudaFree(data[t]));
        CHECK(cudaStreamDestroy(streams[t]));
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(result));
    printf("managed_memory: ok\n");
    return 0;
}
