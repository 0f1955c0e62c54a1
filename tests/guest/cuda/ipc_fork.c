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

#include "share_common.h"

#define N 4096

struct handles { CUipcMemHandle mem; CUipcEventHandle event; };

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
