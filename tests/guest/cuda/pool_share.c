/* A stream-ordered memory pool shared among processes, as cuda-samples'
 * streamOrderedAllocationIPC does it: the parent makes a pool exportable as a POSIX
 * file descriptor, exports it (cuMemPoolExportToShareableHandle), allocates from it on
 * a stream, exports the allocation (cuMemPoolExportPointer) and sends the descriptor
 * and the 64 bytes of export data over a unix socket (SCM_RIGHTS) to each of its
 * children (forked before any uses CUDA), one after the other; each child imports the
 * pool and the allocation, adds to its half with a kernel, frees its import and says
 * so; the parent reads what they wrote, then frees and destroys. Some calls CUDA
 * refuses are made too, their statuses printed. With "abandon", the children exit
 * without freeing or destroying what they imported. Built against cuda.h, linked with -l:libcuda.so.1.
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
#define CHILDREN 2

static void send_fd(int sock, int fd, const CUmemPoolPtrExportData *data) {
    struct iovec iov = { (void *)data, sizeof *data };
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof c.buf };
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != (ssize_t)sizeof *data) { perror("sendmsg"); exit(1); }
}

static int receive_fd(int sock, CUmemPoolPtrExportData *data) {
    struct iovec iov = { data, sizeof *data };
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof c.buf };
    if (recvmsg(sock, &m, MSG_WAITALL) != (ssize_t)sizeof *data) { perror("recvmsg"); exit(1); }
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS) { fprintf(stderr, "no descriptor came\n"); exit(1); }
    int fd;
    memcpy(&fd, CMSG_DATA(h), sizeof fd);
    return fd;
}

static int abandon;

static int child(int id, int sock) {
    CUmemPoolPtrExportData data;
    int fd = receive_fd(sock, &data);
    context();
    CUmemoryPool pool;
    CHECK(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    close(fd);
    CUmemLocation here = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
    CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    CHECK(cuMemPoolGetAccess(&access, pool, &here));
    if (access != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) { /* as the sample does */
        CUmemAccessDesc rw = { here, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        CHECK(cuMemPoolSetAccess(pool, &rw, 1));
        CHECK(cuMemPoolGetAccess(&access, pool, &here));
    }
    CUdeviceptr y, x, other;
    CHECK(cuMemPoolImportPointer(&y, pool, &data));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUresult from_imported = cuMemAllocFromPoolAsync(&other, 512, pool, stream);
    CUmodule mod;
    CUfunction saxpy;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    CHECK(cuMemAlloc(&x, N / CHILDREN * sizeof(float)));
    CHECK(cuMemsetD32(x, ONE_F, N / CHILDREN));
    float a = 2.0f + (float)id;
    unsigned n = N / CHILDREN;
    CUdeviceptr half = y + (CUdeviceptr)id * n * sizeof(float);
    void *params[] = { &a, &x, &half, &n };
    CHECK(cuLaunchKernel(saxpy, n / 256, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    if (abandon) { /* its exit lets go of what it imported */
        CHECK(cuStreamSynchronize(stream));
        printf("child %d: wrote its half and exits holding its imports\n", id);
        fflush(stdout);
        char done = 1;
        return write(sock, &done, 1) != 1;
    }
    CHECK(cuMemFreeAsync(y, stream)); /* the importer frees before the exporter does */
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemFree(x));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemPoolDestroy(pool));
    printf("child %d: imported the pool (access %d) and %d floats, wrote its half with a "
           "kernel, freed them; allocating from the imported pool %d\n", id, (int)access, N,
           (int)from_imported);
    fflush(stdout);
    char done = 1;
    if (write(sock, &done, 1) != 1) return 1;
    return 0;
}

int main(int argc, char **argv) {
    abandon = argc > 1 && !strcmp(argv[1], "abandon");
    int pairs[CHILDREN][2];
    pid_t pids[CHILDREN];
    fflush(stdout);
    for (int i = 0; i < CHILDREN; i++) {
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, pairs[i])) { perror("socketpair"); return 1; }
        pids[i] = fork();
        if (pids[i] < 0) { perror("fork"); return 1; }
        if (pids[i] == 0) { close(pairs[i][0]); return child(i, pairs[i][1]); }
        close(pairs[i][1]);
    }
    context();
    int types = -1, pools = -1;
    CHECK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0));
    CHECK(cuDeviceGetAttribute(&types, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0));
    printf("parent: pools %d, POSIX fd pool handles %d\n", pools,
           (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0);
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props));
    int fd = -1;
    CHECK(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr y, plain;
    CHECK(cuMemAllocFromPoolAsync(&y, N * sizeof(float), pool, stream));
    CHECK(cuMemsetD32Async(y, ONE_F, N, stream));
    CUmemPoolPtrExportData data;
    CHECK(cuMemPoolExportPointer(&data, y));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemAllocAsync(&plain, 512, stream)); /* the default pool: not exportable */
    CUmemPoolPtrExportData refused;
    CUresult from_default = cuMemPoolExportPointer(&refused, plain);
    CHECK(cuMemFreeAsync(plain, stream));
    printf("parent: exported a descriptor %d; exporting the default pool's allocation %d\n",
           fd >= 0, (int)from_default);
    fflush(stdout);
    int exited = 0;
    for (int i = 0; i < CHILDREN; i++) { /* one after the other: their lines in order */
        send_fd(pairs[i][0], fd, &data);
        char done;
        if (read(pairs[i][0], &done, 1) != 1) { fprintf(stderr, "child %d did not answer\n", i); return 1; }
        int status = 0;
        waitpid(pids[i], &status, 0);
        exited += WIFEXITED(status) && !WEXITSTATUS(status);
    }
    close(fd);
    float *back = malloc(N * sizeof(float));
    CHECK(cuMemcpyDtoH(back, y, N * sizeof(float)));
    int right = 0;
    for (int i = 0; i < N; i++) right += back[i] == 3.0f + (float)(i / (N / CHILDREN));
    CHECK(cuMemFreeAsync(y, stream));
    CHECK(cuStreamSynchronize(stream));
    CUresult freed = cuMemPoolExportPointer(&refused, y);
    CHECK(cuMemPoolDestroy(pool));
    CHECK(cuStreamDestroy(stream));
    printf("parent: the children wrote %d of %d values; %d of %d exited 0; exporting the "
           "freed allocation %d\n", right, N, exited, CHILDREN, (int)freed);
    free(back);
    return right == N && exited == CHILDREN ? 0 : 1;
}
