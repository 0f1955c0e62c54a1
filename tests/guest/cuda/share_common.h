/* What the programs that share memory between processes (ipc_fork.c, vmm_share.c,
 * pool_share.c) have in common: the saxpy kernel they run on what they share, a CHECK
 * that names the failing call and exits, and the primary context made current (after
 * the fork, in each process). */
#ifndef SHARE_COMMON_H
#define SHARE_COMMON_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

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

static const unsigned ONE_F = 0x3f800000u; /* 1.0f */

static void context(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}
#endif
