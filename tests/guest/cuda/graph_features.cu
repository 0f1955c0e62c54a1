// Graph features of NVIDIA's cuda-samples beyond capture and node-by-node building,
// through cudart as the samples call them; prints what it saw, the same natively and
// through the shim, line for line. argv[1] picks the part:
//
//   clone      cudaGraphClone of a captured graph (a pageable copy in it), of one split
//              by a host function, and of one built by hand with a host node;
//              cudaGraphNodeFindInClone in each; the clones run as their originals
//              (simpleCudaGraphs)
//   setparams  cudaGraphExecKernelNodeSetParams on instantiations of graphs with guest
//              parts: a hand-built graph with a copy to pageable memory (jacobiCudaGraphs)
//              and a host node, and a capture split by a host function
//   conditional cudaGraphAddNode of kernel nodes, and of conditional nodes (a WHILE loop a
//              kernel counts down, an IF with an else a kernel decides), whose bodies the
//              program fills (graphConditionalNodes)
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#define N 1024
#define CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("%s: %s (line %d)\n", #call, cudaGetErrorName(e_), __LINE__); return 1; } } while (0)

extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// a WHILE body: one more iteration, one less to go, the loop goes on while any are left
extern "C" __global__ void countdown(cudaGraphConditionalHandle h, int *counter,
                                     int *iterations) {
    ++*iterations;
    cudaGraphSetConditional(h, --*counter > 0);
}

extern "C" __global__ void set_if(cudaGraphConditionalHandle h, const int *flag) {
    cudaGraphSetConditional(h, *flag != 0);
}

static void CUDART_CB count(void *p) { ++*(int *)p; }

static float *dx, *dy;
static float hx[N], hy[N];

// how many of y's N floats are not a * x + b
static int wrong(const float *y, float a, float b) {
    int w = 0;
    for (int i = 0; i < N; i++) w += y[i] != a * hx[i] + b;
    return w;
}

static int read_wrong(float a, float b) {
    if (cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
    return wrong(hy, a, b);
}

static cudaKernelNodeParams saxpy_params(float *a, void **args) {
    cudaKernelNodeParams p = {};
    p.func = (void *)saxpy;
    p.gridDim = dim3(N / 256);
    p.blockDim = dim3(256);
    p.kernelParams = args;
    return p;
}

// memset y to 0, then y = a * x + y, then a host node after the kernel (where host is
// set) and a copy of y into pageable memory (where out is)
static int build(cudaGraph_t *graph, cudaGraphNode_t *kernel, cudaGraphNode_t *hostnode,
                 float *a, void **args, int *host, float *out) {
    cudaGraphNode_t memset, copy;
    CHECK(cudaGraphCreate(graph, 0));
    cudaMemsetParams m = {};
    m.dst = dy;
    m.value = 0;
    m.elementSize = 4;
    m.width = N;
    m.height = 1;
    CHECK(cudaGraphAddMemsetNode(&memset, *graph, NULL, 0, &m));
    cudaKernelNodeParams p = saxpy_params(a, args);
    CHECK(cudaGraphAddKernelNode(kernel, *graph, &memset, 1, &p));
    if (host) {
        cudaHostNodeParams h = { count, host };
        CHECK(cudaGraphAddHostNode(hostnode, *graph, kernel, 1, &h));
    }
    if (out) {
        cudaMemcpy3DParms c = {};
        c.srcPtr = make_cudaPitchedPtr(dy, sizeof hy, N, 1);
        c.dstPtr = make_cudaPitchedPtr(out, sizeof hy, N, 1);
        c.extent = make_cudaExtent(sizeof hy, 1, 1);
        c.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaGraphAddMemcpyNode(&copy, *graph, kernel, 1, &c));
    }
    return 0;
}

static int clone_part(cudaStream_t s) {
    float a = 2.0f;
    int n = N;
    static float out[N];
    // captured, with a copy to pageable memory
    cudaGraph_t graph, clone;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(dy, 0, sizeof hy, s));
    saxpy<<<N / 256, 256, 0, s>>>(a, dx, dy, n);
    CHECK(cudaMemcpyAsync(out, dy, sizeof out, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphClone(&clone, graph));
    size_t nodes = 0, cloned = 0;
    CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    CHECK(cudaGraphGetNodes(clone, NULL, &cloned));
    CHECK(cudaGraphDestroy(graph));  // the clone is its own
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, clone, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("captured clone: %zu nodes, %zu in the clone, wrong %d\n", nodes, cloned,
           wrong(out, 2, 0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(clone));

    // captured, split by a host function
    int runs = 0;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(dy, 0, sizeof hy, s));
    saxpy<<<N / 256, 256, 0, s>>>(a, dx, dy, n);
    CHECK(cudaLaunchHostFunc(s, count, &runs));
    saxpy<<<N / 256, 256, 0, s>>>(a, dx, dy, n);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphClone(&clone, graph));
    CHECK(cudaGraphInstantiate(&exec, clone, 0));
    for (int i = 0; i < 2; i++) CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("split clone: host function ran %d times, wrong %d\n", runs, read_wrong(4, 0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(clone));
    CHECK(cudaGraphDestroy(graph));

    // built by hand, with a host node
    void *args[] = { &a, &dx, &dy, &n };
    cudaGraphNode_t kernel, hostnode, kcopy, hcopy, stranger, found = NULL;
    runs = 0;
    if (build(&graph, &kernel, &hostnode, &a, args, &runs, NULL)) return 1;
    CHECK(cudaGraphClone(&clone, graph));
    CHECK(cudaGraphNodeFindInClone(&kcopy, kernel, clone));
    CHECK(cudaGraphNodeFindInClone(&hcopy, hostnode, clone));
    cudaGraph_t other;
    CHECK(cudaGraphCreate(&other, 0));
    CHECK(cudaGraphAddEmptyNode(&stranger, other, NULL, 0));
    cudaError_t e = cudaGraphNodeFindInClone(&found, stranger, clone);
    cudaGetLastError();
    printf("built clone: copies are new nodes %d %d, a stranger: %s\n", kcopy != kernel,
           hcopy != hostnode, cudaGetErrorName(e));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaGraphInstantiate(&exec, clone, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("built clone: host node ran %d times, wrong %d\n", runs, read_wrong(2, 0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(clone));
    CHECK(cudaGraphDestroy(other));
    return 0;
}

static int setparams_part(cudaStream_t s) {
    float a = 2.0f, b = 0;
    int n = N;
    void *args[] = { &a, &dx, &dy, &n };
    static float out[N];
    cudaGraph_t graph;
    cudaGraphNode_t kernel, hostnode;
    cudaGraphExec_t exec;
    // a copy to pageable memory (jacobiCudaGraphs') and a host node
    int runs = 0;
    if (build(&graph, &kernel, &hostnode, &a, args, &runs, out)) return 1;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 1; i <= 3; i++) {
        a = (float)i;
        cudaKernelNodeParams p = saxpy_params(&a, args);
        CHECK(cudaGraphExecKernelNodeSetParams(exec, kernel, &p));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        printf("built: a=%d, wrong %d, host node ran %d times\n", i, wrong(out, a, b), runs);
    }
    cudaGraphNode_t later;
    cudaKernelNodeParams p = saxpy_params(&a, args);
    CHECK(cudaGraphAddKernelNode(&later, graph, &kernel, 1, &p));
    cudaError_t e = cudaGraphExecKernelNodeSetParams(exec, later, &p);
    cudaGetLastError();
    printf("built: a node added after instantiating: %s\n", cudaGetErrorName(e));
    // updated from a graph of the same shape (its own host node's counter), then from one
    // of another shape (no host node)
    cudaGraph_t same, other;
    cudaGraphNode_t k2, h2;
    int runs2 = 0;
    float a2 = 7.0f;
    void *args2[] = { &a2, &dx, &dy, &n };
    if (build(&same, &k2, &h2, &a2, args2, &runs2, out)) return 1;
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(exec, same, &info));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("built: updated, a=7, wrong %d, host nodes ran %d and %d times\n", wrong(out, 7, 0),
           runs, runs2);
    a2 = 8.0f;
    p = saxpy_params(&a2, args2);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, kernel, &p));  // its own graph's node
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("built: set after the update, a=8, wrong %d\n", wrong(out, 8, 0));
    if (build(&other, &k2, &h2, &a2, args2, NULL, out)) return 1;
    e = cudaGraphExecUpdate(exec, other, &info);
    cudaGetLastError();
    printf("built: updated from another shape: %s, result %d\n", cudaGetErrorName(e),
           info.result != cudaGraphExecUpdateSuccess);
    CHECK(cudaGraphDestroy(same));
    CHECK(cudaGraphDestroy(other));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // a capture split by a host function: the kernel node, from the capture query
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemsetAsync(dy, 0, sizeof hy, s));
    a = 2.0f;
    saxpy<<<N / 256, 256, 0, s>>>(a, dx, dy, n);
    cudaStreamCaptureStatus st;
    const cudaGraphNode_t *deps = NULL;
    size_t ndeps = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &ndeps));
    cudaGraphNode_t captured = ndeps == 1 ? deps[0] : NULL;
    runs = 0;
    CHECK(cudaLaunchHostFunc(s, count, &runs));
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    a = 5.0f;
    p = saxpy_params(&a, args);
    CHECK(cudaGraphExecKernelNodeSetParams(exec, captured, &p));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("captured: a=5, wrong %d, host function ran %d times\n", read_wrong(5, 0), runs);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return 0;
}

static cudaGraphNodeParams kernel_node(void *fn, void **args) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeKernel;
    p.kernel.func = fn;
    p.kernel.gridDim = dim3(1);
    p.kernel.blockDim = dim3(1);
    p.kernel.kernelParams = args;
    return p;
}

static cudaGraphNodeParams memset_node(void *dst, unsigned value, size_t n) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeMemset;
    p.memset.dst = dst;
    p.memset.value = value;
    p.memset.elementSize = 4;
    p.memset.width = n;
    p.memset.height = 1;
    return p;
}

static int conditional_part(cudaStream_t s) {
    int *ints;  // counter, iterations, flag
    CHECK(cudaMalloc(&ints, 3 * sizeof(int)));
    CHECK(cudaMemset(ints, 0, 3 * sizeof(int)));
    int *counter = ints, *iterations = ints + 1, *flag = ints + 2;
    float a = 2.0f;
    int n = N;
    void *args[] = { &a, &dx, &dy, &n };

    // a kernel node by cudaGraphAddNode, as the sample adds its nodes
    cudaGraph_t graph;
    cudaGraphNode_t node, memset, cond;
    cudaGraphExec_t exec;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNodeParams mp = memset_node(dy, 0, N);
    CHECK(cudaGraphAddNode(&memset, graph, NULL, NULL, 0, &mp));
    cudaGraphNodeParams kp = kernel_node((void *)saxpy, args);
    kp.kernel.gridDim = dim3(N / 256);
    kp.kernel.blockDim = dim3(256);
    CHECK(cudaGraphAddNode(&node, graph, &memset, NULL, 1, &kp));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    printf("addnode: memset and kernel nodes, wrong %d\n", read_wrong(2, 0));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // WHILE: the counter set to 5 by a memset node, the body counts it down
    cudaGraphConditionalHandle h;
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphConditionalHandleCreate(&h, graph, 1, cudaGraphCondAssignDefault));
    mp = memset_node(counter, 5, 1);
    CHECK(cudaGraphAddNode(&memset, graph, NULL, NULL, 0, &mp));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeWhile;
    cp.conditional.size = 1;
    CHECK(cudaGraphAddNode(&cond, graph, &memset, NULL, 1, &cp));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    void *cargs[] = { &h, &counter, &iterations };
    cudaGraphNodeParams bp = kernel_node((void *)countdown, cargs);
    CHECK(cudaGraphAddNode(&node, body, NULL, NULL, 0, &bp));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int got[3];
    for (int i = 0; i < 2; i++) {
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(got, ints, sizeof got, cudaMemcpyDeviceToHost));
        printf("while: launch %d, %d iterations in all, counter %d\n", i + 1, got[1], got[0]);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // IF with an else: a kernel node sets the condition from *flag
    CHECK(cudaGraphCreate(&graph, 0));
    CHECK(cudaGraphConditionalHandleCreate(&h, graph, 0, 0));
    void *sargs[] = { &h, &flag };
    cudaGraphNodeParams sp = kernel_node((void *)set_if, sargs);
    CHECK(cudaGraphAddNode(&node, graph, NULL, NULL, 0, &sp));
    cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 2;
    CHECK(cudaGraphAddNode(&cond, graph, &node, NULL, 1, &cp));
    cudaGraph_t then_ = cp.conditional.phGraph_out[0], else_ = cp.conditional.phGraph_out[1];
    mp = memset_node(dy, 0x3F800000, N);  // 1.0f
    CHECK(cudaGraphAddNode(&node, then_, NULL, NULL, 0, &mp));
    mp = memset_node(dy, 0x40000000, N);  // 2.0f
    CHECK(cudaGraphAddNode(&node, else_, NULL, NULL, 0, &mp));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int f = 1; f >= 0; f--) {
        CHECK(cudaMemcpy(flag, &f, sizeof f, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        printf("if: flag %d, y is %s\n", f, read_wrong(0, 1) == 0 ? "1.0" :
               read_wrong(0, 2) == 0 ? "2.0" : "wrong");
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaFree(ints));
    return 0;
}

int main(int argc, char **argv) {
    const char *part = argc > 1 ? argv[1] : "";
    for (int i = 0; i < N; i++) hx[i] = (float)i;
    CHECK(cudaMalloc(&dx, sizeof hx));
    CHECK(cudaMalloc(&dy, sizeof hy));
    CHECK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int rc = 2;
    if (!strcmp(part, "clone")) rc = clone_part(s);
    else if (!strcmp(part, "setparams")) rc = setparams_part(s);
    else if (!strcmp(part, "conditional")) rc = conditional_part(s);
    else printf("usage: graph_features clone|setparams|conditional\n");
    cudaStreamDestroy(s);
    cudaFree(dx);
    cudaFree(dy);
    printf("done: %d\n", rc);
    return rc;
}
