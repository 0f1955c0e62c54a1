"""The include check against NVRTC itself: whatever NVRTC would act on, the check refuses.

Before: the check joined lines at a backslash followed by spaces or tabs, which
NVRTC does not, so `// x \\<space><newline>#include "/abs"` passed it, and so did
other sources NVRTC reads otherwise than it did. Here the real libnvrtc (CI
installs nvidia-cuda-nvrtc; no GPU needed) compiles each source, in this
process and unconfined, with an include of a path that does not exist: where
its log says it tried to open that path, the check must have refused the
source. Sources are the known tricks and hypothesis's mixtures of the pieces
the preprocessor reads specially, under each -std a guest may choose.
"""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from hvgpu.errors import CudaError
from hvgpu.host.executor import compiler, nvrtc_policy

pytestmark = pytest.mark.skipif(compiler.find_nvrtc() is None, reason="no libnvrtc here")

PROBE = "/hvgpu-probe-no-such-dir/p.h"
STANDARDS = ["c++03", "c++11", "c++14", "c++17", "c++20"]


@pytest.fixture(scope="module")
def nvrtc():
    path = compiler.find_nvrtc()
    lib = compiler._load(path)
    compiler._builtins_next_to(path)
    return lib


def nvrtc_opens_the_probe(lib, source: bytes, std: str) -> bool:
    """Whether NVRTC, compiling ``source`` with -std=``std``, tried to open PROBE."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"p.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90", f"--std={std}".encode()]
    try:
        lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value or 1)
        lib.nvrtcGetProgramLog(prog, buf)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return f'cannot open source file "{PROBE}'.encode() in buf.value


def policy_refuses(source: bytes) -> bool:
    try:
        nvrtc_policy.check_includes(source, {}, "p.cu")
    except CudaError:
        return True
    return False


PROBES = [f'#include "{PROBE}"', f"# include <{PROBE}>", f'%:include "{PROBE}"',
          f'??=include "{PROBE}"', f'#inc\\\nlude "{PROBE}"', f'#\\\r\ninclude "{PROBE}"',
          f'#if __has_include("{PROBE}")\n#endif', f'#include_next "{PROBE}"']
TRICKS = [
    f'// x \\ \n{PROBES[0]}\n',  # the report's: a space between backslash and newline
    f'// x \\\t\n{PROBES[0]}\n',
    f'// x \\\f\n{PROBES[0]}\n',
    f'// x \\ \r\n{PROBES[0]}\n',
    f'\r{PROBES[0]}\n',
    f'// x ??/\n{PROBES[0]}\n',
    f'int a = 1\'2 + sizeof("\'/*");\n{PROBES[0]}\n// */\n',
    f'/*\n*/ {PROBES[0]}\n',
    f'int x; /*\n*/ {PROBES[0]}\n',
    f'#include /*\n*/ "{PROBE}"\n',
    f'auto s = R"a$(\n/*\n)a$";\n{PROBES[0]}\n// */\n',
    f'auto s = R"(")/*)";\n{PROBES[0]}\n// */\n',
    f'auto s = u8R"x(")x";\n{PROBES[0]}\n',
    f'const char c = \'"\';\n{PROBES[0]}\n',
]


@pytest.mark.parametrize("std", STANDARDS)
@pytest.mark.parametrize("source", TRICKS + [p + "\n" for p in PROBES])
def test_an_include_nvrtc_acts_on_is_refused(nvrtc, source, std):
    data = source.encode()
    if nvrtc_opens_the_probe(nvrtc, data, std):
        assert policy_refuses(data), (source, std)


# Pieces the preprocessor reads specially, to be mixed around a probe.
PIECES = ["//", "/*", "*/", "\\", "\\\n", "\\ \n", "\\\t\n", "\\\r\n", "\r", "\n", " ", "\t",
          "\f", "\v", "??/", "??=", "??'", "'", '"', "\\'", '\\"', 'R"(', ')"', 'R"x(', ')x"',
          "u8", "L", "1'2", "0x1'f", "1e+", ".5", "#", "%:", "x", "(", ")", "<", ">",
          "#define P ", "#if 0\n", "#endif\n", "include", "/"]


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(st.sampled_from(PIECES), max_size=8),
       sep=st.sampled_from(["\n", "", " ", "\r"]), probe=st.sampled_from(PROBES),
       after=st.lists(st.sampled_from(PIECES), max_size=8), std=st.sampled_from(STANDARDS))
@example(before=["// x ", "\\ \n"], sep="", probe=PROBES[0], after=[], std="c++17")
def test_no_mixture_hides_from_the_check_an_include_nvrtc_acts_on(nvrtc, before, sep, probe,
                                                                    after, std):
    source = ("".join(before) + sep + probe + "\n" + "".join(after)).encode()
    if nvrtc_opens_the_probe(nvrtc, source, std):
        assert policy_refuses(source), (source, std)
