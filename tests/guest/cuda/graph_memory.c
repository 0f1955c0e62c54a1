/* Graph memory nodes, as NVIDIA's graphMemoryNodes and graphMemoryFootprint samples use
 * them: allocation and free nodes added by hand (cuGraphAddMemAllocNode,
 * cuGraphAddMemFreeNode, cuGraphAddNode), their parameters and types; a launch that
 * leaves its allocation live, which copies, cuPointerGetAttribute, cuMemFree and
 * cuMemFreeAsync then treat as device memory; a relaunch with it unfreed, and
 * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH; cuMemAllocAsync and cuMemFreeAsync in a
 * stream capture; the graph memory figures, their resets and cuDeviceGraphMemTrim.
 * Prints the same natively and through the shim.
 * `hostile` (the shim only): absurd sizes and locations, free nodes of memory that is no
 * graph's. `quota N`: an allocation node of N MiB, instantiated (the shim's slice refuses
 * one past its quota).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)
#define MiB (1u << 20)

static void params(CUDA_MEM_ALLOC_NODE_PARAMS *p, size_t size, int dev) {
    memset(p, 0, sizeof *p);
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = dev;
    p->bytesize = size;
}

static unsigned long long figure(CUdevice dev, CUgraphMem_attribute attr) {
    cuuint64_t v = 0;
    if (cuDeviceGetGraphMemAttribute(dev, attr, &v)) return ~0ull;
    return (unsigned long long)v;
}

static int hostile(CUdevice dev) {
    CUgraph g;
    CUgraphNode a;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    params(&p, 0, dev);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_ERROR_INVALID_VALUE);
    params(&p, (size_t)1 << 60, dev);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_ERROR_OUT_OF_MEMORY);
    params(&p, MiB, 7);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_ERROR_INVALID_DEVICE);
    params(&p, MiB, dev);
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_HOST;
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_ERROR_NOT_SUPPORTED);
    CUgraphNode f;
    EXPECT(cuGraphAddMemFreeNode(&f, g, NULL, 0, (CUdeviceptr)0x123456000ull),
           CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr plain;
    EXPECT(cuMemAlloc(&plain, MiB), CUDA_SUCCESS);
    EXPECT(cuGraphAddMemFreeNode(&f, g, NULL, 0, plain), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemFree(plain), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
    cuuint64_t five = 5;
    EXPECT(cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &five),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetGraphMemAttribute(dev, (CUgraphMem_attribute)42, &five),
           CUDA_ERROR_INVALID_VALUE);
    printf("hostile: absurd sizes, other devices, host memory and strangers' frees refused\n");
    return 0;
}

static int quota(CUdevice dev, size_t mib) {
    CUgraph g;
    CUgraphNode a;
    CUgraphExec e;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    params(&p, mib * MiB, dev);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_SUCCESS);
    CUresult r = cuGraphInstantiateWithFlags(&e, g, 0);
    printf("quota: instantiating %zu MiB: %d\n", mib, r);
    if (!r) EXPECT(cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "hostile")) return hostile(dev);
    if (argc > 2 && !strcmp(argv[1], "quota")) return quota(dev, (size_t)atoi(argv[2]));
    EXPECT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT(cuDeviceGraphMemTrim(dev), CUDA_SUCCESS);
    unsigned char bytes[16];

    /* an allocation the graph does not free: live after the launch */
    CUgraph g;
    CUgraphNode a, m;
    CUgraphExec e;
    CUDA_MEM_ALLOC_NODE_PARAMS p, got;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    params(&p, 4 * MiB, dev);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_SUCCESS);
    CUdeviceptr d = p.dptr;
    CUgraphNodeType type;
    EXPECT(cuGraphNodeGetType(a, &type), CUDA_SUCCESS);
    EXPECT(cuGraphMemAllocNodeGetParams(a, &got), CUDA_SUCCESS);
    printf("alloc node: type %d, %zu bytes, the same address %s, on device %d\n", type,
           got.bytesize, got.dptr == d ? "yes" : "no", got.poolProps.location.id);
    CUDA_MEMSET_NODE_PARAMS ms = { d, 0, 0x5A, 1, 4 * MiB, 1 };
    EXPECT(cuGraphAddMemsetNode(&m, g, &a, 1, &ms, ctx), CUDA_SUCCESS);
    EXPECT(cuGraphNodeGetType(m, &type), CUDA_SUCCESS);
    printf("memset node: type %d\n", type);
    unsigned long long before = figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
    EXPECT(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    printf("instantiated: used grew %s\n",
           figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) > before ? "yes" : "no");
    CUgraphExec second;
    printf("a second instantiation refused: %s\n",
           cuGraphInstantiateWithFlags(&second, g, 0) ? "yes" : "no");
    CUgraph clone;
    printf("a clone refused: %s\n", cuGraphClone(&clone, g) ? "yes" : "no");
    EXPECT(cuGraphLaunch(e, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    printf("launched: used at least 4 MiB %s, high at least used %s\n",
           figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= before + 4 * MiB ? "yes" : "no",
           figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) >=
               figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) ? "yes" : "no");
    EXPECT(cuMemcpyDtoH(bytes, d + MiB, sizeof bytes), CUDA_SUCCESS);
    unsigned mt = 0;
    EXPECT(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 8), CUDA_SUCCESS);
    printf("live: byte 0x%02x, memory type %u\n", bytes[15], mt);
    EXPECT(cuMemsetD8(d, 0x11, 64), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(bytes, d, sizeof bytes), CUDA_SUCCESS);
    printf("written outside the graph: 0x%02x\n", bytes[0]);
    printf("relaunched unfreed: %d\n", cuGraphLaunch(e, s));
    EXPECT(cuMemFree(d), CUDA_SUCCESS);
    printf("freed: used kept %s\n",
           figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= before + 4 * MiB ? "yes" : "no");
    EXPECT(cuGraphLaunch(e, s), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(d, s), CUDA_SUCCESS);
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT(cuDeviceGraphMemTrim(dev), CUDA_SUCCESS);
    printf("trimmed: used %llu\n", figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) - before);

    /* freed in the graph: launched again and again; cuGraphAddNode's forms */
    CUgraphNode f;
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.alloc.poolProps.location.id = dev;
    np.alloc.bytesize = MiB;
    EXPECT(cuGraphAddNode(&a, g, NULL, NULL, 0, &np), CUDA_SUCCESS);
    d = np.alloc.dptr;
    ms.dst = d;
    ms.width = MiB;
    EXPECT(cuGraphAddMemsetNode(&m, g, &a, 1, &ms, ctx), CUDA_SUCCESS);
    CUdeviceptr out;
    EXPECT(cuMemAlloc(&out, 64), CUDA_SUCCESS);
    EXPECT(cuMemsetD8(out, 0, 64), CUDA_SUCCESS);
    CUDA_MEMCPY3D cp;
    memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.srcDevice = d;
    cp.dstDevice = out;
    cp.WidthInBytes = 64;
    cp.Height = cp.Depth = 1;
    CUgraphNode c;
    EXPECT(cuGraphAddMemcpyNode(&c, g, &m, 1, &cp, ctx), CUDA_SUCCESS);
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    np.free.dptr = d;
    EXPECT(cuGraphAddNode(&f, g, &c, NULL, 1, &np), CUDA_SUCCESS);
    CUdeviceptr freed = 0;
    EXPECT(cuGraphNodeGetType(f, &type), CUDA_SUCCESS);
    EXPECT(cuGraphMemFreeNodeGetParams(f, &freed), CUDA_SUCCESS);
    printf("free node: type %d, the same address %s\n", type, freed == d ? "yes" : "no");
    printf("freed twice in one graph: %d\n", cuGraphAddMemFreeNode(&f, g, &c, 1, d));
    printf("a free node of cuMemAlloc memory: %d\n", cuGraphAddMemFreeNode(&f, g, &c, 1, out));
    EXPECT(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        EXPECT(cuGraphLaunch(e, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    }
    EXPECT(cuMemcpyDtoH(bytes, out, sizeof bytes), CUDA_SUCCESS);
    printf("alloc, memset, copy, free: launched twice, 0x%02x\n", bytes[3]);
    EXPECT(cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    /* stream-ordered allocation in a capture */
    CUdeviceptr q;
    EXPECT(cuMemsetD8(out, 0, 64), CUDA_SUCCESS);
    EXPECT(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    EXPECT(cuMemAllocAsync(&q, MiB, s), CUDA_SUCCESS);
    EXPECT(cuMemsetD8Async(q, 0x07, MiB, s), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoDAsync(out, q, 64, s), CUDA_SUCCESS);
    EXPECT(cuMemFreeAsync(q, s), CUDA_SUCCESS);
    EXPECT(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    size_t n = 0;
    EXPECT(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
    CUgraphNode nodes[8];
    EXPECT(cuGraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
    CUgraphNodeType first, last;
    EXPECT(cuGraphNodeGetType(nodes[0], &first), CUDA_SUCCESS);
    EXPECT(cuGraphNodeGetType(nodes[n - 1], &last), CUDA_SUCCESS);
    EXPECT(cuGraphMemAllocNodeGetParams(nodes[0], &got), CUDA_SUCCESS);
    printf("captured: %zu nodes, first type %d, last type %d, the same address %s\n", n, first,
           last, got.dptr == q ? "yes" : "no");
    EXPECT(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    for (int i = 0; i < 2; i++) {
        EXPECT(cuGraphLaunch(e, s), CUDA_SUCCESS);
        EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    }
    EXPECT(cuMemcpyDtoH(bytes, out, sizeof bytes), CUDA_SUCCESS);
    printf("captured: launched twice, 0x%02x\n", bytes[9]);
    EXPECT(cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    /* freed before each relaunch */
    EXPECT(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    params(&p, 2 * MiB, dev);
    EXPECT(cuGraphAddMemAllocNode(&a, g, NULL, 0, &p), CUDA_SUCCESS);
    EXPECT(cuGraphInstantiateWithFlags(&e, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH),
           CUDA_SUCCESS);
    int fails = 0;
    for (int i = 0; i < 3; i++) fails += cuGraphLaunch(e, s) != CUDA_SUCCESS;
    EXPECT(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT(cuMemFree(p.dptr), CUDA_SUCCESS);
    printf("auto free on launch: 3 launches, %d failed\n", fails);
    EXPECT(cuGraphExecDestroy(e), CUDA_SUCCESS);
    EXPECT(cuGraphDestroy(g), CUDA_SUCCESS);

    /* the figures */
    cuuint64_t zero = 0;
    EXPECT(cuDeviceGraphMemTrim(dev), CUDA_SUCCESS);
    EXPECT(cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero),
           CUDA_SUCCESS);
    EXPECT(cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &zero),
           CUDA_SUCCESS);
    printf("reset: used high %llu, reserved high %llu\n",
           figure(dev, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) - before,
           figure(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) - before);
    printf("setting the current figure: %d\n",
           cuDeviceSetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &zero));
    EXPECT(cuMemFree(out), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(s), CUDA_SUCCESS);
    printf("graph_memory: ok\n");
    return 0;
}
