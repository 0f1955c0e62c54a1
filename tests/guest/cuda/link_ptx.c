/* The JIT linker as NVIDIA's ptxjit sample drives it: cuLinkCreate with six options
 * (wall time, info and error log buffers with their sizes, verbose), PTX added, the
 * link completed, the cubin loaded with cuModuleLoadData and launched; the same PTX
 * from a file (cuLinkAddFile); PTX the linker refuses, its error log. Prints the same
 * natively and through the shim. `hostile` (the shim only): options that name host
 * pointers, files that are not there, a link used after it completed. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { \
    printf("%s: %d, not %d\n", #call, r_, (want)); return 1; } } while (0)

static const char PTX[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry saxpy(.param .f32 saxpy_a, .param .u64 saxpy_x, .param .u64 saxpy_y,"
    " .param .u32 saxpy_n)\n{\n"
    ".reg .pred %p<2>;\n.reg .f32 %f<5>;\n.reg .b32 %r<6>;\n.reg .b64 %rd<8>;\n"
    "ld.param.f32 %f1, [saxpy_a];\nld.param.u64 %rd1, [saxpy_x];\n"
    "ld.param.u64 %rd2, [saxpy_y];\nld.param.u32 %r1, [saxpy_n];\n"
    "mov.u32 %r2, %ctaid.x;\nmov.u32 %r3, %ntid.x;\nmov.u32 %r4, %tid.x;\n"
    "mad.lo.u32 %r5, %r2, %r3, %r4;\nsetp.ge.u32 %p1, %r5, %r1;\n@%p1 bra DONE;\n"
    "cvta.to.global.u64 %rd3, %rd1;\ncvta.to.global.u64 %rd4, %rd2;\n"
    "mul.wide.u32 %rd5, %r5, 4;\nadd.s64 %rd6, %rd3, %rd5;\nadd.s64 %rd7, %rd4, %rd5;\n"
    "ld.global.f32 %f2, [%rd6];\nld.global.f32 %f3, [%rd7];\n"
    "fma.rn.f32 %f4, %f1, %f2, %f3;\nst.global.f32 [%rd7], %f4;\nDONE:\nret;\n}\n";


static char info_log[8192], error_log[8192];

static int link_ptx(int from_file, CUmodule *mod, float *wall) {
    CUjit_option options[6];
    void *values[6];
    CUlinkState state;
    void *cubin;
    size_t size;
    options[0] = CU_JIT_WALL_TIME; values[0] = NULL;
    options[1] = CU_JIT_INFO_LOG_BUFFER; values[1] = info_log;
    options[2] = CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES; values[2] = (void *)(uintptr_t)sizeof info_log;
    options[3] = CU_JIT_ERROR_LOG_BUFFER; values[3] = error_log;
    options[4] = CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
    values[4] = (void *)(uintptr_t)sizeof error_log;
    options[5] = CU_JIT_LOG_VERBOSE; values[5] = (void *)1;
    memset(info_log, 0, sizeof info_log);
    EXPECT(cuLinkCreate(6, options, values, &state), CUDA_SUCCESS);
    if (from_file) {
        char path[] = "/tmp/link_ptx_XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0 || write(fd, PTX, strlen(PTX)) != (ssize_t)strlen(PTX)) return 1;
        close(fd);
        EXPECT(cuLinkAddFile(state, CU_JIT_INPUT_PTX, path, 0, NULL, NULL), CUDA_SUCCESS);
        unlink(path);
    } else {
        EXPECT(cuLinkAddData(state, CU_JIT_INPUT_PTX, (void *)PTX, strlen(PTX) + 1, "saxpy.ptx",
                             0, NULL, NULL), CUDA_SUCCESS);
    }
    EXPECT(cuLinkComplete(state, &cubin, &size), CUDA_SUCCESS);
    memcpy(wall, &values[0], sizeof *wall);
    printf("linked: %s, info log %s, its size option %s\n",
           size > 4 && !memcmp(cubin, "\x7f" "ELF", 4) ? "an ELF cubin" : "not a cubin",
           info_log[0] ? "written" : "empty",
           (uintptr_t)values[2] == strlen(info_log) + 1 ? "the bytes filled" : "not updated");
    EXPECT(cuModuleLoadData(mod, cubin), CUDA_SUCCESS);
    EXPECT(cuLinkDestroy(state), CUDA_SUCCESS);
    return 0;
}

static int run_saxpy(CUmodule mod) {
    const unsigned n = 4096;
    static float hx[4096], hy[4096];
    for (unsigned i = 0; i < n; i++) { hx[i] = (float)(i % 3); hy[i] = 1.0f; }
    CUdeviceptr x, y;
    CUfunction f;
    EXPECT(cuMemAlloc(&x, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&y, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(x, hx, n * 4), CUDA_SUCCESS);
    EXPECT(cuMemcpyHtoD(y, hy, n * 4), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&f, mod, "saxpy"), CUDA_SUCCESS);
    float a = 2.0f;
    unsigned count = n;
    void *args[] = { &a, &x, &y, &count };
    EXPECT(cuLaunchKernel(f, n / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(hy, y, n * 4), CUDA_SUCCESS);
    double sum = 0;
    for (unsigned i = 0; i < n; i++) sum += hy[i];
    printf("saxpy from the linked cubin: sum %.0f\n", sum);
    EXPECT(cuMemFree(x), CUDA_SUCCESS);
    EXPECT(cuMemFree(y), CUDA_SUCCESS);
    return 0;
}

static int hostile(void) {
    CUlinkState state;
    void *cubin;
    size_t size;
    CUjit_option opt = CU_JIT_GLOBAL_SYMBOL_NAMES;
    const char *names[] = { "x" };
    void *vals[] = { (void *)names };
    EXPECT(cuLinkCreate(1, &opt, vals, &state), CUDA_SUCCESS);
    EXPECT(cuLinkAddData(state, CU_JIT_INPUT_PTX, (void *)PTX, strlen(PTX) + 1, "a", 0, NULL,
                         NULL), CUDA_SUCCESS);
    EXPECT(cuLinkComplete(state, &cubin, &size), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT(cuLinkDestroy(state), CUDA_SUCCESS);
    EXPECT(cuLinkCreate(0, NULL, NULL, &state), CUDA_SUCCESS);
    EXPECT(cuLinkAddFile(state, CU_JIT_INPUT_PTX, "/nonexistent/host/file.ptx", 0, NULL, NULL),
           CUDA_ERROR_FILE_NOT_FOUND);
    EXPECT(cuLinkComplete(state, &cubin, &size), CUDA_ERROR_INVALID_VALUE); /* no input */
    EXPECT(cuLinkAddData(state, CU_JIT_INPUT_PTX, (void *)PTX, 0, "empty", 0, NULL, NULL),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLinkAddData(state, 77, (void *)PTX, strlen(PTX) + 1, "t", 0, NULL, NULL),
           CUDA_SUCCESS);
    EXPECT(cuLinkComplete(state, &cubin, &size), CUDA_ERROR_INVALID_VALUE); /* no such type */
    EXPECT(cuLinkDestroy(state), CUDA_SUCCESS);
    printf("hostile: host-pointer options, missing files, empty and unknown inputs refused\n");
    return 0;
}

int main(int argc, char **argv) {
    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    if (argc > 1 && !strcmp(argv[1], "hostile")) return hostile();
    CUmodule mod;
    float wall = -1;
    if (link_ptx(0, &mod, &wall)) return 1;
    printf("wall time: %s\n", wall >= 0 ? "given" : "not given");
    if (run_saxpy(mod)) return 1;
    EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);
    if (link_ptx(1, &mod, &wall)) return 1;
    if (run_saxpy(mod)) return 1;
    EXPECT(cuModuleUnload(mod), CUDA_SUCCESS);

    CUjit_option options[2] = { CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES };
    void *values[2] = { error_log, (void *)(uintptr_t)sizeof error_log };
    CUlinkState state;
    void *cubin;
    size_t size;
    memset(error_log, 0, sizeof error_log);
    static const char BAD[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                              ".visible .entry broken() { not an instruction; }\n";
    EXPECT(cuLinkCreate(2, options, values, &state), CUDA_SUCCESS);
    CUresult r = cuLinkAddData(state, CU_JIT_INPUT_PTX, (void *)BAD, sizeof BAD, "bad", 0,
                               NULL, NULL);
    if (!r) r = cuLinkComplete(state, &cubin, &size); /* the shim says it here */
    printf("bad PTX: %d, error log %s\n", r, error_log[0] ? "written" : "empty");
    EXPECT(cuLinkDestroy(state), CUDA_SUCCESS);
    printf("link_ptx: ok\n");
    return 0;
}
