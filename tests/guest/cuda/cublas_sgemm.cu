// cuBLAS sgemm, checked against the CPU on a sample of entries.
#include <cmath>
#include <cstdio>
#include <vector>
#include <cublas_v2.h>
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
#define CHECKB(x) do { cublasStatus_t e = (x); if (e) { printf("%s: cublas status %d\n", #x, (int)e); return 1; } } while (0)
int main() {
    const int n = 1024;
    std::vector<float> A(n * n), B(n * n), C(n * n);
    for (int i = 0; i < n * n; i++) { A[i] = (i % 17) * 0.125f - 1; B[i] = (i % 5) * 0.25f; }
    float *dA, *dB, *dC, one = 1, zero = 0;
    CHECK(cudaMalloc(&dA, n * n * 4)); CHECK(cudaMalloc(&dB, n * n * 4)); CHECK(cudaMalloc(&dC, n * n * 4));
    CHECK(cudaMemcpy(dA, A.data(), n * n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, B.data(), n * n * 4, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    CHECKB(cublasCreate(&h));
    CHECKB(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    CHECKB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dA, n, dB, n, &zero, dC, n));
    CHECK(cudaMemcpy(C.data(), dC, n * n * 4, cudaMemcpyDeviceToHost));
    double maxerr = 0;
    for (int i = 0; i < n; i += 31) for (int j = 0; j < n; j += 29) {
        double ref = 0;  // column-major: C(i,j) = sum_k A(i,k) B(k,j)
        for (int k = 0; k < n; k++) ref += (double)A[k * n + i] * B[j * n + k];
        maxerr = fmax(maxerr, fabs(ref - C[j * n + i]));
    }
    printf("cublas_sgemm: n=%d C[0]=%.3f C[last]=%.3f max_abs_error=%s\n", n, C[0], C[n * n - 1],
           maxerr < 1e-2 ? "ok" : "BAD");
    CHECKB(cublasDestroy(h));
    return maxerr >= 1e-2;
}
