// The shim's half of bench/data_lane.py: one CUDA program, built with nvcc's
// defaults (static cudart) and run twice in the same benchmark run, once on
// the real driver and once through hvgpu's libcuda.so.1. Prints one JSON object.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cublas_v2.h>

__global__ void noop(float *x, int n) {}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define CHECK(x) do { cudaError_t e = (x); if (e) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char **argv) {
    int quick = argc > 1;
    float *d;
    CHECK(cudaMalloc(&d, 64));
    // pipelined launches of an empty kernel
    int n = quick ? 20000 : 100000;
    for (int i = 0; i < 1000; i++) noop<<<1, 32>>>(d, 0);
    CHECK(cudaDeviceSynchronize());
    std::vector<double> rates;
    for (int r = 0; r < 3; r++) {
        double t = now();
        for (int i = 0; i < n; i++) noop<<<1, 32>>>(d, 0);
        CHECK(cudaDeviceSynchronize());
        rates.push_back(n / (now() - t));
    }
    printf("{\"launch_rate\": %.1f", median(rates));
    // cuBLAS sgemm 4096
    const int m = 4096;
    float *A, *B, *C, one = 1, zero = 0;
    CHECK(cudaMalloc(&A, (size_t)m * m * 4)); CHECK(cudaMalloc(&B, (size_t)m * m * 4));
    CHECK(cudaMalloc(&C, (size_t)m * m * 4));
    CHECK(cudaMemset(A, 0, (size_t)m * m * 4)); CHECK(cudaMemset(B, 0, (size_t)m * m * 4));
    cublasHandle_t h;
    if (cublasCreate(&h)) { fprintf(stderr, "cublasCreate failed\n"); return 1; }
    for (int i = 0; i < 3; i++) cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A, m, B, m, &zero, C, m);
    CHECK(cudaDeviceSynchronize());
    std::vector<double> tflops;
    int reps = quick ? 5 : 20;
    for (int r = 0; r < 3; r++) {
        double t = now();
        for (int i = 0; i < reps; i++)
            cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, A, m, B, m, &zero, C, m);
        CHECK(cudaDeviceSynchronize());
        tflops.push_back(2.0 * m * m * (double)m * reps / (now() - t) / 1e12);
    }
    printf(", \"sgemm_4096\": %.3f", median(tflops));
    cublasDestroy(h);
    // copy sweep: pageable host memory, then cudaMallocHost (pinned) at the large sizes
    const size_t GiB = (size_t)1 << 30;
    size_t sizes[] = { 4096, 256 << 10, 4 << 20, 64 << 20, GiB };
    const char *labels[] = { "4 KiB", "256 KiB", "4 MiB", "64 MiB", "1 GiB" };
    char *host = (char *)malloc(GiB), *dev, *pinned;
    for (size_t i = 0; i < GiB; i++) host[i] = (char)i;
    CHECK(cudaMalloc(&dev, GiB));
    CHECK(cudaMallocHost(&pinned, GiB));
    memcpy(pinned, host, GiB);
    for (int kind = 0; kind < 2; kind++) {
        for (int s = kind ? 3 : 0; s < 5; s++) {
            size_t sz = sizes[s];
            char *h = kind ? pinned : host;
            int k = sz >= GiB ? (quick ? 2 : 3) : sz >= (4u << 20) ? (quick ? 5 : 20)
                                                                   : (quick ? 200 : 1000);
            for (int dir = 0; dir < 2; dir++) {
                std::vector<double> gbs;
                for (int r = 0; r < 3; r++) {
                    double t = now();
                    for (int i = 0; i < k; i++) {
                        if (dir == 0) CHECK(cudaMemcpy(dev, h, sz, cudaMemcpyHostToDevice));
                        else CHECK(cudaMemcpy(h, dev, sz, cudaMemcpyDeviceToHost));
                    }
                    CHECK(cudaDeviceSynchronize());
                    gbs.push_back(sz * (double)k / (now() - t) / 1e9);
                }
                printf(", \"%s%s_%s\": %.3f", kind ? "pinned_" : "", dir ? "d2h" : "h2d",
                       labels[s], median(gbs));
            }
        }
    }
    // the bytes that went round trip through both paths are the ones that left
    CHECK(cudaMemcpy(dev, host, GiB, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(pinned, dev, GiB, cudaMemcpyDeviceToHost));
    if (memcmp(pinned, host, GiB)) { fprintf(stderr, "copies returned wrong bytes\n"); return 1; }
    CHECK(cudaFreeHost(pinned));
    printf("}\n");
    return 0;
}
