// A host-memory stand-in for the CUDA runtime and cuBLAS, just enough for
// bench/shim_bench.cu to build with g++ and run here without a GPU
// (tests/bench/test_shim_bench.py). "Device" memory is host memory; kernels run on
// the calling thread. STUB_FAULT breaks one thing, as a broken lane would:
//   no-h2d       host-to-device copies do nothing
//   short-d2h    device-to-host copies leave out their last byte
//   drop-launch  every seventh launch does not run
//   no-sgemm     cublasSgemm does nothing
#pragma once
#include <cstdlib>
#include <cstring>

#define __global__
struct stub_dim3 { unsigned x, y, z; };
static const stub_dim3 threadIdx = {0, 0, 0};

typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };

static bool stub_fault(const char *name) {
    const char *f = getenv("STUB_FAULT");
    return f && !strcmp(f, name);
}
static inline const char *cudaGetErrorString(cudaError_t) { return "stub error"; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
static inline cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n); return *p ? 0 : 2; }
static inline cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind k) {
    if (k == cudaMemcpyHostToDevice && stub_fault("no-h2d")) return cudaSuccess;
    if (k == cudaMemcpyDeviceToHost && stub_fault("short-d2h") && n > 1) n -= 1;
    memcpy(d, s, n);
    return cudaSuccess;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    static unsigned calls = 0;
    unsigned old = *p;
    if (!(stub_fault("drop-launch") && ++calls % 7 == 0)) *p += v;
    return old;
}

typedef struct stub_handle *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
enum cublasOperation_t { CUBLAS_OP_N };
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = 0; return 0; }
static inline cublasStatus_t cublasDestroy(cublasHandle_t) { return 0; }
static inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                         int m, int n, int k, const float *alpha, const float *A,
                                         int lda, const float *B, int ldb, const float *beta,
                                         float *C, int ldc) {
    if (stub_fault("no-sgemm")) return 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0;
            for (int x = 0; x < k; x++) s += A[i + x * lda] * B[x + j * ldb];
            C[i + j * ldc] = *alpha * s + (*beta == 0 ? 0 : *beta * C[i + j * ldc]);  // beta 0: C unread
        }
    return 0;
}
