// Copies between the device and pinned (cudaMallocHost, cudaHostAlloc) or pageable
// host memory, synchronous and on a stream, below 1 MiB, at 1 MiB and at 20 MiB plus
// odd bytes; every byte is checked. argv[1]: "pinned", "pageable" or "all" (default).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static unsigned long long wrong;

static void fill(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) { x = x * 1103515245u + 12345u; p[i] = (unsigned char)(x >> 16); }
}

static void check(const char *what, size_t size, const unsigned char *got, unsigned seed) {
    unsigned char *want = (unsigned char *)malloc(size);
    fill(want, size, seed);
    size_t bad = 0;
    for (size_t i = 0; i < size; i++) bad += got[i] != want[i];
    if (bad) printf("%s of %zu bytes: %zu wrong\n", what, size, bad);
    wrong += bad;
    free(want);
}

// Host to device from src, device to device, device to host into dst; sync or on s.
static void round_trip(const char *what, unsigned char *src, unsigned char *dst, size_t size,
                       unsigned seed, cudaStream_t s, int async) {
    unsigned char *a, *b;
    CHECK(cudaMalloc(&a, size));
    CHECK(cudaMalloc(&b, size));
    fill(src, size, seed);
    memset(dst, 0, size);
    if (async) {
        CHECK(cudaMemcpyAsync(a, src, size, cudaMemcpyHostToDevice, s));
        CHECK(cudaMemcpyAsync(b, a, size, cudaMemcpyDeviceToDevice, s));
        CHECK(cudaMemcpyAsync(dst, b, size, cudaMemcpyDeviceToHost, s));
        // The bytes are there once the stream says its work is done.
        cudaError_t q;
        while ((q = cudaStreamQuery(s)) == cudaErrorNotReady) {}
        CHECK(q);
    } else {
        CHECK(cudaMemcpy(a, src, size, cudaMemcpyHostToDevice));
        fill(src, size, seed + 1);  // the copy has taken its bytes
        CHECK(cudaMemcpy(b, a, size, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy(dst, b, size, cudaMemcpyDefault));
    }
    check(what, size, dst, seed);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    int pinned = strcmp(mode, "pageable") != 0, pageable = strcmp(mode, "pinned") != 0;
    const size_t sizes[] = { 1000, 1 << 20, (20 << 20) + 12345 };
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned seed = 1;
    for (size_t size : sizes) {
        if (pageable) {
            unsigned char *src = (unsigned char *)malloc(size), *dst = (unsigned char *)malloc(size);
            round_trip("pageable", src, dst, size, seed++, s, 0);
            round_trip("pageable async", src, dst, size, seed++, s, 1);
            free(src);
            free(dst);
        }
        if (pinned) {
            unsigned char *src, *dst;
            CHECK(cudaMallocHost(&src, size));
            CHECK(cudaHostAlloc(&dst, size, cudaHostAllocPortable));
            unsigned flags = 0;
            CHECK(cudaHostGetFlags(&flags, dst));
            cudaPointerAttributes attr;
            CHECK(cudaPointerGetAttributes(&attr, src + size / 2));
            // The driver adds cudaHostAllocMapped under unified addressing and reports the
            // portable bit only for some sizes, so only foreign bits are wrong here.
            if ((flags & ~(cudaHostAllocPortable | cudaHostAllocMapped)) || attr.type != cudaMemoryTypeHost) {
                printf("pinned %zu: flags %u, type %d\n", size, flags, (int)attr.type);
                wrong++;
            }
            round_trip("pinned", src, dst, size, seed++, s, 0);
            round_trip("pinned async", src, dst, size, seed++, s, 1);
            // A piece of pinned memory at an odd offset, and an event as the sync point.
            size_t off = size / 3 + 1, part = size - off;
            unsigned char *d;
            CHECK(cudaMalloc(&d, size));
            fill(src + off, part, seed);
            CHECK(cudaMemcpyAsync(d, src + off, part, cudaMemcpyHostToDevice, s));
            memset(dst, 0, size);
            CHECK(cudaMemcpyAsync(dst + 1, d, part, cudaMemcpyDeviceToHost, s));
            cudaEvent_t done;
            CHECK(cudaEventCreate(&done));
            CHECK(cudaEventRecord(done, s));
            CHECK(cudaEventSynchronize(done));
            check("pinned piece", part, dst + 1, seed++);
            CHECK(cudaEventDestroy(done));
            // Pinned to pageable and back, through the device.
            unsigned char *page = (unsigned char *)malloc(size);
            fill(page, size, seed);
            CHECK(cudaMemcpy(d, page, size, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(dst, d, size, cudaMemcpyDeviceToHost));
            check("pageable to pinned", size, dst, seed++);
            fill(src, size, seed);
            CHECK(cudaMemcpy(d, src, size, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(page, d, size, cudaMemcpyDeviceToHost));
            check("pinned to pageable", size, page, seed++);
            free(page);
            // Rows of pinned memory into a pitched allocation and back.
            size_t width = 300, rows = size / 1024 < 64 ? size / 1024 : 64, pitch;
            if (rows) {
                unsigned char *m;
                CHECK(cudaMallocPitch((void **)&m, &pitch, width, rows));
                fill(src, width * rows, seed);
                CHECK(cudaMemcpy2D(m, pitch, src, width, width, rows, cudaMemcpyHostToDevice));
                memset(dst, 0, width * rows);
                CHECK(cudaMemcpy2D(dst, width, m, pitch, width, rows, cudaMemcpyDeviceToHost));
                check("pinned 2D", width * rows, dst, seed++);
                CHECK(cudaFree(m));
            }
            CHECK(cudaFree(d));
            CHECK(cudaFreeHost(src));
            CHECK(cudaFreeHost(dst));
        }
    }
    CHECK(cudaStreamDestroy(s));
    printf("region_copies %s: sizes=1000,1048576,%zu wrong=%llu\n", mode, sizes[2], wrong);
    return wrong != 0;
}
