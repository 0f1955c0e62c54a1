// Device-to-device copies and memsets, checked on the host.
#include <cstdio>
#include <cstring>
#define CHECK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main() {
    const size_t n = 3 << 20;
    unsigned char *a, *b, *h = new unsigned char[n];
    CHECK(cudaMalloc(&a, n)); CHECK(cudaMalloc(&b, n));
    CHECK(cudaMemset(a, 0x5a, n));
    CHECK(cudaMemset(a + 1000, 0x11, 5000));
    CHECK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(b + 7, a + 1000, 100, cudaMemcpyDefault));
    CHECK(cudaMemcpy(h, b, n, cudaMemcpyDeviceToHost));
    size_t c5a = 0, c11 = 0;
    for (size_t i = 0; i < n; i++) { c5a += h[i] == 0x5a; c11 += h[i] == 0x11; }
    int *w;
    CHECK(cudaMalloc(&w, 1024 * 4));
    CHECK(cudaMemsetAsync(w, 0xff, 1024 * 4, 0));
    int hw[1024];
    CHECK(cudaMemcpyAsync(hw, w, sizeof hw, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    // a pitched 300 x 16 byte matrix, there and back by 2D copies
    unsigned char *m, src[16][300], back[16][300];
    size_t pitch;
    CHECK(cudaMallocPitch((void **)&m, &pitch, 300, 16));
    for (int r = 0; r < 16; r++) for (int c = 0; c < 300; c++) src[r][c] = (unsigned char)(r * 7 + c);
    CHECK(cudaMemcpy2D(m, pitch, src, 300, 300, 16, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(back, 300, m, pitch, 300, 16, cudaMemcpyDeviceToHost));
    int pitched_ok = !memcmp(src, back, sizeof src) && pitch >= 300;
    printf("copies_memset: bytes=%zu 0x5a=%zu 0x11=%zu ints_all_minus1=%d pitch=%zu pitched_ok=%d\n",
           n, c5a, c11, hw[0] == -1 && hw[1023] == -1, pitch, pitched_ok);
    CHECK(cudaFree(a)); CHECK(cudaFree(b)); CHECK(cudaFree(w)); CHECK(cudaFree(m));
    return !(c11 == 5100 && c5a == n - 5100 && pitched_ok);
}
