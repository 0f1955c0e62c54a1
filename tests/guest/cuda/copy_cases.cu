// Copies as a program makes them, one case per line of standard input, each checked
// byte for byte: the destination is poisoned first (guard bytes before and after the
// range too), the source holds a fresh pattern of the case's seed, and the copy must
// leave exactly that pattern in the range and the poison everywhere else.
//
//   api dir kind form size src_offset dst_offset seed
//
//   api   rt (cudaMemcpy*) or drv (cuMemcpy*)
//   dir   h2d, d2h or d2d
//   kind  pageable (malloc), pinned (cudaMallocHost / cuMemAllocHost) or graph (an
//         asynchronous copy from or to pinned memory, captured on a stream into a
//         graph, which is instantiated and launched)
//   form  sync (cudaMemcpy) or async (cudaMemcpyAsync on a stream, then its sync)
//
// Prints "CASE status=S wrong=W outside=O" per case: S the first failing call's
// status, W the bytes of the range that differ, O the poisoned bytes around it that
// changed. Linked against libcuda.so.1 by name: the shim, or natively the driver.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static const size_t GUARD = 64;
static const unsigned char POISON = 0x5A;

static void pattern(unsigned char *p, size_t n, unsigned seed) {
    unsigned x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
        if (p[i] == POISON) p[i] = (unsigned char)~POISON; // a byte left untouched shows
    }
}

struct Host {
    unsigned char *p = nullptr;
    bool pinned = false;
    int alloc(size_t n, bool pin, bool drv) {
        pinned = pin;
        if (!pin) { p = (unsigned char *)malloc(n); return p ? 0 : 2; }
        return drv ? (int)cuMemAllocHost((void **)&p, n) : (int)cudaMallocHost(&p, n);
    }
    void release(bool drv) {
        if (!p) return;
        if (!pinned) free(p);
        else if (drv) cuMemFreeHost(p);
        else cudaFreeHost(p);
    }
};

struct Copy {
    bool drv;
    int dir; // 0 h2d, 1 d2h, 2 d2d
    void *dst; const void *src; size_t n;
    int run(cudaStream_t s, bool async) const {
        if (drv) {
            CUstream cs = (CUstream)s;
            switch (dir) {
            case 0: return async ? cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, cs)
                                 : cuMemcpyHtoD((CUdeviceptr)dst, src, n);
            case 1: return async ? cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, cs)
                                 : cuMemcpyDtoH(dst, (CUdeviceptr)src, n);
            default: return async ? cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, cs)
                                  : cuMemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, n);
            }
        }
        cudaMemcpyKind k = dir == 0 ? cudaMemcpyHostToDevice
                         : dir == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
        return async ? (int)cudaMemcpyAsync(dst, src, n, k, s) : (int)cudaMemcpy(dst, src, n, k);
    }
};

static int sync_stream(bool drv, cudaStream_t s) {
    return drv ? (int)cuStreamSynchronize((CUstream)s) : (int)cudaStreamSynchronize(s);
}

// The copy captured into a graph, instantiated, launched and waited for.
static int captured(const Copy &c, bool drv, cudaStream_t s) {
    int r;
    if (drv) {
        CUgraph g; CUgraphExec e;
        if ((r = cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL))) return r;
        int copy = c.run(s, true);
        if ((r = cuStreamEndCapture((CUstream)s, &g))) return copy ? copy : r;
        if (copy) { cuGraphDestroy(g); return copy; }
        if ((r = cuGraphInstantiate(&e, g, 0))) { cuGraphDestroy(g); return r; }
        r = cuGraphLaunch(e, (CUstream)s);
        if (!r) r = cuStreamSynchronize((CUstream)s);
        cuGraphExecDestroy(e);
        cuGraphDestroy(g);
        return r;
    }
    cudaGraph_t g; cudaGraphExec_t e;
    if ((r = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal))) return r;
    int copy = c.run(s, true);
    if ((r = cudaStreamEndCapture(s, &g))) return copy ? copy : r;
    if (copy) { cudaGraphDestroy(g); return copy; }
    if ((r = cudaGraphInstantiate(&e, g, 0))) { cudaGraphDestroy(g); return r; }
    r = cudaGraphLaunch(e, s);
    if (!r) r = cudaStreamSynchronize(s);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    return r;
}

// One case; returns the first failing status, and counts the wrong and outside bytes.
static int one(bool drv, int dir, const char *kind, bool async, size_t n, size_t soff,
               size_t doff, unsigned seed, cudaStream_t s, size_t *wrong, size_t *outside) {
    bool graph = !strcmp(kind, "graph"), pin = graph || !strcmp(kind, "pinned");
    size_t src_len = soff + n + GUARD, dst_len = doff + n + GUARD;
    unsigned char *want = (unsigned char *)malloc(n + 1), *seen = (unsigned char *)malloc(dst_len);
    pattern(want, n, seed);
    Host host, scratch;
    void *dsrc = nullptr, *ddst = nullptr;
    int r = 0;
    Copy c{drv, dir, nullptr, nullptr, n};
    // the device side (and, for h2d and d2d, the read-back) through plain copies
    if (dir == 0) {
        if (!r) r = host.alloc(src_len, pin, drv);
        if (!r) { memset(host.p, ~POISON, src_len); memcpy(host.p + soff, want, n); }
        if (!r) r = (int)cudaMalloc(&ddst, dst_len);
        if (!r) r = (int)cudaMemset(ddst, POISON, dst_len);
        c.src = host.p + soff; c.dst = (char *)ddst + doff;
    } else if (dir == 1) {
        if (!r) r = (int)cudaMalloc(&dsrc, src_len);
        if (!r) r = scratch.alloc(src_len, false, drv);
        if (!r) { memset(scratch.p, ~POISON, src_len); memcpy(scratch.p + soff, want, n); }
        if (!r) r = (int)cudaMemcpy(dsrc, scratch.p, src_len, cudaMemcpyHostToDevice);
        if (!r) r = host.alloc(dst_len, pin, drv);
        if (!r) memset(host.p, POISON, dst_len);
        c.src = (char *)dsrc + soff; c.dst = host.p + doff;
    } else {
        if (!r) r = (int)cudaMalloc(&dsrc, src_len);
        if (!r) r = (int)cudaMalloc(&ddst, dst_len);
        if (!r) r = scratch.alloc(src_len, false, drv);
        if (!r) { memset(scratch.p, ~POISON, src_len); memcpy(scratch.p + soff, want, n); }
        if (!r) r = (int)cudaMemcpy(dsrc, scratch.p, src_len, cudaMemcpyHostToDevice);
        if (!r) r = (int)cudaMemset(ddst, POISON, dst_len);
        c.src = (char *)dsrc + soff; c.dst = (char *)ddst + doff;
    }
    // The set-up ran on the legacy stream; the case's stream does not wait for it.
    if (!r) r = (int)cudaDeviceSynchronize();
    if (!r) {
        if (graph) r = captured(c, drv, s);
        else {
            r = c.run(s, async);
            if (!r && async) r = sync_stream(drv, s);
        }
    }
    if (!r) {
        if (dir == 1) memcpy(seen, host.p, dst_len);
        else r = (int)cudaMemcpy(seen, ddst, dst_len, cudaMemcpyDeviceToHost);
    }
    *wrong = *outside = 0;
    if (!r) {
        for (size_t i = 0; i < n; i++) *wrong += seen[doff + i] != want[i];
        for (size_t i = 0; i < doff; i++) *outside += seen[i] != POISON;
        for (size_t i = doff + n; i < dst_len; i++) *outside += seen[i] != POISON;
    }
    host.release(drv);
    scratch.release(drv);
    if (dsrc) cudaFree(dsrc);
    if (ddst) cudaFree(ddst);
    free(want);
    free(seen);
    return r;
}

int main() {
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) { puts("no stream"); return 1; }
    char api[8], dir[8], kind[16], form[8];
    unsigned long long n, soff, doff;
    unsigned seed;
    int i = 0;
    while (scanf("%7s %7s %15s %7s %llu %llu %llu %u", api, dir, kind, form, &n, &soff, &doff,
                 &seed) == 8) {
        int d = !strcmp(dir, "h2d") ? 0 : !strcmp(dir, "d2h") ? 1 : 2;
        size_t wrong, outside;
        int r = one(!strcmp(api, "drv"), d, kind, !strcmp(form, "async"), n, soff, doff, seed, s,
                    &wrong, &outside);
        printf("%d status=%d wrong=%zu outside=%zu\n", i++, r, wrong, outside);
        fflush(stdout);
    }
    cudaStreamDestroy(s);
    return 0;
}
