// Stream capture and CUDA graphs: a graph captured across two streams (an event forks
// and joins them) that copies from pinned memory, works on the device and copies back
// into pinned memory, replayed with new input each time; what capture queries answer;
// what a capture refuses; a graph built node by node (copies, memset, kernel, empty and
// event nodes, an explicit dependency), its kernel node's parameters changed in the
// instantiation, and the instantiation updated from a graph of the same shape; pageable
// copies and a host function in a capture; a host node built by hand. Prints what it saw, so native and hvgpu runs can be compared
// line for line. argv[1]: "kernel" (default; a kernel in the graph) or "nokernel" (a
// device-to-device copy instead, for the GPU test double, which runs no CUDA code).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s (%d)\n", #x, cudaGetErrorName(e_), (int)e_); exit(1); } } while (0)

static const size_t N = 1 << 20;

__global__ void add_one(unsigned char *p, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (unsigned char)(p[i] + 1);
}

struct HostCheck { unsigned char *out, *in; int kernel, calls; size_t bad; };

static void CUDART_CB host_check(void *p) {
    HostCheck *h = (HostCheck *)p;
    h->calls++;
    for (size_t i = 0; i < N; i++) h->bad += h->out[i] != (unsigned char)(h->in[i] + h->kernel);
}

struct TailCheck { unsigned char *out; int value, calls; size_t bad; };

static void CUDART_CB tail_check(void *p) {
    TailCheck *t = (TailCheck *)p;
    t->calls++;
    for (size_t i = 0; i < 1024; i++) t->bad += t->out[i] != t->value;
}

struct Built { cudaGraph_t graph; cudaGraphNode_t bump; };

static Built build(int value, int kernel, unsigned char *a, unsigned char *c, unsigned char *in,
                   unsigned char *out, cudaKernelNodeParams *kp, cudaEvent_t event) {
    Built b;
    CHECK(cudaGraphCreate(&b.graph, 0));
    cudaGraphNode_t up, down, fill, tail, done, rec;
    CHECK(cudaGraphAddMemcpyNode1D(&up, b.graph, nullptr, 0, a, in, N, cudaMemcpyHostToDevice));
    if (kernel) CHECK(cudaGraphAddKernelNode(&b.bump, b.graph, &up, 1, kp));
    else CHECK(cudaGraphAddEmptyNode(&b.bump, b.graph, &up, 1));
    CHECK(cudaGraphAddMemcpyNode1D(&down, b.graph, &b.bump, 1, out, a, N - 1024,
                                   cudaMemcpyDeviceToHost));
    cudaMemsetParams mp = {};
    mp.dst = c;
    mp.value = value;
    mp.elementSize = 1;
    mp.width = 1024;
    mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&fill, b.graph, nullptr, 0, &mp));
    CHECK(cudaGraphAddMemcpyNode1D(&tail, b.graph, &fill, 1, out + N - 1024, c, 1024,
                                   cudaMemcpyDeviceToHost));
    CHECK(cudaGraphAddDependencies(b.graph, &down, &tail, nullptr, 1));
    cudaGraphNode_t ends[] = { down, tail };
    CHECK(cudaGraphAddEmptyNode(&done, b.graph, ends, 2));
    CHECK(cudaGraphAddEventRecordNode(&rec, b.graph, &done, 1, event));
    return b;
}

static int status_of(cudaStream_t s) {
    cudaStreamCaptureStatus st;
    CHECK(cudaStreamIsCapturing(s, &st));
    return (int)st;
}

int main(int argc, char **argv) {
    int kernel = !(argc > 1 && !strcmp(argv[1], "nokernel"));
    unsigned long long wrong = 0;
    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    unsigned char *in, *out, *a, *b, *c;
    CHECK(cudaMallocHost(&in, N));
    CHECK(cudaMallocHost(&out, N));
    CHECK(cudaMalloc(&a, N));
    CHECK(cudaMalloc(&b, N));
    CHECK(cudaMalloc(&c, N));
    printf("before: capturing %d\n", status_of(s));

    // in -> a; a (+1) -> b on s; c = 9 on s2 meanwhile; b -> out, c -> out's last KiB.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(a, in, N, cudaMemcpyHostToDevice, s));
    CHECK(cudaEventRecord(fork, s));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaMemsetAsync(c, 9, N, s2));
    if (kernel) add_one<<<64, 256, 0, s>>>(a, N);
    CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s, join, 0));
    CHECK(cudaMemcpyAsync(out, b, N - 1024, cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpyAsync(out + N - 1024, c, 1024, cudaMemcpyDeviceToHost, s));
    unsigned long long id1 = 0, id2 = 0;
    cudaStreamCaptureStatus st1, st2;
    CHECK(cudaStreamGetCaptureInfo(s, &st1, &id1));
    CHECK(cudaStreamGetCaptureInfo(s2, &st2, &id2));
    printf("during: origin %d, joined %d, same capture %d\n", (int)st1, (int)st2,
           id1 == id2 && id1 != 0);
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s, &graph));
    printf("after: capturing %d %d\n", status_of(s), status_of(s2));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    cudaGraphNode_t *list = (cudaGraphNode_t *)calloc(nodes + 2, sizeof *list);
    size_t asked = nodes + 2;
    CHECK(cudaGraphGetNodes(graph, list, &asked));
    printf("nodes: counted %d, listed %d, past the end null %d\n", nodes > 0,
           asked == nodes && list[nodes - 1] != nullptr, list[nodes] == nullptr);
    free(list);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphUpload(exec, s));
    memset(out, 0, N);
    CHECK(cudaDeviceSynchronize());
    size_t ran = 0;
    for (size_t i = 0; i < N; i++) ran += out[i] != 0;
    printf("captured work ran before launch: %zu bytes\n", ran);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < N; i++) in[i] = (unsigned char)(i * 7 + round * 31);
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        size_t bad = 0;
        for (size_t i = 0; i < N - 1024; i++)
            bad += out[i] != (unsigned char)(in[i] + kernel);
        for (size_t i = N - 1024; i < N; i++) bad += out[i] != 9;
        if (bad) printf("replay %d: %zu wrong bytes\n", round, bad);
        wrong += bad;
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));

    // Refused at capture: a copy from pageable memory, a synchronisation of the stream.
    unsigned char *pageable = (unsigned char *)malloc(N);
    memset(pageable, 1, N);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaError_t copy = cudaMemcpyAsync(a, pageable, N, cudaMemcpyHostToDevice, s);
    cudaGraph_t g2 = nullptr;
    cudaError_t end = cudaStreamEndCapture(s, &g2);
    printf("pageable copy in a capture: %s, end: %s, graph %s\n", cudaGetErrorName(copy),
           cudaGetErrorName(end), g2 ? "made" : "none");
    if (g2) CHECK(cudaGraphDestroy(g2));
    cudaGetLastError();
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    cudaError_t sync = cudaStreamSynchronize(s);
    g2 = nullptr;
    end = cudaStreamEndCapture(s, &g2);
    printf("synchronize in a capture: %s, end: %s, graph %s\n", cudaGetErrorName(sync),
           cudaGetErrorName(end), g2 ? "made" : "none");
    if (g2) CHECK(cudaGraphDestroy(g2));
    cudaGetLastError();
    free(pageable);

    // Pageable memory and a host function in a captured graph: the function runs after
    // the copy before it, and sees its bytes; each replay reads the pageable source anew.
    {
        unsigned char *pin = (unsigned char *)malloc(N), *pout = (unsigned char *)malloc(N);
        unsigned char *pout2 = (unsigned char *)malloc(1024);
        HostCheck hc = { pout, pin, kernel, 0, 0 };
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        CHECK(cudaMemcpyAsync(a, pin, N, cudaMemcpyHostToDevice, s));
        if (kernel) add_one<<<64, 256, 0, s>>>(a, N);
        CHECK(cudaMemcpyAsync(pout, a, N, cudaMemcpyDeviceToHost, s));
        CHECK(cudaLaunchHostFunc(s, host_check, &hc));
        CHECK(cudaMemsetAsync(c, 4, 1024, s));
        CHECK(cudaMemcpyAsync(pout2, c, 1024, cudaMemcpyDeviceToHost, s));
        cudaGraph_t g3;
        CHECK(cudaStreamEndCapture(s, &g3));
        size_t count3 = 0;
        CHECK(cudaGraphGetNodes(g3, nullptr, &count3));
        cudaGraphExec_t e3;
        CHECK(cudaGraphInstantiate(&e3, g3, 0));
        size_t bad = 0;
        for (int round = 0; round < 3; round++) {
            for (size_t i = 0; i < N; i++) pin[i] = (unsigned char)(i * 5 + round * 17);
            memset(pout2, 0, 1024);
            CHECK(cudaGraphLaunch(e3, s));
            CHECK(cudaStreamSynchronize(s));
            for (size_t i = 0; i < 1024; i++) bad += pout2[i] != 4;
        }
        printf("pageable and a host function: %zu nodes, host function ran %d times with "
               "%zu wrong bytes, %zu wrong after\n", count3 > 0 ? (size_t)1 : (size_t)0,
               hc.calls, hc.bad, bad);
        wrong += hc.bad + bad + (hc.calls != 3);
        CHECK(cudaGraphExecDestroy(e3));
        CHECK(cudaGraphDestroy(g3));
        free(pin);
        free(pout);
        free(pout2);
    }

    // Built node by node: in -> a, a (+1 on its first `half` bytes) -> out; c = 5 -> out's
    // last KiB after it, through an explicit dependency.
    size_t half = N;
    void *args[] = { &a, &half };
    cudaKernelNodeParams kp = {};
    kp.func = (void *)add_one;
    kp.gridDim = dim3(64);
    kp.blockDim = dim3(256);
    kp.kernelParams = args;
    Built first = build(5, kernel, a, c, in, out, &kp, fork), again = build(6, kernel, a, c, in,
                                                                           out, &kp, fork);
    size_t count = 0;
    CHECK(cudaGraphGetNodes(first.graph, nullptr, &count));
    CHECK(cudaGraphInstantiate(&exec, first.graph, 0));
    for (size_t i = 0; i < N; i++) in[i] = (unsigned char)(i * 3);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventSynchronize(fork));
    size_t bad = 0;
    for (size_t i = 0; i < N - 1024; i++) bad += out[i] != (unsigned char)(in[i] + kernel);
    for (size_t i = N - 1024; i < N; i++) bad += out[i] != 5;
    if (kernel) {  // the instantiation's kernel now bumps only the first half
        half = N / 2;
        CHECK(cudaGraphExecKernelNodeSetParams(exec, first.bump, &kp));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        for (size_t i = 0; i < N - 1024; i++)
            bad += out[i] != (unsigned char)(in[i] + (i < N / 2));
        half = N;
    }
    // a graph of the same shape with another memset value updates the instantiation
    cudaGraphExecUpdateResultInfo info;
    cudaError_t updated = cudaGraphExecUpdate(exec, again.graph, &info);
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t i = N - 1024; i < N; i++) bad += out[i] != (updated ? 5 : 6);
    printf("built: %zu nodes, update %s, wrong %zu\n", count, cudaGetErrorName(updated), bad);
    wrong += bad;
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(first.graph));
    CHECK(cudaGraphDestroy(again.graph));

    // A host node built by hand, between a copy it reads and a memset after it.
    {
        cudaGraph_t hg;
        CHECK(cudaGraphCreate(&hg, 0));
        cudaGraphNode_t set8, copy8, host, set9, copy9;
        cudaMemsetParams mp = {};
        mp.dst = c;
        mp.value = 8;
        mp.elementSize = 1;
        mp.width = 1024;
        mp.height = 1;
        CHECK(cudaGraphAddMemsetNode(&set8, hg, nullptr, 0, &mp));
        CHECK(cudaGraphAddMemcpyNode1D(&copy8, hg, &set8, 1, out, c, 1024, cudaMemcpyDeviceToHost));
        TailCheck tc = { out, 8, 0, 0 };
        cudaHostNodeParams hp = { tail_check, &tc };
        CHECK(cudaGraphAddHostNode(&host, hg, &copy8, 1, &hp));
        mp.value = 9;
        CHECK(cudaGraphAddMemsetNode(&set9, hg, nullptr, 0, &mp));
        CHECK(cudaGraphAddDependencies(hg, &host, &set9, nullptr, 1));
        CHECK(cudaGraphAddMemcpyNode1D(&copy9, hg, &set9, 1, out + 1024, c, 1024,
                                       cudaMemcpyDeviceToHost));
        size_t hn = 0;
        CHECK(cudaGraphGetNodes(hg, nullptr, &hn));
        cudaGraphExec_t he;
        CHECK(cudaGraphInstantiate(&he, hg, 0));
        size_t bad = 0;
        for (int round = 0; round < 2; round++) {
            memset(out, 0, 2048);
            CHECK(cudaGraphLaunch(he, s));
            CHECK(cudaStreamSynchronize(s));
            for (size_t i = 1024; i < 2048; i++) bad += out[i] != 9;
        }
        printf("host node: %zu nodes, ran %d times, saw %zu wrong bytes, %zu wrong after\n", hn,
               tc.calls, tc.bad, bad);
        wrong += tc.bad + bad + (tc.calls != 2);
        CHECK(cudaGraphExecDestroy(he));
        CHECK(cudaGraphDestroy(hg));
    }

    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    printf("graphs: wrong=%llu\n", wrong);
    return wrong != 0;
}
