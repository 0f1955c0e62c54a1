/* Page-locked host memory handed to calls that take device pointers, as unified
 * addressing allows (XLA sets its host buffers so): memsets of it, and device-to-device
 * copies with it on either side. It prints the same natively and through the shim. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                     \
            printf("%s: %d, line %d\n", #call, (int)r_, __LINE__);                    \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

enum { N = 4096 };

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, 0));
    uint32_t *host;
    CUdeviceptr d;
    CHECK(cuMemHostAlloc((void **)&host, N * 4, 0));
    CHECK(cuMemAlloc(&d, N * 4));
    CUdeviceptr h = (CUdeviceptr)(uintptr_t)host;

    CHECK(cuMemsetD32Async(d, 0x01020304u, N, s));
    CHECK(cuMemcpyDtoDAsync(h, d, N * 4, s)); /* device -> page-locked host */
    CHECK(cuMemsetD8Async(h + 4, 0xAB, 6, s)); /* after the copy, in stream order */
    CHECK(cuMemsetD16Async(h + 16, 0xBEEF, 2, s));
    CHECK(cuMemsetD32Async(h + 4 * (N - 1), 0xCAFEF00Du, 1, s));
    CHECK(cuStreamSynchronize(s));
    unsigned char *b = (unsigned char *)host;
    printf("host: first=%08x bytes4-9=%02x%02x%02x%02x%02x%02x byte10=%02x u16@16=%04x,%04x "
           "last=%08x\n", host[0], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           ((uint16_t *)b)[8], ((uint16_t *)b)[9], host[N - 1]);

    for (int i = 0; i < N; i++) host[i] = (uint32_t)i * 3u;
    CHECK(cuMemcpyDtoDAsync(d, h, N * 4, s)); /* page-locked host -> device */
    static uint32_t back[N];
    CHECK(cuMemcpyDtoH(back, d, N * 4));
    int same = !memcmp(back, host, sizeof back);
    CHECK(cuMemcpyDtoD(h, h + 8, 16)); /* both sides host */
    uint32_t word = 0, put = 77;
    CHECK(cuMemcpyDtoH(&word, h + 4 * 10, 4)); /* "device" to host: 30 */
    CHECK(cuMemcpyHtoD(h + 4 * 11, &put, 4));
    printf("device: from host ok=%d; host to host: %u %u; dtoh %u; htod %u\n", same, host[0],
           host[3], word, host[11]);
    CHECK(cuMemFreeHost(host));
    CHECK(cuMemFree(d));
    return 0;
}
