// Several streams with async copies from pinned memory, kernels and events.
#include <cstdio>
__global__ void scale(float *x, float f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * f + 1;
}
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    const int S = 4, n = 1 << 18;
    cudaStream_t st[S];
    cudaEvent_t done[S], t0, t1;
    float *h, *d;
    CHECK(cudaMallocHost(&h, S * n * 4));
    CHECK(cudaMalloc(&d, S * n * 4));
    for (int i = 0; i < S * n; i++) h[i] = i % 100;
    CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
    CHECK(cudaEventRecord(t0, 0));
    for (int s = 0; s < S; s++) {
        CHECK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
        CHECK(cudaEventCreateWithFlags(&done[s], cudaEventDisableTiming));
        float *hp = h + s * n, *dp = d + s * n;
        CHECK(cudaMemcpyAsync(dp, hp, n * 4, cudaMemcpyHostToDevice, st[s]));
        scale<<<n / 256, 256, 0, st[s]>>>(dp, s + 1.0f, n);
        CHECK(cudaMemcpyAsync(hp, dp, n * 4, cudaMemcpyDeviceToHost, st[s]));
        CHECK(cudaEventRecord(done[s], st[s]));
    }
    for (int s = 0; s < S; s++) CHECK(cudaStreamWaitEvent(0, done[s], 0));
    CHECK(cudaEventRecord(t1, 0));
    CHECK(cudaEventSynchronize(t1));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    double sum[S] = {0};
    int bad = 0;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < n; i++) {
            float expect = ((s * n + i) % 100) * (s + 1.0f) + 1;
            sum[s] += h[s * n + i];
            if (h[s * n + i] != expect) bad++;
        }
    printf("streams_events: streams=%d sums=%.0f,%.0f,%.0f,%.0f mismatches=%d elapsed_positive=%d\n",
           S, sum[0], sum[1], sum[2], sum[3], bad, ms > 0);
    for (int s = 0; s < S; s++) { CHECK(cudaStreamDestroy(st[s])); CHECK(cudaEventDestroy(done[s])); }
    CHECK(cudaFreeHost(h)); CHECK(cudaFree(d));
    return bad != 0;
}
