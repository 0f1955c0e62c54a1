"""A hostile guest's CUDA C++ and NVRTC options cannot reach host files.

Through a real agent (GPU test double): options that name files or paths,
includes of host paths, program and header names with directories are refused
with CUDA_ERROR_INVALID_VALUE naming what was refused, and nothing is created
on the host. With real NVRTC installed (CI installs nvidia-cuda-nvrtc), the
confined compiler child is tried directly, past the policy, as a compromised
check would let a source through: it still cannot read or write a host file.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from hvgpu.errors import CompileError, CudaError
from hvgpu.guest import Connection, Device, LaunchConfig, Program, launch
from hvgpu.host.executor import compiler
from hvgpu.host.executor.compile_cache import CompileCache

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
HAVE_NVRTC = compiler.find_nvrtc() is not None
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="no libnvrtc on this machine")


@pytest.fixture
def conn(fake_agent):
    with Connection(fake_agent.address) as c:
        yield c


def _refused(conn, source=SAXPY, options=(), name="p.cu", headers=None):
    with pytest.raises(CudaError) as info:
        Program(source, options=list(options), name=name, headers=headers,
                connection=conn).compile()
    assert info.value.status == 1, info.value
    return str(info.value)


@pytest.mark.parametrize("option", [
    "--time={f}", "-time={f}", "--create-pch={f}", "--use-pch={f}", "--pch-dir={d}",
    "--fdevice-time-trace={f}", "-I{d}", "--include-path={d}", "--pre-include=/etc/passwd",
    "-include=/etc/passwd", "--split-compile=0", "{f}", "--unknown-option",
    "--gpu-architecture=sm_90 --time={f}", "-DX=1 --time={f}",
])
def test_options_that_name_files_are_refused(conn, tmp_path, option):
    where = tmp_path / "host"
    where.mkdir()
    target = where / f"written-{uuid.uuid4().hex}"
    opt = option.format(f=target, d=where)
    message = _refused(conn, options=[opt])
    assert repr(opt) in message or opt in message
    assert os.listdir(where) == [], "the compile created a host file"


def test_allowed_options_compile(conn):
    module = Program(SAXPY, options=["--std=c++17", "-arch=sm_90", "-DN=4", "-UM",
                                     "--use_fast_math", "-lineinfo", "--ftz=true",
                                     "-default-device", "-Xptxas=-v"],
                     connection=conn).compile()
    assert module.get_kernel("saxpy")


@pytest.mark.parametrize("source", [
    '#include "/etc/shadow"\n',
    '#include </etc/passwd>\n',
    '#include "../../../../../../../etc/passwd"\n',
    '  %:  include "/etc/hostname"\n',
    '#/* hidden */include "/etc/hostname"\n',
    '#inc\\\nlude "/etc/hostname"\n',
    '#define P "/etc/hostname"\n#include P\n',
    '#if __has_include("/etc/shadow")\n#endif\n',
    'const char* s = R"(")/*)";\n#include "/etc/hostname"\n// */\n',
    'auto s = R"(";\n#include "/etc/hostname"\n// )";\n',
    '#embed "/etc/hostname"\n',
    # NVRTC joins lines at a backslash and a newline only: not across a space or a tab
    '// x \\ \n#include "/etc/hostname"\n',
    '// x \\\t\n#include "/etc/hostname"\n',
    '\r#include "/etc/hostname"\n',  # a carriage return is a space to NVRTC, not a line end
    '// x ??/\n#include "/etc/hostname"\n',  # no trigraphs under -std=c++17, the default
    'int a = 1\'2 + sizeof("\'/*");\n#include "/etc/hostname"\n// */\n',  # a digit separator
    '/*\n*/ #include "/etc/hostname"\n',  # a comment holding a newline starts a line
    '#include /*\n*/ "/etc/hostname"\n',  # ... and may hold the line's operand
])
def test_includes_of_host_paths_are_refused(conn, source):
    message = _refused(conn, source=source + SAXPY)
    assert "refused" in message


def test_existing_and_missing_host_paths_give_the_same_answer(conn):
    """No oracle: the guest cannot learn which host paths exist."""
    a = _refused(conn, source='#include "/etc/passwd"\n').replace("/etc/passwd", "X")
    b = _refused(conn, source='#include "/etc/no-such-file-x"\n').replace("/etc/no-such-file-x", "X")
    assert a == b


@pytest.mark.parametrize("name", ["/etc/passwd", "../x.cu", "a/b.cu", "x\n.cu", ".hidden/x"])
def test_program_names_with_directories_are_refused(conn, name):
    _refused(conn, name=name)


@pytest.mark.parametrize("header", ["/etc/passwd", "../up.h", "a/../../b.h", "a\\b.h", ""])
def test_header_names_that_leave_the_program_are_refused(conn, header):
    if header == "":
        with pytest.raises(CudaError):  # an empty name is dropped: sizes no longer match
            Program(SAXPY, headers={header: "x"}, connection=conn).compile()
        return
    _refused(conn, headers={header: "int x;"})


def test_headers_sent_with_the_source_are_included(conn, fake_agent):
    src = '#include "defs/k.h"\n#include <cuda_fp16.h>\n' + SAXPY
    module = Program(src, headers={"defs/k.h": "#define K 2\n"}, connection=conn).compile()
    assert module.get_kernel("saxpy")
    # and the session goes on serving this guest
    dev = Device(connection=conn)
    buf = dev.allocate(16)
    buf.copy_from(np.arange(4, dtype=np.float32))


def test_lying_header_sizes_are_refused(conn):
    with pytest.raises(CudaError) as info:
        conn.call("MODULE_COMPILE_HEADERS", "p.cu", "", "a.h", (5).to_bytes(8, "little"),
                  payload=b"int x;")
    assert info.value.status == 1
    with pytest.raises(CudaError):
        conn.call("MODULE_COMPILE_HEADERS", "p.cu", "", "a.h",
                  (1 << 40).to_bytes(8, "little") + (1).to_bytes(8, "little"), payload=b"xy")
    Program(SAXPY, connection=conn).compile()  # still served


def test_an_oversize_source_with_headers_is_refused_before_it_is_held(conn):
    from hvgpu.host.executor.nvrtc_policy import MAX_SOURCE

    n = MAX_SOURCE + 1
    with pytest.raises(CudaError, match=f"limit of {MAX_SOURCE >> 20} MiB") as info:
        conn.call("MODULE_COMPILE_HEADERS", "p.cu", "", "a.h",
                  (n - 1).to_bytes(8, "little") + (1).to_bytes(8, "little"), payload=b" " * n)
    assert info.value.status == 1
    Program(SAXPY, connection=conn).compile()  # still served


def test_the_compile_cache_is_bounded_least_recently_used_first(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=10_000, max_entries=3)
    for i in range(5):
        cache.get_or_build(f"k{i}", lambda i=i: (bytes([i]) * 100, ""))
    cache.get_or_build("k2", lambda: pytest.fail("k2 should be a hit"))  # k2 used again
    cache.get_or_build("k5", lambda: (b"5" * 100, ""))
    left = sorted(p.stem for p in tmp_path.glob("*.cubin"))
    assert len(left) == 3 and "k2" in left and "k5" in left
    cache.get_or_build("big", lambda: (b"x" * 9_950, ""))
    assert sum(p.stat().st_size for p in tmp_path.glob("*.cubin")) <= 10_000


def test_headers_are_part_of_the_cache_key():
    a = CompileCache.key("c", "p.cu", [], b"src", {"k.h": b"1"})
    b = CompileCache.key("c", "p.cu", [], b"src", {"k.h": b"2"})
    assert a != b and a != CompileCache.key("c", "p.cu", [], b"src")


# -- the confined child, with real NVRTC, past the policy -----------------------------

@needs_nvrtc
def test_real_nvrtc_compiles_with_toolkit_and_guest_headers():
    src = b'#include <cuda_fp16.h>\n#include "k.h"\n' \
          b'extern "C" __global__ void scale(__half* x) { x[threadIdx.x] = __float2half(K); }\n'
    image, _ = compiler.compile_confined(src, "p.cu", [], {"k.h": b"#define K 2.0f\n"}, "sm_90")
    assert image[:4] == b"\x7fELF"


@needs_nvrtc
@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/passwd", "/proc/self/environ"])
def test_confined_nvrtc_cannot_quote_host_files(path):
    with pytest.raises(CompileError) as info:
        compiler.compile_confined(f'#include "{path}"\n'.encode(), "p.cu", [], {}, "sm_90")
    try:
        with open(path, "rb") as f:
            first = f.read().split(b"\n")[0].split(b"\0")[0].decode(errors="replace").strip()
    except OSError:
        first = ""
    if first:
        assert first not in info.value.log


@needs_nvrtc
def test_confined_nvrtc_says_the_same_of_existing_and_missing_host_files():
    """Past the policy, NVRTC's words must not tell a guest which host paths exist
    (Landlock refuses an existing file: 'Permission denied'; a missing one: nothing)."""
    from hvgpu.host import landlock

    if landlock.abi_version() == 0:
        pytest.skip("no Landlock here: NVRTC's child is not confined")
    said = []
    for path in ("/etc/passwd", "/etc/passwX"):  # one exists, one not; the same length
        assert os.path.exists(path) == (path == "/etc/passwd")
        with pytest.raises(CompileError) as info:
            compiler.compile_confined(f'#include "{path}"\n'.encode(), "p.cu", [], {},
                                      "sm_90")
        said.append(info.value.log.replace(path, "PATH"))
    assert said[0] == said[1]


@needs_nvrtc
def test_confined_nvrtc_cannot_write_host_files(tmp_path):
    targets = {opt: tmp_path / f"f{i}" for i, opt in enumerate(
        ("--time", "--create-pch", "--fdevice-time-trace"))}
    for opt, target in targets.items():
        try:
            compiler.compile_confined(b'extern "C" __global__ void k() {}\n', "p.cu",
                                      [f"{opt}={target}"], {}, "sm_90")
        except CompileError:
            pass
        assert not target.exists(), f"{opt} wrote {target}"


@needs_nvrtc
def test_a_compile_that_spins_is_stopped_at_its_cpu_limit():
    # 2**40 distinct instantiations: far beyond a one-second budget.
    src = b"""
template <int N, long M> struct T { static constexpr long v = T<N - 1, 2 * M>::v + T<N - 1, 2 * M + 1>::v; };
template <long M> struct T<0, M> { static constexpr long v = M; };
__device__ long x = T<40, 1>::v;
"""
    with pytest.raises(CompileError) as info:
        compiler.compile_confined(src, "p.cu", [], {}, "sm_90", cpu_seconds=1)
    assert "limit" in str(info.value)


@needs_nvrtc
def test_agent_compiles_with_real_nvrtc(tmp_path):
    from tests.conftest import FAKE_DEVICE, RunningAgent

    running = RunningAgent(tmp_path, FAKE_DEVICE)
    running.agent.config.env["HVGPU_FAKE_NVRTC"] = "real"
    try:
        with Connection(running.address) as c:
            dev = Device(connection=c)
            src = '#include <cuda_fp16.h>\n#include "k.h"\n' + SAXPY.replace("{}", "{ (void)K; }")
            kernel = Program(src, headers={"k.h": "#define K 1\n"}, connection=c).compile() \
                .get_kernel("saxpy")
            x = np.arange(8, dtype=np.float32)
            dx, dy = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
            dx.copy_from(x)
            dy.copy_from(np.ones_like(x))
            launch(kernel, LaunchConfig(grid=1, block=8), np.float32(3), dx, dy, 8)
            out = np.empty_like(x)
            dy.copy_to(out)
            assert np.array_equal(out, 3 * x + 1)
            with pytest.raises(CompileError) as info:
                Program("int broken(", connection=c).compile()
            assert "error" in info.value.log
    finally:
        running.stop()


def test_each_vm_compiles_into_a_cache_of_its_own(tmp_path):
    from hvgpu.host.control_grpc import ControlClient
    from tests.conftest import FAKE_DEVICE, RunningAgent

    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    try:
        control = ControlClient(running.control)
        for vm in ("vm1", "vm2"):
            control.call("attach", vm=vm, mem="64M")
            with Connection(running.vm_address(vm)) as c:
                Program(SAXPY, connection=c).compile()
        control.close()
        cache = tmp_path / "cache"
        mine = {vm: sorted(p.name for p in (cache / "vms" / vm).glob("*.cubin"))
                for vm in ("vm1", "vm2")}
        # the same source compiled by both: one entry in each VM's cache, none shared
        assert len(mine["vm1"]) == 1 and mine["vm1"] == mine["vm2"]
        assert not list(cache.glob("*.cubin"))
    finally:
        running.stop()
