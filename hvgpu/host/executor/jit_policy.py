"""What a guest may ask of the JIT linker (LINK): which options, which inputs, how much.

A guest's link arrives whole (the shim keeps cuLinkCreate's state and sends it at
cuLinkComplete). Its options are judged here before the linker sees them: only
scalar options whose value is a number (CUjit_option's optimisation, target, debug,
precision and cache-mode options); the output options (log buffers and their sizes,
the wall time) are the guest's own memory, written by the shim from the reply, and
never sent; the options whose values are host pointers (global symbol names and
addresses, referenced kernel and variable names) are refused. No file path reaches
the host: cuLinkAddFile is read in the guest and sent as bytes.

Must not call the driver or link anything (the device does, the op asks it to).
"""

from __future__ import annotations

import struct

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

_OPTION = struct.Struct("<IIQ")
_INPUT = struct.Struct("<IIQ")
assert _OPTION.size == P.LINK_OPTION_SIZE and _INPUT.size == P.LINK_INPUT_SIZE

# CUjit_option numbers (cuda.h 13.0) whose value is a number, with the largest value
# the linker is given (a bounded u32 each: none is a size the host would allocate).
SCALAR = {0: 0xFFFF,  # MAX_REGISTERS
          1: 0xFFFF,  # THREADS_PER_BLOCK (in: a count)
          7: 4,  # OPTIMIZATION_LEVEL
          8: 0,  # TARGET_FROM_CUCONTEXT (its value is ignored)
          9: 0xFFFF,  # TARGET (CUjit_target)
          10: 1,  # FALLBACK_STRATEGY
          11: 1, 12: 1, 13: 1,  # GENERATE_DEBUG_INFO, LOG_VERBOSE, GENERATE_LINE_INFO
          14: 2,  # CACHE_MODE (the L1 load cache: -dlcm, not a file cache)
          16: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1,  # FAST_COMPILE, LTO, FTZ, PREC_*, FMA
          29: 1, 30: 1,  # OPTIMIZE_UNUSED_DEVICE_VARIABLES, POSITION_INDEPENDENT_CODE
          31: 0xFFFF, 32: 0xFFFF, 33: 1, 34: 0xFFFF}  # MIN_CTA, MAX_THREADS, OVERRIDE, SPLIT
OUTPUTS = {2, 3, 4, 5, 6}  # WALL_TIME and the log buffers: the guest's, kept in the guest
POINTERS = {17, 18, 19, 25, 26, 27, 28}  # symbol and referenced-name tables: host pointers
INPUT_TYPES = (0, 1, 2, 3, 4, 5)  # CUjitInputType: cubin, PTX, fatbin, object, library, NVVM


def check_options(raw) -> list[tuple[int, int]]:
    """(option, value) pairs the linker may be given."""
    if len(raw) % _OPTION.size or len(raw) > P.MAX_LINK_OPTIONS * _OPTION.size:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{len(raw)} bytes is not 0 to "
                        f"{P.MAX_LINK_OPTIONS} link options")
    options = []
    for option, _, value in _OPTION.iter_unpack(raw):
        if option in POINTERS:
            raise CudaError(P.CUDA_ERROR_NOT_SUPPORTED, f"JIT option {option} takes host "
                            "pointers (symbol or name tables): not served")
        if option in OUTPUTS:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"JIT option {option} is an output "
                            "of the guest's own: the shim keeps it")
        if option not in SCALAR:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"no JIT option {option}")
        if value > SCALAR[option]:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"JIT option {option}: {value} is past {SCALAR[option]}")
        options.append((option, value))
    return options


def check_inputs(raw, names: str, payload_len: int) -> list[tuple[int, str, int]]:
    """(type, name, size) of each input, whose sizes add up to the payload."""
    if not raw or len(raw) % _INPUT.size or len(raw) > P.MAX_LINK_INPUTS * _INPUT.size:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"{len(raw)} bytes is not 1 to "
                        f"{P.MAX_LINK_INPUTS} link inputs")
    found = names.split("\0")
    inputs = list(_INPUT.iter_unpack(raw))
    if len(found) != len(inputs):
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                        f"{len(found)} names for {len(inputs)} link inputs")
    total, out = 0, []
    for (kind, _, size), name in zip(inputs, found):
        if kind not in INPUT_TYPES:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"no JIT input type {kind}")
        if not size:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE, "an empty link input")
        total += size
        out.append((kind, name[:256], size))
    if total != payload_len or total > P.MAX_LINK_BYTES:
        raise CudaError(P.CUDA_ERROR_INVALID_VALUE, f"link inputs of {total} bytes, the "
                        f"payload {payload_len} (at most {P.MAX_LINK_BYTES})")
    return out
