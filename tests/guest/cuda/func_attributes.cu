// Kernel attributes and occupancy as a framework asks for them, then steps.
//
//   func_attributes [STEPS]   (default 3)
//
// Prints what cudaFuncGetAttributes and the occupancy calculator say before and
// after cudaFuncSetAttribute, what an impossible set gives, then runs STEPS
// steps (the same set again, queries, launches with the dynamic shared memory
// the set allows, an event, a stream wait, a memset, one stream synchronise).
#include <cstdio>
#include <cstdlib>

__global__ void staged(float *out, int n) {
    __shared__ float fixed[1024];  // 4 KiB of static shared memory
    extern __shared__ float dynamic[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    fixed[threadIdx.x] = (float)threadIdx.x;
    dynamic[threadIdx.x] = 1.0f;
    __syncthreads();
    if (i < n) out[i] += fixed[threadIdx.x] + dynamic[threadIdx.x];
}

__global__ void twice(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] *= 2.0f;
}

#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

static void show(const char *what, const void *fn) {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, fn);
    printf("%s: %s static=%zu max_threads=%d max_dynamic=%d carveout=%d cluster_must=%d\n", what,
           cudaGetErrorString(e), a.sharedSizeBytes, a.maxThreadsPerBlock,
           a.maxDynamicSharedSizeBytes, a.preferredShmemCarveout, a.clusterDimMustBeSet);
}

int main(int argc, char **argv) {
    const int steps = argc > 1 ? atoi(argv[1]) : 3, n = 1 << 16, dyn = 100 << 10;
    int optin = 0, blocks = 0, grid = 0, block = 0;
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    show("staged", (const void *)staged);
    show("twice", (const void *)twice);
    cudaError_t e = cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         optin + 1);
    printf("past the opt-in limit: %s\n", cudaGetErrorString(e));
    CHECK(cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, staged, 256, dyn));
    printf("blocks per SM: %d", blocks);
    CHECK(cudaFuncSetAttribute(staged, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, staged, 256, dyn));
    printf(", at a 50%% carveout: %d\n", blocks);
    show("staged after the sets", (const void *)staged);
    show("twice after the sets", (const void *)twice);

    float *out, *scratch;
    cudaStream_t stream;
    cudaEvent_t done;
    CHECK(cudaMalloc(&out, n * sizeof(float)));
    CHECK(cudaMalloc(&scratch, n * sizeof(float)));
    CHECK(cudaMemset(out, 0, n * sizeof(float)));
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    for (int s = 0; s < steps; s++) {
        cudaFuncAttributes a;
        CHECK(cudaFuncSetAttribute(staged, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
        for (int again = 0; again < 10; again++) {
            CHECK(cudaFuncGetAttributes(&a, staged));
            CHECK(cudaFuncGetAttributes(&a, twice));
        }
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, staged, 256, dyn));
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, twice, 128, 0));
        CHECK(cudaOccupancyMaxPotentialBlockSize(&grid, &block, twice));
        staged<<<n / 256, 256, dyn, stream>>>(out, n);
        twice<<<n / block, block, 0, stream>>>(out, n);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(done, stream));
        CHECK(cudaStreamWaitEvent(0, done, 0));
        CHECK(cudaMemsetAsync(scratch, 0, n * sizeof(float), stream));
        CHECK(cudaStreamSynchronize(stream));  // the step's own synchronisation
    }
    float last;
    CHECK(cudaMemcpy(&last, out + n - 1, sizeof last, cudaMemcpyDeviceToHost));
    printf("func_attributes: steps=%d out[last]=%.1f\n", steps, last);
    return 0;
}
