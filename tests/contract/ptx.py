"""Kernels both backends run, as PTX text: the driver compiles it for whatever GPU
it has (so no NVRTC is needed), and the double finds the kernels it emulates
(tests/fake_gpu.KERNELS) by their entry names and module variables by their
``.global`` declarations.

The parameters are laid out as the double's emulations unpack them.
"""

from __future__ import annotations

import struct

_HEADER = ".version 7.0\n.target sm_52\n.address_size 64\n\n"

NOOP = """
.visible .entry noop()
{
    ret;
}
"""

# y[i] = a * x[i] + y[i] for i < n
SAXPY = """
.visible .entry saxpy(
    .param .f32 saxpy_a,
    .param .u64 saxpy_x,
    .param .u64 saxpy_y,
    .param .u32 saxpy_n
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<5>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<8>;

    ld.param.f32 %f1, [saxpy_a];
    ld.param.u64 %rd1, [saxpy_x];
    ld.param.u64 %rd2, [saxpy_y];
    ld.param.u32 %r1, [saxpy_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f2, [%rd6];
    ld.global.f32 %f3, [%rd7];
    fma.rn.f32 %f4, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f4;
DONE:
    ret;
}
"""

# Spins for ms milliseconds of the GPU's global timer.
SLEEP_MS = """
.visible .entry sleep_ms(
    .param .u32 sleep_ms_ms
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<5>;

    ld.param.u32 %r1, [sleep_ms_ms];
    mul.wide.u32 %rd1, %r1, 1000000;
    mov.u64 %rd2, %globaltimer;
SPIN:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN;
    ret;
}
"""

# Stores to an address no allocation holds: CUDA_ERROR_ILLEGAL_ADDRESS.
FAULT = """
.visible .entry fault()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;

    mov.u64 %rd1, 16;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def module(*kernels: str, arrays: dict[str, int] | None = None) -> bytes:
    """A PTX module of ``kernels`` with a byte array of each size in ``arrays``
    (a ``__device__ char name[size]``: device memory the load itself takes)."""
    variables = "".join(f".visible .global .align 8 .b8 {name}[{size}];\n"
                        for name, size in (arrays or {}).items())
    return (_HEADER + variables + "".join(kernels)).encode()


def saxpy_params(a: float, x: int, y: int, n: int) -> bytes:
    return struct.pack("<f4xQQI", a, x, y, n)


def sleep_params(ms: int) -> bytes:
    return struct.pack("<I", ms)
