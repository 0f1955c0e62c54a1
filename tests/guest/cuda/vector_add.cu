// Vector add with a __constant__ scale set through cudaMemcpyToSymbol.
#include <cstdio>
#include <vector>
__constant__ float scale;
__global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = scale * (a[i] + b[i]);
}
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    const int n = 1 << 20;
    std::vector<float> a(n), b(n), c(n);
    for (int i = 0; i < n; i++) { a[i] = i % 1000; b[i] = (i % 7) * 0.5f; }
    float *da, *db, *dc, s = 3.0f;
    CHECK(cudaMalloc(&da, n * 4)); CHECK(cudaMalloc(&db, n * 4)); CHECK(cudaMalloc(&dc, n * 4));
    CHECK(cudaMemcpyToSymbol(scale, &s, sizeof s));
    CHECK(cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice));
    add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost));
    int bad = 0; double sum = 0;
    for (int i = 0; i < n; i++) { sum += c[i]; if (c[i] != 3.0f * (a[i] + b[i])) bad++; }
    printf("vector_add: n=%d sum=%.1f mismatches=%d\n", n, sum, bad);
    CHECK(cudaFree(da)); CHECK(cudaFree(db)); CHECK(cudaFree(dc));
    return bad != 0;
}
