"""The guest Python API end to end through an agent with the GPU test double."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from hvgpu.errors import CompileError, ConnectionLost, CudaError
from hvgpu.guest import (Connection, Device, LaunchConfig, ObjectCode, Program, ProgramOptions,
                         launch)
from hvgpu.virtio import protocol as P

SAXPY = 'extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {}'
MATMUL = 'extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {}'


@pytest.fixture
def conn(fake_agent):
    c = Connection(fake_agent.address)
    yield c
    c.close()


def test_device_properties(conn):
    dev = Device(connection=conn)
    assert dev.name == "hvgpu fake GPU"
    assert dev.compute_capability == (9, 0)
    assert dev.multiprocessor_count == 4
    assert dev.uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    free, total = dev.mem_info()
    assert free == total == dev.total_memory


def test_memory_accounting_follows_allocations(conn):
    dev = Device(connection=conn)
    free0, _ = dev.mem_info()
    buf = dev.allocate(1 << 20)
    assert dev.mem_info()[0] == free0 - (1 << 20)
    buf.close()
    assert dev.mem_info()[0] == free0


def test_dropped_buffers_are_freed_before_the_next_call(conn):
    dev = Device(connection=conn)
    free0, _ = dev.mem_info()
    dev.allocate(1 << 20)
    gc.collect()
    assert dev.mem_info()[0] == free0


def test_saxpy_and_matmul_match_numpy(conn):
    dev = Device(connection=conn)
    saxpy = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    assert saxpy.num_arguments == 4
    x = np.random.default_rng(1).standard_normal(10_000, dtype=np.float32)
    dx, dy = dev.allocate(x.nbytes), dev.allocate(x.nbytes)
    dx.copy_from(x)
    dy.fill(0)
    launch(saxpy, LaunchConfig(grid=40, block=256), 0.5, dx, dy, x.size)
    np.testing.assert_allclose(np.frombuffer(dy.copy_to(), dtype=np.float32), 0.5 * x, rtol=1e-6)

    matmul = Program(MATMUL, connection=conn).compile().get_kernel("matmul")
    a = np.random.default_rng(2).standard_normal((64, 64), dtype=np.float32)
    da, dc = dev.allocate(a.nbytes), dev.allocate(a.nbytes)
    da.copy_from(a)
    launch(matmul, LaunchConfig(grid=(4, 4), block=(16, 16)), da, da, dc, 64)
    c = np.empty_like(a)
    dc.copy_to(c)
    np.testing.assert_allclose(c, a @ a, rtol=1e-4, atol=1e-4)


def test_arguments_are_checked_against_the_hosts_layout(conn):
    dev = Device(connection=conn)
    saxpy = Program(SAXPY, connection=conn).compile().get_kernel("saxpy")
    buf = dev.allocate(16)
    with pytest.raises(TypeError, match="takes 4 arguments, 3 given"):
        launch(saxpy, LaunchConfig(), 1.0, buf, buf)
    with pytest.raises(TypeError, match="8 bytes given, the parameter takes 4"):
        launch(saxpy, LaunchConfig(), np.float64(1.0), buf, buf, 4)
    with pytest.raises(TypeError, match="does not fit"):
        launch(saxpy, LaunchConfig(), 1.0, buf, buf, 2 ** 40)
    with pytest.raises(TypeError, match="cannot pass str"):
        launch(saxpy, LaunchConfig(), 1.0, "x", buf, 4)


def test_streams_and_events(conn):
    dev = Device(connection=conn)
    stream = dev.create_stream()
    buf = dev.allocate(1 << 16)
    start = stream.record()
    buf.copy_from(bytes(range(256)) * 256, stream=stream)
    end = stream.record()
    other = dev.create_stream()
    other.wait(end)
    other.sync()
    assert stream.is_done and end.is_done
    assert end - start >= 0
    assert bytes(buf.copy_to(stream=other)) == bytes(range(256)) * 256
    stream.close()
    with pytest.raises(CudaError, match="unknown stream"):
        stream.conn.call("STREAM_SYNCHRONIZE", stream.handle)


def test_compile_errors_carry_the_log_and_options_travel(conn):
    with pytest.raises(CompileError) as info:
        Program("#error nope", connection=conn).compile()
    assert "fake compile failure" in info.value.log
    prog = Program(SAXPY, options=ProgramOptions(std="c++17", define_macro={"N": 4}),
                   connection=conn)
    assert prog.options == ["--std=c++17", "-DN=4"]
    prog.compile()
    assert prog.log == "fake-nvrtc: compiled"


def test_compiled_modules_are_cached_on_the_host(conn, fake_agent):
    Program(SAXPY, connection=conn).compile()
    cached = list((fake_agent.socket.parent / "cache").rglob("*.cubin"))
    assert len(cached) == 1
    Program(SAXPY, connection=conn).compile()
    assert list((fake_agent.socket.parent / "cache").rglob("*.cubin")) == cached


def test_ptx_loads_and_unloading_drops_its_kernels(conn):
    ptx = ".version 8.0\n.target sm_90\n.visible .entry noop()\n{\n ret;\n}\n"
    module = ObjectCode.from_ptx(ptx, connection=conn)
    kernel = module.get_kernel("noop")
    launch(kernel, LaunchConfig())
    conn.call("CTX_SYNCHRONIZE")
    module.close()
    with pytest.raises(CudaError, match="unknown function"):
        conn.call("FUNC_GET_PARAM_INFO", kernel.function)
    with pytest.raises(CudaError) as info:
        ObjectCode.from_cubin(b"\x7fELF-not-really", connection=conn)
    assert info.value.status == 200


def test_missing_kernel_name(conn):
    module = Program(SAXPY, connection=conn).compile()
    with pytest.raises(CudaError) as info:
        module.get_kernel("nope")
    assert info.value.status == 500


def test_buffer_bounds_are_checked_in_the_guest_too(conn):
    buf = Device(connection=conn).allocate(16)
    with pytest.raises(CudaError, match="do not fit"):
        buf.copy_from(b"x" * 17)
    with pytest.raises(CudaError, match="do not fit"):
        buf.copy_to(bytearray(32))


def test_the_documented_example_runs_as_written(fake_agent, monkeypatch):
    import pathlib
    import re

    import hvgpu.guest.runtime as runtime

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guest-api.md").read_text()
    example = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.setenv("HVGPU_AGENT", fake_agent.address)
    monkeypatch.setattr(runtime, "_defaults", {})
    exec(compile(example, "docs/guest-api.md", "exec"), {})


def test_ops_the_driver_shim_needs(conn):
    values = conn.call("DEVICE_GET_ATTRIBUTES", 0, 80)[0]
    attrs = np.frombuffer(values, dtype="<i4")
    assert len(attrs) == 80 and attrs[15] == 4 and attrs[74] == 9  # SMs; cc major
    with pytest.raises(CudaError) as info:
        conn.call("DEVICE_GET_ATTRIBUTES", 1, 10)
    assert info.value.status == 101
    module = ObjectCode.from_ptx(".visible .entry saxpy(\n", connection=conn)
    kernel = module.get_kernel("saxpy")
    assert conn.call("FUNC_GET_ATTRIBUTE", kernel.function, 0) == (1024,)
    conn.call("FUNC_SET_ATTRIBUTE", kernel.function, 8, 40000)  # answered when sent as a call
    known, values = conn.call("FUNC_GET_ATTRIBUTES", kernel.function, 20)
    attrs = np.frombuffer(values, dtype="<i4")
    assert known == 0xFFFF and attrs[0] == 1024 and attrs[8] == 40000 and not attrs[16:].any()
    conn.call("FUNC_SET_CACHE_CONFIG", kernel.function, 1)
    with pytest.raises(CudaError) as info:
        conn.call("FUNC_SET_CACHE_CONFIG", kernel.function, 9)
    assert info.value.status == 1
    with pytest.raises(CudaError) as info:
        conn.call("FUNC_GET_ATTRIBUTES", kernel.function, 33)  # more than the mask holds
    assert info.value.status == 1
    assert conn.call("OCCUPANCY_MAX_BLOCKS", kernel.function, 256, 0, 0)[0] >= 1
    with pytest.raises(CudaError) as info:
        conn.call("MODULE_GET_GLOBAL", module.module, "missing")
    assert info.value.status == 500
    least, greatest = conn.call("STREAM_PRIORITY_RANGE")
    stream = conn.call("STREAM_CREATE_PRIORITY", 1, greatest)[0]
    conn.call("STREAM_SYNCHRONIZE", stream)
    conn.call("STREAM_DESTROY", stream)


def test_launch_attributes_and_tensor_maps_are_checked_before_the_driver(conn):
    module = ObjectCode.from_ptx(".visible .entry noop(\n", connection=conn)
    fn = module.get_kernel("noop").function
    attr = (4).to_bytes(4, "little") + bytes(68)  # a cluster-dimension attribute, 72 bytes
    conn.post("LAUNCH_KERNEL_EX", fn, 1, 1, 1, 32, 1, 1, 0, 0, b"", attr)
    conn.call("CTX_SYNCHRONIZE")  # accepted and run
    conn.post("LAUNCH_KERNEL_EX", fn, 1, 1, 1, 32, 1, 1, 0, 0, b"", attr[:50])
    with pytest.raises(CudaError, match="not a whole number") as info:
        conn.call("CTX_SYNCHRONIZE")
    assert info.value.status == 1
    event_attr = (12).to_bytes(4, "little") + bytes(68)  # names an event: the executor's
    conn.post("LAUNCH_KERNEL_EX", fn, 1, 1, 1, 32, 1, 1, 0, 0, b"", event_attr)
    with pytest.raises(CudaError) as info:
        conn.call("CTX_SYNCHRONIZE")
    assert info.value.status == 801
    with pytest.raises(CudaError, match="do not match rank 2"):
        conn.call("TENSOR_MAP_ENCODE_TILED", 7, 2, 0x1000, bytes(16), bytes(16), bytes(8),
                  bytes(8), 0, 0, 0, 0)
    tmap = conn.call("TENSOR_MAP_ENCODE_TILED", 7, 2, 0x1000, bytes(16), bytes(8), bytes(8),
                     bytes(8), 0, 0, 0, 0)[0]
    assert len(tmap) == 128
    assert conn.call("OCCUPANCY_CLUSTERS", 0, fn, 1, 1, 1, 32, 1, 1, 0, attr) == (16,)


def test_an_agent_that_goes_away_is_the_cuda_error_the_shim_returns(fake_agent):
    """What a CUDA program under the shim gets then (test_shim.py): DEVICE_UNAVAILABLE,
    on the call that finds the loss and on every later one."""
    conn = Connection(fake_agent.address)
    dev = Device(connection=conn)
    buf = dev.allocate(1 << 12)
    fake_agent.stop()
    for _ in range(2):
        with pytest.raises(CudaError) as info:
            buf.copy_from(np.zeros(1 << 10, dtype=np.float32))
            dev.sync()
        assert info.value.status == P.CUDA_ERROR_DEVICE_UNAVAILABLE == 46
        assert info.value.name == "CUDA_ERROR_DEVICE_UNAVAILABLE"
        assert "lost the connection to the hvgpu agent" in str(info.value)
        assert isinstance(info.value, ConnectionLost)  # what it was before, still caught so
    assert conn.closed
