/* Batches of copies (cuMemcpyBatchAsync, cuMemcpy3DBatchAsync, CUDA 12.8+ and 13's
 * forms), batches of managed prefetches and discards (CUDA 13), and
 * CU_POINTER_ATTRIBUTE_SYNC_MEMOPS. Prints the same natively and through the shim.
 * `hostile` (the shim only): batches the driver refuses whole, and dma-buf handles. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)

#define N 4096
static unsigned char h1[N], h2[N], h3[N], h4[N];

static CUmemcpyAttributes attr(CUmemcpySrcAccessOrder order) {
    CUmemcpyAttributes a;
    memset(&a, 0, sizeof a);
    a.srcAccessOrder = order;
    return a;
}

static int hostile(CUstream s, CUdeviceptr d1) {
    CUdeviceptr dsts[1] = { d1 }, srcs[1] = { (CUdeviceptr)(uintptr_t)h1 };
    size_t sizes[1] = { N }, idx[1] = { 0 }, bad_idx[1] = { 1 }, fail = 0;
    CUmemcpyAttributes a = attr(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
    CUmemcpyAttributes invalid = attr(CU_MEMCPY_SRC_ACCESS_ORDER_INVALID);
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, idx, 1, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, idx, 1, CU_STREAM_LEGACY),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &invalid, idx, 1, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, bad_idx, 1, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &a, idx, 2, s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyBatchAsync(NULL, srcs, sizes, 1, &a, idx, 1, s), CUDA_ERROR_INVALID_VALUE);
    PFN_cuMemcpyBatchAsync_v12080 v1;
    EXPECT(cuGetProcAddress("cuMemcpyBatchAsync", (void **)&v1, 12080, 0, NULL), CUDA_SUCCESS);
    EXPECT(v1(dsts, srcs, sizes, 1, &invalid, idx, 1, &fail, s), CUDA_ERROR_INVALID_VALUE);
    if (fail != SIZE_MAX) { printf("failIdx %zu\n", fail); return 1; }
    CUDA_MEMCPY3D_BATCH_OP op;
    memset(&op, 0, sizeof op);
    EXPECT(cuMemcpy3DBatchAsync(1, &op, 0, s), CUDA_ERROR_INVALID_VALUE);
    op.src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
    op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    op.dst.op.ptr.ptr = (CUdeviceptr)(uintptr_t)h2;
    op.extent.width = op.extent.height = op.extent.depth = 1;
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    EXPECT(cuMemcpy3DBatchAsync(1, &op, 0, s), CUDA_ERROR_INVALID_HANDLE); /* no array */
    op.src.op.array.array = (CUarray)(uintptr_t)0x4242;
    EXPECT(cuMemcpy3DBatchAsync(1, &op, 0, s), CUDA_ERROR_INVALID_HANDLE); /* forged */
    EXPECT(cuMemcpy3DBatchAsync(1, &op, 1, s), CUDA_ERROR_INVALID_VALUE); /* flags */
    CUdeviceptr ptrs[1] = { d1 };
    size_t lens[1] = { N };
    EXPECT(cuMemDiscardBatchAsync(ptrs, lens, 1, 0, s), CUDA_ERROR_INVALID_VALUE); /* not managed */
    unsigned one = 1;
    EXPECT(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, 0x1000),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_CONTEXT, d1), CUDA_ERROR_INVALID_VALUE);
    int fd = -1;
    EXPECT(cuMemGetHandleForAddressRange(&fd, d1, N, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
           CUDA_ERROR_NOT_SUPPORTED);
    printf("hostile: batches refused whole, foreign arrays, dma-buf refused\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUstream s;
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr d1, d2;
    EXPECT(cuMemAlloc(&d1, N), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&d2, N), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "hostile")) return hostile(s, d1);
    for (int i = 0; i < N; i++) { h1[i] = (unsigned char)i; h3[i] = (unsigned char)(i * 7); }

    /* two independent copies a batch, attributes for the first one and the rest */
    CUdeviceptr dsts[2] = { d1, d2 }, srcs[2] = { (CUdeviceptr)(uintptr_t)h1,
                                                  (CUdeviceptr)(uintptr_t)h3 };
    size_t sizes[2] = { N, N }, idx[2] = { 0, 1 };
    CUmemcpyAttributes attrs[2] = { attr(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM),
                                    attr(CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL) };
    EXPECT(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, attrs, idx, 2, s), CUDA_SUCCESS);
    CUdeviceptr back_dsts[2] = { (CUdeviceptr)(uintptr_t)h2, (CUdeviceptr)(uintptr_t)h4 };
    CUdeviceptr back_srcs[2] = { d1, d2 };
    EXPECT(cuMemcpyBatchAsync(back_dsts, back_srcs, sizes, 2, attrs, idx, 1, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("cuMemcpyBatchAsync: there and back %s, %s\n", memcmp(h1, h2, N) ? "differ" : "same",
           memcmp(h3, h4, N) ? "differ" : "same");
    PFN_cuMemcpyBatchAsync_v12080 v1;
    size_t fail = 7;
    EXPECT(cuGetProcAddress("cuMemcpyBatchAsync", (void **)&v1, 12080, 0, NULL), CUDA_SUCCESS);
    memset(h2, 0, N);
    EXPECT(v1(back_dsts, back_srcs, sizes, 1, attrs, idx, 1, &fail, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("CUDA 12.8's form: %s\n", memcmp(h1, h2, N) ? "differ" : "same");

    /* 3D: rows of a host image into an array and a pitched allocation, then back */
    CUDA_ARRAY3D_DESCRIPTOR ad = { 16, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0 };
    CUarray arr;
    EXPECT(cuArray3DCreate(&arr, &ad), CUDA_SUCCESS);
    CUDA_MEMCPY3D_BATCH_OP ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    ops[0].src.op.ptr.ptr = (CUdeviceptr)(uintptr_t)h1;
    ops[0].dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
    ops[0].dst.op.array.array = arr;
    ops[0].extent = (CUextent3D){ 16, 16, 1 }; /* elements of the array: floats */
    ops[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    ops[1].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    ops[1].src.op.ptr.ptr = (CUdeviceptr)(uintptr_t)h3;
    ops[1].src.op.ptr.rowLength = 128; /* bytes between pointers: 128-byte rows */
    ops[1].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    ops[1].dst.op.ptr.ptr = d2;
    ops[1].dst.op.ptr.rowLength = 256;
    ops[1].extent = (CUextent3D){ 100, 8, 1 };
    ops[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
    EXPECT(cuMemcpy3DBatchAsync(2, ops, 0, s), CUDA_SUCCESS);
    memset(h2, 0, N);
    memset(h4, 0, N);
    CUDA_MEMCPY3D_BATCH_OP back[2];
    memset(back, 0, sizeof back);
    back[0].src = ops[0].dst;
    back[0].dst = ops[0].src;
    back[0].dst.op.ptr.ptr = (CUdeviceptr)(uintptr_t)h2;
    back[0].extent = ops[0].extent;
    back[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    back[1].src = ops[1].dst;
    back[1].dst = ops[1].src;
    back[1].dst.op.ptr.ptr = (CUdeviceptr)(uintptr_t)h4;
    back[1].extent = ops[1].extent;
    back[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    EXPECT(cuMemcpy3DBatchAsync(2, back, 0, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    int rows_same = 1;
    for (int y = 0; y < 8; y++) rows_same &= !memcmp(h3 + 128 * y, h4 + 128 * y, 100);
    printf("cuMemcpy3DBatchAsync: array %s, pitched rows %s\n",
           memcmp(h1, h2, 16 * 16 * 4) ? "differ" : "same", rows_same ? "same" : "differ");
    EXPECT(cuArrayDestroy(arr), CUDA_SUCCESS);

    /* managed memory: prefetch, discard, both */
    CUdeviceptr m;
    EXPECT(cuMemAllocManaged(&m, 1 << 21, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    memset((void *)(uintptr_t)m, 5, 1 << 21);
    CUdeviceptr ptrs[2] = { m, m + (1 << 20) };
    size_t lens[2] = { 1 << 20, 1 << 20 }, lidx[2] = { 0, 1 };
    CUmemLocation locs[2] = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                              { CU_MEM_LOCATION_TYPE_HOST, 0 } };
    printf("cuMemPrefetchBatchAsync: %d\n", cuMemPrefetchBatchAsync(ptrs, lens, 2, locs, lidx, 2, 0, s));
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("a prefetched byte: %d\n", ((unsigned char *)(uintptr_t)m)[12345]);
    printf("cuMemDiscardBatchAsync: %d\n", cuMemDiscardBatchAsync(ptrs + 1, lens + 1, 1, 0, s));
    printf("cuMemDiscardAndPrefetchBatchAsync: %d\n",
           cuMemDiscardAndPrefetchBatchAsync(ptrs, lens, 1, locs, lidx, 1, 0, s));
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemFree(m), CUDA_SUCCESS);

    /* synchronous memory operations on one allocation */
    unsigned one = 1, got = 0;
    EXPECT(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d1), CUDA_SUCCESS);
    printf("sync memops before: %u\n", got & 0xff);
    EXPECT(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d1 + 16), CUDA_SUCCESS);
    got = 0;
    EXPECT(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, d1), CUDA_SUCCESS);
    printf("sync memops set: %u\n", got & 0xff);
    EXPECT(cuMemcpyHtoD(d1, h3, N), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(h2, d1, N), CUDA_SUCCESS);
    printf("copied with sync memops: %s\n", memcmp(h2, h3, N) ? "differ" : "same");
    printf("batch_copies: ok\n");
    return 0;
}
