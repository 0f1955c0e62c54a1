// Launches the driver refuses, and synchronisations after them, as a program sees
// them: each bad launch's status at the call (cudaGetLastError), and a 300 ms kernel
// that every synchronisation waits for, whatever the calls in between returned.
//
//   launch_limits limits    one line per refused configuration
//   launch_limits waits     device, stream and event synchronisation after a bad launch
//   launch_limits bounded   a kernel whose own block limit (__launch_bounds__) is passed
//   launch_limits deferred  an asynchronous memset of memory nobody allocated, then a
//                           synchronisation (through hvgpu its error surfaces there)
//
// Kernels are extern "C" with the names the GPU test double knows (sleep_ms, noop,
// matmul), so the same program runs against it in CI. Times are printed on their own
// lines ("ms ..."), which the tests read apart from the statuses.
#include <chrono>
#include <cstdio>
#include <cstring>

extern "C" __global__ void sleep_ms(int ms) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    while (now - start < (unsigned long long)ms * 1000000ull);
}
extern "C" __global__ void noop() {}
// 8 KiB of static shared memory: what the double's matmul declares too.
extern "C" __global__ void matmul(float *a, float *b, float *c, int n) {
    __shared__ float tile[2048];
    extern __shared__ float dyn[];
    int i = threadIdx.x;
    tile[i] = i < n * n ? a[i] : 0.f;
    __syncthreads();
    if (i < n * n) c[i] = tile[i] * b[i] + (blockDim.x > 4096 ? dyn[0] : 0.f);
}
extern "C" __global__ void __launch_bounds__(128) bounded(int *out) { out[threadIdx.x] = 1; }

static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

#define LAUNCH(name, kernel, grid, block, smem, ...) do { \
        kernel<<<grid, block, smem>>>(__VA_ARGS__); \
        printf("%s: %d\n", name, (int)cudaGetLastError()); } while (0)

static int limits() {
    float *d;
    cudaMalloc(&d, 64);
    cudaMemset(d, 0, 64);
    LAUNCH("threads 1025", noop, 1, 1025, 0);
    LAUNCH("block x 2048", noop, 1, dim3(2048, 1, 1), 0);
    LAUNCH("block z 65", noop, 1, dim3(1, 1, 65), 0);
    LAUNCH("block 32x32x2", noop, 1, dim3(32, 32, 2), 0);
    LAUNCH("grid y 65536", noop, dim3(1, 65536, 1), 1, 0);
    LAUNCH("grid z 65536", noop, dim3(1, 1, 65536), 1, 0);
    LAUNCH("grid 0", noop, 0, 1, 0);
    LAUNCH("block 0", noop, 1, 0, 0);
    LAUNCH("grid 1x0x1", noop, dim3(1, 0, 1), 1, 0);
    LAUNCH("shared 1 MiB", noop, 1, 1, 1 << 20);
    LAUNCH("matmul shared 45000 without the attribute", matmul, 1, 32, 45000, d, d, d, 2);
    printf("set max dynamic shared 20000: %d\n",
           (int)cudaFuncSetAttribute(matmul, cudaFuncAttributeMaxDynamicSharedMemorySize, 20000));
    LAUNCH("matmul shared 24000 past it", matmul, 1, 32, 24000, d, d, d, 2);
    LAUNCH("matmul shared 16000 within it", matmul, 1, 32, 16000, d, d, d, 2);
    LAUNCH("noop 1024 threads", noop, 1, 1024, 0);
    LAUNCH("noop 32x32x1", noop, 1, dim3(32, 32, 1), 0);
    LAUNCH("noop grid y 65535", noop, dim3(1, 65535, 1), 1, 0);
    printf("synchronize: %d\n", (int)cudaDeviceSynchronize());
    cudaFree(d);
    return 0;
}

static int waits() {
    cudaStream_t s;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEventCreate(&e);
    for (const char *how : {"device", "stream", "event"}) {
        auto t0 = std::chrono::steady_clock::now();
        sleep_ms<<<1, 1, 0, s>>>(300);
        cudaEventRecord(e, s);
        noop<<<1, 1025, 0, s>>>();
        int launch = (int)cudaGetLastError();
        int sync = !strcmp(how, "device") ? (int)cudaDeviceSynchronize()
                 : !strcmp(how, "stream") ? (int)cudaStreamSynchronize(s)
                 : (int)cudaEventSynchronize(e);
        double waited = since(t0);
        int query = (int)cudaStreamQuery(s);
        printf("%s: bad launch %d, synchronize %d, then the stream %d\n", how, launch, sync, query);
        printf("ms %s %.0f\n", how, waited);
    }
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    return 0;
}

static int bounded_limit() {
    int *d;
    cudaMalloc(&d, 1024 * sizeof(int));
    cudaFuncAttributes a;
    cudaFuncGetAttributes(&a, bounded);
    printf("bounded max threads: %d\n", a.maxThreadsPerBlock);
    LAUNCH("bounded 128", bounded, 1, 128, 0, d);
    LAUNCH("bounded 256", bounded, 1, 256, 0, d);
    printf("synchronize: %d\n", (int)cudaDeviceSynchronize());
    cudaFree(d);
    return 0;
}

static int deferred() {
    auto t0 = std::chrono::steady_clock::now();
    sleep_ms<<<1, 1>>>(300);
    int memset = (int)cudaMemsetAsync((void *)0x10, 0, 16, 0);
    int sync = (int)cudaDeviceSynchronize();
    double waited = since(t0);
    printf("deferred: memset %d, synchronize %d%s, then the stream %d\n", memset, sync,
           memset || sync ? " (one of them failed)" : "", (int)cudaStreamQuery(0));
    printf("ms deferred %.0f\n", waited);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "limits";
    if (!strcmp(mode, "limits")) return limits();
    if (!strcmp(mode, "waits")) return waits();
    if (!strcmp(mode, "bounded")) return bounded_limit();
    if (!strcmp(mode, "deferred")) return deferred();
    fprintf(stderr, "launch_limits: unknown mode %s\n", mode);
    return 2;
}
