/* The driver API's copies through pinned and staged host memory, where they fail and
 * from several threads at once. Linked against libcuda.so.1 by name: the shim, or
 * natively the real driver.
 *
 *   region_driver errors   copies past the end of an allocation fail (every reply of a
 *                       staged copy read), and the next copies work
 *   region_driver threads  four threads copy 12 MiB + odd bytes both ways, pageable and
 *                       pinned, at the same time, each on its own stream
 */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d\n", #x, (int)r_); exit(1); } } while (0)
#define MiB (1u << 20)

static CUcontext ctx;

static void fill(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; p[i] = (unsigned char)(x >> 16); }
}

static size_t differ(const unsigned char *a, unsigned seed, size_t n) {
    unsigned char *want = malloc(n);
    fill(want, n, seed);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != want[i];
    free(want);
    return bad;
}

static int errors(void) {
    size_t big = 20 * MiB + 12345, small = 4 * MiB;
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, small));
    unsigned char *page = malloc(big), *pin;
    CHECK(cuMemAllocHost((void **)&pin, big));
    fill(page, big, 7);
    fill(pin, big, 8);
    /* Past the allocation's end: refused, and the connection goes on. */
    int h2d = cuMemcpyHtoD(d, page, big);
    int h2d_pinned = cuMemcpyHtoD(d, pin, big);
    int d2h = cuMemcpyDtoH(page, d, big);
    int d2h_pinned = cuMemcpyDtoH(pin, d, big);
    CHECK(cuMemcpyHtoD(d, page, small));
    memset(pin, 0, small);
    CHECK(cuMemcpyDtoH(pin, d, small));
    size_t bad = differ(pin, 7, small);
    fill(pin, small, 9);
    CHECK(cuMemcpyHtoD(d, pin, small));
    memset(page, 0, small);
    CHECK(cuMemcpyDtoH(page, d, small));
    bad += differ(page, 9, small);
    printf("region_driver errors: htod=%d htod_pinned=%d dtoh=%d dtoh_pinned=%d then wrong=%zu\n",
           h2d, h2d_pinned, d2h, d2h_pinned, bad);
    CHECK(cuMemFreeHost(pin));
    CHECK(cuMemFree(d));
    free(page);
    return bad != 0;
}

static size_t wrong;
static pthread_mutex_t wrong_lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    CHECK(cuCtxSetCurrent(ctx));
    size_t n = 12 * MiB + 4321 * id;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, n));
    unsigned char *page = malloc(n), *pin;
    CHECK(cuMemHostAlloc((void **)&pin, n, 0));
    size_t bad = 0;
    for (unsigned round = 0; round < 3; round++) {
        unsigned seed = id * 100 + round;
        fill(page, n, seed);
        CHECK(cuMemcpyHtoDAsync(d, page, n, s));
        memset(pin, 0, n);
        CHECK(cuMemcpyDtoHAsync(pin, d, n, s));
        CHECK(cuStreamSynchronize(s));
        bad += differ(pin, seed, n);
        fill(pin, n, seed + 50);
        CHECK(cuMemcpyHtoD(d, pin, n));
        memset(page, 0, n);
        CHECK(cuMemcpyDtoH(page, d, n));
        bad += differ(page, seed + 50, n);
    }
    CHECK(cuMemFreeHost(pin));
    CHECK(cuMemFree(d));
    CHECK(cuStreamDestroy(s));
    free(page);
    pthread_mutex_lock(&wrong_lock);
    wrong += bad;
    pthread_mutex_unlock(&wrong_lock);
    return NULL;
}

static int threads(void) {
    pthread_t t[4];
    for (unsigned i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < 4; i++) pthread_join(t[i], NULL);
    printf("region_driver threads: 4 x 3 rounds wrong=%zu\n", wrong);
    return wrong != 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "errors";
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    int rc = !strcmp(mode, "threads") ? threads() : errors();
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return rc;
}
