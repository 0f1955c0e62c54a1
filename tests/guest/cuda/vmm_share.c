/* VMM memory shared between two processes as a POSIX file descriptor, as
 * cuda-samples' memMapIPCDrv does it: the parent creates exportable memory, maps and
 * fills it, exports it (cuMemExportToShareableHandle) and sends the descriptor over a
 * unix socket (SCM_RIGHTS) to its child (forked before either uses CUDA); the child
 * imports it, maps it into its own addresses and adds to it with a kernel; the parent
 * reads what the child wrote. Built against cuda.h, linked with -l:libcuda.so.1.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "share_common.h"

#define N 4096

static CUmemAllocationProp exportable(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

/* Reserve, map and make readable-writable `size` bytes of `h`. */
static CUdeviceptr mapped(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc rw = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CHECK(cuMemSetAccess(va, size, &rw, 1));
    return va;
}

static void send_fd(int sock, int fd, size_t size) {
    char data[sizeof size];
    memcpy(data, &size, sizeof size);
    struct iovec iov = { data, sizeof data };
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof c.buf };
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != (ssize_t)sizeof data) { perror("sendmsg"); exit(1); }
}

static int receive_fd(int sock, size_t *size) {
    char data[sizeof *size];
    struct iovec iov = { data, sizeof data };
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof c.buf };
    if (recvmsg(sock, &m, 0) != (ssize_t)sizeof data) { perror("recvmsg"); exit(1); }
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS) { fprintf(stderr, "no descriptor came\n"); exit(1); }
    int fd;
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
    memcpy(size, data, sizeof *size);
    return fd;
}

static int child(int sock) {
    size_t size;
    int fd = receive_fd(sock, &size);
    context();
    CUmemGenericAllocationHandle h;
    CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr y = mapped(h, size), x;
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
    CHECK(cuMemUnmap(y, size));
    CHECK(cuMemAddressFree(y, size));
    CHECK(cuMemRelease(h));
    CHECK(cuMemFree(x));
    printf("child: imported %d bytes, mapped them and wrote them with a kernel\n", (int)size);
    fflush(stdout);
    char done = 1;
    if (write(sock, &done, 1) != 1) return 1;
    return 0;
}

int main(void) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair)) { perror("socketpair"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) { close(pair[0]); return child(pair[1]); }
    close(pair[1]);
    context();
    int fd_supported = -1;
    CHECK(cuDeviceGetAttribute(&fd_supported,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    CUmemAllocationProp prop = exportable();
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = (N * sizeof(float) + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr y = mapped(h, size);
    CHECK(cuMemsetD32(y, ONE_F, N));
    CHECK(cuCtxSynchronize());
    int fd = -1;
    CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    printf("parent: POSIX fd handles %d; exported a descriptor %d\n", fd_supported, fd >= 0);
    fflush(stdout);
    send_fd(pair[0], fd, size);
    close(fd);
    char done;
    if (read(pair[0], &done, 1) != 1) { fprintf(stderr, "the child did not answer\n"); return 1; }
    float *back = malloc(N * sizeof(float));
    CHECK(cuMemcpyDtoH(back, y, N * sizeof(float)));
    int right = 0;
    for (int i = 0; i < N; i++) right += back[i] == 3.0f;
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent: the child wrote %d of %d values; it exited %d\n", right, N,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(cuMemUnmap(y, size));
    CHECK(cuMemAddressFree(y, size));
    CHECK(cuMemRelease(h));
    free(back);
    return right == N && WIFEXITED(status) && !WEXITSTATUS(status) ? 0 : 1;
}
