#include <cstdio>
#include <cstdlib>
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
int main() {
    const int n = 1 << 16;
    float *x = (float *)malloc(n * 4), *y = (float *)malloc(n * 4);
    for (int i = 0; i < n; i++) { x[i] = i; y[i] = 1; }
    float *dx, *dy;
    cudaError_t e = cudaMalloc(&dx, n * 4);
    if (e) { printf("cudaMalloc: %s\n", cudaGetErrorString(e)); return 1; }
    cudaMalloc(&dy, n * 4);
    cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dy, y, n * 4, cudaMemcpyHostToDevice);
    saxpy<<<(n + 255) / 256, 256>>>(2.0f, dx, dy, n);
    e = cudaMemcpy(y, dy, n * 4, cudaMemcpyDeviceToHost);
    printf("copy back: %s\n", cudaGetErrorString(e));
    double sum = 0; for (int i = 0; i < n; i++) sum += y[i];
    printf("sum %.1f (expect %.1f)\n", sum, 2.0 * (double)n * (n - 1) / 2 + n);
    cudaFree(dx); cudaFree(dy);
    return 0;
}
