/* Virtual memory management and stream-ordered allocation as the frameworks use them,
 * through the driver API. It prints the same natively and through the shim.
 *
 *   vmm_pools            PyTorch's expandable segments (reserve a large range, create
 *                        and map chunks as it grows, set access, use, unmap, release)
 *                        and its cudaMallocAsync backend (allocations from the default
 *                        pool, a release threshold, attributes, trim), then a pool of
 *                        its own as the device's current pool.
 *   vmm_pools quota      Grows through cuMemCreate, then through a pool, until refused:
 *                        both stop within what cuMemGetInfo says the device has.
 *   vmm_pools refusals   What the shim refuses (run through the shim only).
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                     \
            const char *n_ = NULL;                                                    \
            cuGetErrorName(r_, &n_);                                                  \
            printf("%s: %s (%d), line %d\n", #call, n_ ? n_ : "?", (int)r_, __LINE__); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)
#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            printf("expected %s, line %d\n", #cond, __LINE__);                        \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

static CUdevice dev;

static CUmemAllocationProp device_memory(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    return prop;
}

static int expandable_segments(void) {
    enum { CHUNKS = 4, RESERVED = 64 };
    CUmemAllocationProp prop = device_memory();
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; /* as PyTorch asks */
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    EXPECT(gran && !(gran & (gran - 1)));
    CUdeviceptr base = 0;
    CHECK(cuMemAddressReserve(&base, RESERVED * gran, 0, 0, 0));
    EXPECT(base % gran == 0);
    CUmemGenericAllocationHandle h[CHUNKS];
    for (int i = 0; i < CHUNKS; i++) { /* the segment grows a chunk at a time */
        CHECK(cuMemCreate(&h[i], gran, &prop, 0));
        CHECK(cuMemMap(base + i * gran, gran, 0, h[i], 0));
    }
    CUmemAccessDesc rw;
    memset(&rw, 0, sizeof rw);
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(base, CHUNKS * gran, &rw, 1));
    unsigned long long flags = 0;
    CHECK(cuMemGetAccess(&flags, &prop.location, base + 3 * gran + 8));
    EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    /* Used as one buffer: a memset over all of it, a copy across a chunk boundary,
       a device-to-device copy from one chunk to another. */
    CHECK(cuMemsetD32(base, 0x01020304u, CHUNKS * gran / 4));
    static unsigned char pattern[1 << 16], back[1 << 16];
    for (size_t i = 0; i < sizeof pattern; i++) pattern[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr across = base + gran - sizeof pattern / 2;
    CHECK(cuMemcpyHtoD(across, pattern, sizeof pattern));
    CHECK(cuMemcpyDtoD(base + 3 * gran, across, sizeof pattern));
    CHECK(cuMemcpyDtoH(back, base + 3 * gran, sizeof back));
    EXPECT(!memcmp(back, pattern, sizeof back));
    unsigned word = 0;
    CHECK(cuMemcpyDtoH(&word, base + 2 * gran + 64, 4));
    EXPECT(word == 0x01020304u);

    CUdeviceptr range = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange(&range, &size, base + gran + 100));
    printf("address range: chunk %llu, %zu granules\n",
           (unsigned long long)((range - base) / gran), size / gran);
    CUdeviceptr start = 0;
    size_t span = 0;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, base + gran + 100));
    CHECK(cuPointerGetAttribute(&span, CU_POINTER_ATTRIBUTE_RANGE_SIZE, base + gran + 100));
    printf("pointer range: from granule %llu, %zu granules\n",
           (unsigned long long)((start - base) / gran), span / gran);
    unsigned type = 0;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + 5));
    EXPECT(type == CU_MEMORYTYPE_DEVICE);

    CUmemGenericAllocationHandle again = 0;
    CHECK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(base + 2 * gran + 5)));
    EXPECT(again == h[2]);
    CHECK(cuMemRelease(again));
    CUmemAllocationProp made;
    CHECK(cuMemGetAllocationPropertiesFromHandle(&made, h[0]));
    EXPECT(made.type == CU_MEM_ALLOCATION_TYPE_PINNED);
    EXPECT(made.location.type == CU_MEM_LOCATION_TYPE_DEVICE && made.location.id == (int)dev);

    /* Shrinking: the last chunk goes first, as PyTorch gives memory back. */
    CHECK(cuCtxSynchronize());
    for (int i = CHUNKS - 1; i >= 0; i--) {
        CHECK(cuMemUnmap(base + i * gran, gran));
        CHECK(cuMemRelease(h[i]));
    }
    CHECK(cuMemAddressFree(base, RESERVED * gran));
    printf("expandable segments: granularity %zu, %d chunks mapped, used, unmapped\n", gran,
           CHUNKS);
    return 0;
}

static int malloc_async(void) {
    enum { N = 32 };
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CUmemoryPool current;
    CHECK(cuDeviceGetMemPool(&current, dev));
    EXPECT(current == pool);
    cuuint64_t keep = UINT64_MAX; /* PyTorch's backend:cudaMallocAsync keeps what it frees */
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p[N];
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        size_t n = (size_t)(i + 1) * 3000;
        CHECK(cuMemAllocAsync(&p[i], n, s));
        CHECK(cuMemsetD32Async(p[i], (unsigned)i, n / 4, s));
        total += n;
    }
    unsigned got[4];
    CHECK(cuMemcpyDtoHAsync(got, p[17] + 1000, sizeof got, s));
    CHECK(cuStreamSynchronize(s));
    EXPECT(got[0] == 17 && got[3] == 17);
    unsigned type = 0;
    CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p[5]));
    EXPECT(type == CU_MEMORYTYPE_DEVICE);
    cuuint64_t used = 0, reserved = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    EXPECT(used >= total && reserved >= used);
    for (int i = 0; i < N; i++) CHECK(cuMemFreeAsync(p[i], s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    EXPECT(used == 0 && reserved > 0); /* kept, by the threshold */
    cuuint64_t high = 0;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &high));
    EXPECT(high >= total);
    int reuse = -1;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
    EXPECT(reuse == 0 || reuse == 1);
    CHECK(cuMemPoolTrimTo(pool, 0));
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    EXPECT(reserved == 0);
    CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CUmemLocation here = { CU_MEM_LOCATION_TYPE_DEVICE, (int)dev };
    CHECK(cuMemPoolGetAccess(&access, pool, &here));
    EXPECT(access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

    /* A pool of its own, made the device's current one: cuMemAllocAsync takes from it. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = here;
    CUmemoryPool mine;
    CHECK(cuMemPoolCreate(&mine, &props));
    CHECK(cuDeviceSetMemPool(dev, mine));
    CHECK(cuDeviceGetMemPool(&current, dev));
    EXPECT(current == mine);
    CUdeviceptr q, r;
    CHECK(cuMemAllocAsync(&q, 1 << 20, s));
    CHECK(cuMemAllocFromPoolAsync(&r, 1 << 20, mine, s));
    CHECK(cuMemcpyDtoDAsync(r, q, 1 << 20, s));
    CHECK(cuMemPoolGetAttribute(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
    EXPECT(used >= 2 << 20);
    CHECK(cuMemFreeAsync(q, s));
    CHECK(cuMemFreeAsync(r, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuDeviceSetMemPool(dev, pool));
    CHECK(cuMemPoolDestroy(mine));
    CHECK(cuStreamDestroy(s));
    printf("cudaMallocAsync: %d allocations from the default pool, freed, kept, trimmed; "
           "a pool of its own as the current one\n", N);
    return 0;
}

/* Through cuMemCreate, then through a pool, until the device (the slice) is full. */
static int quota(void) {
    size_t free_bytes = 0, total = 0, gran = 0;
    CHECK(cuMemGetInfo(&free_bytes, &total));
    CUmemAllocationProp prop = device_memory();
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t chunk = 8 * gran, held = 0;
    enum { MAX = 4096 };
    static CUmemGenericAllocationHandle h[MAX];
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAX && (r = cuMemCreate(&h[n], chunk, &prop, 0)) == CUDA_SUCCESS) {
        held += chunk;
        n++;
    }
    EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY && held <= total);
    for (int i = 0; i < n; i++) CHECK(cuMemRelease(h[i]));
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    cuuint64_t keep = UINT64_MAX, reserved = 0;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    static CUdeviceptr p[MAX];
    int m = 0;
    while (m < MAX && (r = cuMemAllocAsync(&p[m], chunk - 4096, NULL)) == CUDA_SUCCESS) m++;
    EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
    EXPECT(reserved <= total);
    for (int i = 0; i < m; i++) CHECK(cuMemFreeAsync(p[i], NULL));
    CHECK(cuCtxSynchronize());
    /* Freed but kept by the pool: the memory is still the program's, not for cuMemCreate. */
    size_t after = 0;
    CHECK(cuMemGetInfo(&after, &total));
    printf("quota: %d chunks created, %d allocated from a pool, refused past the device's "
           "memory; %s\n", n, m, after < chunk ? "the pool holds what it kept" : "memory free");
    CHECK(cuMemPoolTrimTo(pool, 0));
    CHECK(cuMemCreate(&h[0], chunk, &prop, 0));
    CHECK(cuMemRelease(h[0]));
    return 0;
}

/* What the shim refuses rather than pretends to do. */
static int refusals(void) {
    CUmemAllocationProp prop = device_memory();
    CUmemGenericAllocationHandle h;
    size_t gran = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuMemGetAllocationGranularity(&gran, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
    prop = device_memory();
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
    prop = device_memory();
    prop.allocFlags.gpuDirectRDMACapable = 1; /* compression is served: compressible.c */
    EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0) == CUDA_ERROR_NOT_SUPPORTED);
    prop = device_memory();
    prop.location.id = 7;
    EXPECT(cuMemCreate(&h, 2 << 20, &prop, 0) == CUDA_ERROR_INVALID_DEVICE);
    prop = device_memory();
    EXPECT(cuMemCreate(&h, (2 << 20) + 1, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; /* exportable */
    CHECK(cuMemCreate(&h, 2 << 20, &prop, 0));
    int fd = -1;
    EXPECT(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0) ==
           CUDA_ERROR_NOT_SUPPORTED);
    CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    EXPECT(fd >= 0);
    close(fd);
    CHECK(cuMemRelease(h));
    EXPECT(cuMemRelease(h) == CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuMemRelease(12345) == CUDA_ERROR_INVALID_HANDLE);
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 << 20, 0, 0, 0));
    EXPECT(cuMemUnmap(va, 2 << 20) == CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
    CHECK(cuMemAddressFree(va, 8 << 20));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.handleTypes = CU_MEM_HANDLE_TYPE_FABRIC; /* a POSIX fd is served: pool_share.c */
    CUmemoryPool pool;
    EXPECT(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
    CUmemAccessDesc other = { { CU_MEM_LOCATION_TYPE_DEVICE, 3 }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    EXPECT(cuMemPoolSetAccess(pool, &other, 1) == CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuMemPoolDestroy(pool) == CUDA_ERROR_INVALID_VALUE); /* the default stays */
    CUdeviceptr p;
    CHECK(cuMemAllocAsync(&p, 4096, NULL));
    EXPECT(cuMemFreeAsync(p + 16, NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree(p)); /* cuMemFree takes a pool allocation too */
    EXPECT(cuMemFreeAsync(p, NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxSynchronize());
    printf("refusals: as expected\n");
    return 0;
}

int main(int argc, char **argv) {
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    int vmm = 0, pools = 0, handles = -1;
    CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    CHECK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
    CHECK(cuDeviceGetAttribute(&handles, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, dev));
    if (argc > 1 && !strcmp(argv[1], "quota")) return quota();
    if (argc > 1 && !strcmp(argv[1], "refusals")) {
        printf("vmm %d, pools %d, pool handle types %d\n", vmm, pools, handles);
        return refusals();
    }
    printf("vmm %d, pools %d\n", vmm, pools);
    if (expandable_segments() || malloc_async()) return 1;
    printf("vmm_pools: ok\n");
    return 0;
}
