/* CUDA IPC between two processes, as cuda-samples' simpleIPC does it: the parent
 * allocates and fills memory, records an interprocess event and sends both handles
 * down a pipe to its forked child (forked before either uses CUDA); the child opens
 * them, waits for the event and adds to the memory with a kernel; the parent reads
 * what the child wrote. Each side also prints the status of what the driver refuses
 * (opening a handle in the process that made it, exporting a timed event, freeing
 * or closing imported memory the wrong way, a made-up handle), so that the run
 * through the shim can be compared line for line with the run on the driver.
 *
 * Built against cuda.h and linked with -l:libcuda.so.1 (the shim, or the driver).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 4096

static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n\n"
    ".visible .entry saxpy(.param .f32 saxpy_a, .param .u64 saxpy_x, .param .u64 saxpy_y,\n"
    "    .param .u32 saxpy_n)\n{\n"
    "    .reg .pred %p<2>;\n    .reg .f32 %f<5>;\n    .reg .b32 %r<6>;\n    .reg .b64 %rd<8>;\n"
    "    ld.param.f32 %f1, [saxpy_a];\n    ld.param.u64 %rd1, [saxpy_x];\n"
    "    ld.param.u64 %rd2, [saxpy_y];\n    ld.param.u32 %r1, [saxpy_n];\n"
    "    mov.u32 %r2, %ctaid.x;\n    mov.u32 %r3, %ntid.x;\n    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n    setp.ge.u32 %p1, %r5, %r1;\n    @%p1 bra DONE;\n"
    "    cvta.to.global.u64 %rd3, %rd1;\n    cvta.to.global.u64 %rd4, %rd2;\n"
    "    mul.wide.u32 %rd5, %r5, 4;\n    add.s64 %rd6, %rd3, %rd5;\n    add.s64 %rd7, %rd4, %rd5;\n"
    "    ld.global.f32 %f2, [%rd6];\n    ld.global.f32 %f3, [%rd7];\n"
    "    fma.rn.f32 %f4, %f1, %f2, %f3;\n    st.global.f32 [%rd7], %f4;\nDONE:\n    ret;\n}\n";

#define CHECK(call) do { CUresult r_ = (call); if (r_) { \
    const char *s_ = "?"; cuGetErrorName(r_, &s_); \
    fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call, s_, (int)r_); \
    exit(1); } } while (0)

static unsigned ONE_F = 0x3f800000u; /* 1.0f */

struct handles { CUipcMemHandle mem; CUipcEventHandle event; };

static void context(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

static void full(int fd, void *p, size_t n, int out) {
    for (size_t done = 0; done < n;) {
        ssize_t k = out ? write(fd, (char *)p + done, n - done) : read(fd, (char *)p + done, n - done);
        if (k <= 0) { perror(out ? "write" : "read"); exit(1); }
        done += (size_t)k;
    }
}

static int child(int from_parent, int to_parent) {
    struct handles h;
    full(from_parent, &h, sizeof h, 0);
    context();
    CUdeviceptr y, y_again, x;
    CUevent ready;
    CHECK(cuIpcOpenMemHandle(&y, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(cuIpcOpenMemHandle(&y_again, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(cuIpcOpenEventHandle(&ready, h.event));
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange(&base, &size, y + 8));
    printf("child: opened %d bytes, the same pointer twice %d, its base %d\n", (int)size,
           y == y_again, base == y);
    CHECK(cuStreamWaitEvent(NULL, ready, 0));
    CUmodule mod;
    CUfunction saxpy;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    CHECK(cuMemAlloc(&x, N * sizeof(float)));
    CHECK(cuMemsetD32(x, ONE_F, N));
    float a = 2.0f;
    unsigned n = N;
    void *params[] = { &a, &x, &y, &n };
    CHECK(cuLaunchKernel(saxpy, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    CUipcMemHandle zero;
    memset(&zero, 0, sizeof zero);
    CUdeviceptr nothing = 0;
    int freed = (int)cuMemFree(y);
    int closed = (int)cuIpcCloseMemHandle(y);
    int closed_last = (int)cuIpcCloseMemHandle(y_again);
    int closed_again = (int)cuIpcCloseMemHandle(y);
    int zero_opened = (int)cuIpcOpenMemHandle(&nothing, zero, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("child: cuMemFree of opened memory %d, closed %d then %d, closed again %d, "
           "a zeroed handle %d\n", freed, closed, closed_last, closed_again, zero_opened);
    CHECK(cuEventDestroy(ready));
    CHECK(cuMemFree(x));
    fflush(stdout);
    char done = 1;
    full(to_parent, &done, 1, 1);
    return 0;
}

int main(void) {
    int down[2], up[2];
    if (pipe(down) || pipe(up)) { perror("pipe"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) return child(down[0], up[1]);
    context();
    CUdeviceptr y;
    CUevent ready, timed;
    struct handles h;
    CHECK(cuMemAlloc(&y, N * sizeof(float)));
    CHECK(cuMemsetD32(y, ONE_F, N));
    CHECK(cuEventCreate(&ready, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventRecord(ready, NULL));
    CHECK(cuIpcGetMemHandle(&h.mem, y));
    CHECK(cuIpcGetEventHandle(&h.event, ready));
    CHECK(cuEventCreate(&timed, CU_EVENT_INTERPROCESS));
    CUipcEventHandle refused;
    CUdeviceptr mine = 0;
    CUevent mine_event = NULL;
    int own_memory = (int)cuIpcOpenMemHandle(&mine, h.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    int own_event = (int)cuIpcOpenEventHandle(&mine_event, h.event);
    int timed_event = (int)cuIpcGetEventHandle(&refused, timed);
    int ipc_events = -1;
    CHECK(cuDeviceGetAttribute(&ipc_events, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0));
    printf("parent: IPC events %d; opening its own memory handle %d, its own event handle %d, "
           "exporting a timed event %d\n", ipc_events, own_memory, own_event, timed_event);
    fflush(stdout);
    full(down[1], &h, sizeof h, 1);
    char done;
    full(up[0], &done, 1, 0);
    float *back = malloc(N * sizeof(float));
    CHECK(cuMemcpyDtoH(back, y, N * sizeof(float)));
    int right = 0;
    for (int i = 0; i < N; i++) right += back[i] == 3.0f;
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent: the child wrote %d of %d values; it exited %d\n", right, N,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cuEventDestroy(ready));
    CHECK(cuEventDestroy(timed));
    CHECK(cuMemFree(y));
    free(back);
    return right == N && WIFEXITED(status) && !WEXITSTATUS(status) ? 0 : 1;
}
