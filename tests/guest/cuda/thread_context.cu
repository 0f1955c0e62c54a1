// A thread the program starts has no current context until the runtime makes one
// current for it, as it does on its first call that needs the device (libraries such
// as cuBLAS read the thread's current context through the driver).
#include <cstdio>
#include <thread>
#include <cuda.h>
#include <cuda_runtime.h>

int main() {
    cudaFree(0);
    CUcontext main_ctx = nullptr;
    cuCtxGetCurrent(&main_ctx);
    int ok = 0;
    std::thread worker([&] {
        CUcontext before = nullptr, after = nullptr;
        cuCtxGetCurrent(&before);
        void *p = nullptr;
        cudaError_t e = cudaMalloc(&p, 256);
        cuCtxGetCurrent(&after);
        printf("before %s, cudaMalloc %d, after %s\n", before ? "set" : "none", (int)e,
               after == main_ctx ? "the primary context" : "another");
        ok = e == cudaSuccess && after == main_ctx;
        cudaFree(p);
    });
    worker.join();
    return ok ? 0 : 1;
}
