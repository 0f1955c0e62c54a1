/* How a capture ends where the program does not end it itself, through the shim only
 * (driver API, plain C). Checks the shim's round-trip counter (hvgpu_shim_round_trips):
 * with no capture under way a capture query is answered in the guest.
 *
 *   capture_edges failed     a one-way frame of the capture fails (a destroyed event is
 *                            recorded): the end fails, invalidated, and the capture is
 *                            over; the frame's own error comes at the next call
 *   capture_edges refused    a pageable copy in a capture while an earlier one-way
 *                            frame's error (on another stream) is owed: that error is
 *                            the copy's answer, the copy is not made, and the capture
 *                            is invalidated (no graph without the copy)
 *   capture_edges destroyed  the capturing stream is destroyed: the capture is over
 *   capture_edges fork       a child forked during the parent's capture has none
 *   capture_edges full       one capture more than the shim keeps at once is refused,
 *                            and leaves no graph on the executor
 *   capture_edges queries    a framework's allocator during a capture: a capture
 *                            query on every allocation, more of them than the
 *                            executor gives node handles to a connection
 *   capture_edges layout     against an agent that lies about a kernel's parameter
 *                            layout: a kernel node and a launch are refused, and the
 *                            program's memory is not overrun
 *
 * Prints what it saw; exits 1 at the first call that did not do what it should.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cuDevicePrimaryCtxRetain(void **ctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuCtxSynchronize(void);
int cuStreamCreate(void **stream, unsigned flags);
int cuStreamDestroy_v2(void *stream);
int cuStreamSynchronize(void *stream);
int cuEventCreate(void **event, unsigned flags);
int cuEventDestroy_v2(void *event);
int cuEventRecord(void *event, void *stream);
int cuStreamBeginCapture_v2(void *stream, int mode);
int cuStreamEndCapture(void *stream, void **graph);
int cuStreamIsCapturing(void *stream, int *status);
int cuGraphDestroy(void *graph);
int cuStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id);
int cuMemAlloc_v2(unsigned long long *dptr, size_t n);
int cuMemFree_v2(unsigned long long dptr);
int cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t n, void *stream);
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *stream);
int cuGraphCreate(void **graph, unsigned flags);
int cuModuleLoadData(void **module, const void *image);
int cuModuleGetFunction(void **fn, void *module, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra);
typedef struct {                                   /* CUDA_KERNEL_NODE_PARAMS_v2 */
    void *func;
    unsigned gx, gy, gz, bx, by, bz, smem;
    void **params, **extra;
    void *kern, *ctx;
} kernel_node_params;
int cuGraphAddKernelNode_v2(void **node, void *graph, void *const *deps, size_t ndeps,
                            const kernel_node_params *p);

enum { GLOBAL = 0, RELAXED = 2, INVALID_VALUE = 1, INVALID_HANDLE = 400, OUT_OF_MEMORY = 2,
       CAPTURE_INVALIDATED = 901, MAX_CAPTURES = 256 };

#define CHECK(call) do { int r_ = (call); if (r_) { \
    printf("%s: %d (line %d)\n", #call, r_, __LINE__); exit(1); } } while (0)
#define EXPECT(what, got, want) do { long long g_ = (long long)(got), w_ = (long long)(want); \
    if (g_ != w_) { printf("%s: %lld, expected %lld (line %d)\n", what, g_, w_, __LINE__); \
    exit(1); } } while (0)
#define ASSERT(cond) do { if (!(cond)) { printf("expected %s (line %d)\n", #cond, __LINE__); \
    exit(1); } } while (0)

static uint64_t (*round_trips)(void);

static void setup(void) {
    round_trips = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "hvgpu_shim_round_trips");
    ASSERT(round_trips);
    void *ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
}

static void *stream(void) {
    void *s;
    CHECK(cuStreamCreate(&s, 1));
    return s;
}

/* What a capture query answers of s, and that no capture under way made it ask. */
static int status_without_a_round_trip(void *s) {
    uint64_t before = round_trips();
    int st = -1;
    CHECK(cuStreamIsCapturing(s, &st));
    EXPECT("round trips of a query with no capture under way", round_trips() - before, 0);
    return st;
}

static void capture_once(void *s) {
    void *graph = NULL;
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    CHECK(cuStreamEndCapture(s, &graph));
    ASSERT(graph != NULL);
    CHECK(cuGraphDestroy(graph));
}

static int failed(void) {
    void *s = stream(), *event, *graph = (void *)1;
    CHECK(cuEventCreate(&event, 0));
    CHECK(cuEventDestroy_v2(event));
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    CHECK(cuEventRecord(event, s)); /* one-way: its error comes later */
    EXPECT("the end of a capture whose frame failed", cuStreamEndCapture(s, &graph),
           CAPTURE_INVALIDATED);
    ASSERT(graph == NULL);
    EXPECT("capturing after the end", status_without_a_round_trip(s), 0);
    EXPECT("the failed frame's error", cuStreamSynchronize(s), INVALID_HANDLE);
    CHECK(cuStreamSynchronize(s));
    capture_once(s);
    printf("failed frame: the capture ended, invalidated\n");
    return 0;
}

static int refused(void) {
    void *s = stream(), *other = stream(), *event, *graph = (void *)1;
    static unsigned char pageable[4096];
    unsigned long long dptr;
    CHECK(cuMemAlloc_v2(&dptr, sizeof pageable));
    CHECK(cuEventCreate(&event, 0));
    CHECK(cuEventDestroy_v2(event));
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    CHECK(cuEventRecord(event, other)); /* fails later, on a stream not capturing */
    EXPECT("a pageable copy in the capture",
           cuMemcpyHtoDAsync_v2(dptr, pageable, sizeof pageable, s), INVALID_HANDLE);
    EXPECT("the end of a capture that lost a copy", cuStreamEndCapture(s, &graph),
           CAPTURE_INVALIDATED);
    ASSERT(graph == NULL);
    CHECK(cuStreamSynchronize(other));
    CHECK(cuMemFree_v2(dptr));
    printf("refused copy: the earlier error reported, the capture invalidated\n");
    return 0;
}

static int destroyed(void) {
    void *s = stream(), *other = stream();
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    CHECK(cuStreamDestroy_v2(s));
    EXPECT("capturing after the stream went", status_without_a_round_trip(other), 0);
    capture_once(other);
    printf("destroyed stream: the capture ended\n");
    return 0;
}

static int forked(void) {
    void *s = stream();
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) { /* the parent's capture is its executor's, not the child's */
        CHECK(cuCtxSynchronize());
        void *mine = stream();
        EXPECT("capturing in the child", status_without_a_round_trip(mine), 0);
        capture_once(mine);
        printf("child: no capture of its own until it began one\n");
        fflush(stdout);
        _exit(0);
    }
    int status = 1;
    ASSERT(child > 0 && waitpid(child, &status, 0) == child);
    EXPECT("the child's exit", status, 0);
    void *graph = NULL;
    CHECK(cuStreamEndCapture(s, &graph));
    ASSERT(graph != NULL);
    CHECK(cuGraphDestroy(graph));
    printf("parent: ended its capture\n");
    return 0;
}

static int full(void) {
    static void *s[MAX_CAPTURES + 1];
    for (int i = 0; i <= MAX_CAPTURES; i++) s[i] = stream();
    for (int i = 0; i < MAX_CAPTURES; i++) CHECK(cuStreamBeginCapture_v2(s[i], RELAXED));
    EXPECT("one capture too many", cuStreamBeginCapture_v2(s[MAX_CAPTURES], RELAXED),
           OUT_OF_MEMORY);
    int st = -1;
    CHECK(cuStreamIsCapturing(s[MAX_CAPTURES], &st));
    EXPECT("capturing after the refusal", st, 0);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        void *graph = NULL;
        CHECK(cuStreamEndCapture(s[i], &graph));
        CHECK(cuGraphDestroy(graph));
    }
    printf("full: %d captures at once, one more refused\n", MAX_CAPTURES);
    return 0;
}

static int queries(void) {
    enum { QUERIES = 70000 }; /* graphs.MAX_NODES is 65536 */
    void *s = stream(), *graph = NULL;
    unsigned long long dptr, id = 0, first = 0;
    CHECK(cuMemAlloc_v2(&dptr, 4096));
    CHECK(cuStreamBeginCapture_v2(s, GLOBAL));
    for (int i = 0; i < QUERIES; i++) {
        CHECK(cuMemsetD8Async(dptr + i % 4096, 1, 1, s));
        int st = -1;
        CHECK(cuStreamGetCaptureInfo(s, &st, &id));
        EXPECT("capturing", st, 1);
        if (!i) first = id;
        EXPECT("the capture's id", id, first);
    }
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFree_v2(dptr));
    printf("queries: %d during one capture\n", QUERIES);
    return 0;
}

/* One float parameter (the test double's kernel of this name takes four; the agent this
   runs against says otherwise). */
static const char ptx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry saxpy(.param .f32 a)\n{\n ret;\n}\n";

static int layout(void) {
    void *module, *fn, *graph, *node;
    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&fn, module, "saxpy"));
    CHECK(cuGraphCreate(&graph, 0));
    float a = 2.0f;
    void *params[] = { &a };
    kernel_node_params p = { fn, 1, 1, 1, 32, 1, 1, 0, params, NULL, NULL, NULL };
    EXPECT("a kernel node of a lying layout", cuGraphAddKernelNode_v2(&node, graph, NULL, 0, &p),
           INVALID_VALUE);
    EXPECT("a launch of a lying layout",
           cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL), INVALID_VALUE);
    CHECK(cuGraphDestroy(graph));
    printf("layout: refused\n");
    return 0;
}

int main(int argc, char **argv) {
    setup();
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "failed")) return failed();
    if (!strcmp(mode, "destroyed")) return destroyed();
    if (!strcmp(mode, "refused")) return refused();
    if (!strcmp(mode, "fork")) return forked();
    if (!strcmp(mode, "full")) return full();
    if (!strcmp(mode, "layout")) return layout();
    if (!strcmp(mode, "queries")) return queries();
    printf("usage: capture_edges failed|refused|destroyed|fork|full|layout|queries\n");
    return 2;
}
