// Two devices in one program: y0 = 2x on device 0, copied peer-to-peer to device 1,
// y1 = 3 * that there (with a stream and an event of device 1), read back: 6x.
#include <cstdio>
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
int main() {
    const int n = 1 << 16;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count < 2) { printf("multi_device: needs 2 devices, found %d\n", count); return 1; }
    static float host[n];
    for (int i = 0; i < n; i++) host[i] = (float)i;
    float *x0, *y0, *x1, *y1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&x0, n * 4)); CHECK(cudaMalloc(&y0, n * 4));
    CHECK(cudaMemcpy(x0, host, n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(y0, 0, n * 4));
    saxpy<<<(n + 255) / 256, 256>>>(2.0f, x0, y0, n);
    CHECK(cudaGetLastError());
    CHECK(cudaSetDevice(1));
    cudaStream_t s;
    cudaEvent_t done;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&done));
    CHECK(cudaMalloc(&x1, n * 4)); CHECK(cudaMalloc(&y1, n * 4));
    CHECK(cudaMemcpyPeer(x1, 1, y0, 0, n * 4));
    CHECK(cudaMemsetAsync(y1, 0, n * 4, s));
    saxpy<<<(n + 255) / 256, 256, 0, s>>>(3.0f, x1, y1, n);
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaEventSynchronize(done));
    CHECK(cudaMemcpy(host, y1, n * 4, cudaMemcpyDeviceToHost));
    int device = -1;
    CHECK(cudaGetDevice(&device));
    // Unified addressing: device 0's memory, asked about and read with device 1 current.
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, y0));
    static float back[n];
    CHECK(cudaMemcpy(back, y0, n * 4, cudaMemcpyDefault));
    int mismatches = 0, uva_mismatches = 0;
    for (int i = 0; i < n; i++) {
        mismatches += host[i] != 6.0f * i;
        uva_mismatches += back[i] != 2.0f * i;
    }
    printf("multi_device: devices=%d current=%d y0_on=%d out[1]=%.1f out[last]=%.1f mismatches=%d "
           "uva_mismatches=%d\n", count, device, attr.device, host[1], host[n - 1], mismatches,
           uva_mismatches);
    CHECK(cudaSetDevice(0));
    fprintf(stderr, "addresses: device 0 %p %p, device 1 %p %p\n", (void *)x0, (void *)y0,
            (void *)x1, (void *)y1);
    CHECK(cudaFree(x0)); CHECK(cudaFree(y0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaStreamDestroy(s)); CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(x1)); CHECK(cudaFree(y1));
    return mismatches != 0 || uva_mismatches != 0;
}
