// Tiled shared-memory matrix multiply, checked against the CPU.
#include <cmath>
#include <cstdio>
#include <vector>
#define T 16
__global__ void matmul(const float *A, const float *B, float *C, int n) {
    __shared__ float as[T][T], bs[T][T];
    int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
    float acc = 0;
    for (int k = 0; k < n; k += T) {
        as[threadIdx.y][threadIdx.x] = A[r * n + k + threadIdx.x];
        bs[threadIdx.y][threadIdx.x] = B[(k + threadIdx.y) * n + c];
        __syncthreads();
        for (int j = 0; j < T; j++) acc += as[threadIdx.y][j] * bs[j][threadIdx.x];
        __syncthreads();
    }
    C[r * n + c] = acc;
}
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    const int n = 512;
    std::vector<float> A(n * n), B(n * n), C(n * n);
    for (int i = 0; i < n * n; i++) { A[i] = (i % 13) * 0.25f; B[i] = (i % 11) * 0.5f - 2; }
    float *dA, *dB, *dC;
    CHECK(cudaMalloc(&dA, n * n * 4)); CHECK(cudaMalloc(&dB, n * n * 4)); CHECK(cudaMalloc(&dC, n * n * 4));
    CHECK(cudaMemcpy(dA, A.data(), n * n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, B.data(), n * n * 4, cudaMemcpyHostToDevice));
    matmul<<<dim3(n / T, n / T), dim3(T, T)>>>(dA, dB, dC, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(C.data(), dC, n * n * 4, cudaMemcpyDeviceToHost));
    double maxerr = 0, sum = 0;
    for (int r = 0; r < n; r += 37) for (int c = 0; c < n; c += 41) {
        double ref = 0;
        for (int k = 0; k < n; k++) ref += (double)A[r * n + k] * B[k * n + c];
        maxerr = fmax(maxerr, fabs(ref - C[r * n + c]));
    }
    for (int i = 0; i < n * n; i++) sum += C[i];
    printf("matmul_tiled: n=%d checksum=%.3e max_abs_error=%s\n", n, sum, maxerr < 1e-2 ? "ok" : "BAD");
    return maxerr >= 1e-2;
}
