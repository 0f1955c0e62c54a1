"""Programs, kernels and launches of the guest Python API.

CUDA C++ source is compiled on the host with NVRTC (for the host's GPU, cached
by content hash); it may include the CUDA toolkit's headers and the headers
sent with it, nothing else of the host. PTX, cubin and fatbin images are
loaded as they are. A
kernel's parameter layout comes from the host (``cuFuncGetParamInfo``), is
fetched once per kernel, and packs ``launch``'s Python arguments. The guest
never parses ELF or PTX.

A failed compilation raises ``CompileError`` (a ``CudaError``) with NVRTC's
log; arguments that do not fit a kernel's parameters raise ``TypeError`` before
anything is sent; a launch's own error surfaces as ``CudaError`` (``deferred``)
at the next synchronising call; a lost agent raises ``AgentLost`` (a
``CudaError`` with CUDA_ERROR_DEVICE_UNAVAILABLE, see ``hvgpu.guest``).

Must not import ``hvgpu.host``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from hvgpu.guest.client import Connection
from hvgpu.guest.device import Buffer, Stream
from hvgpu.guest.runtime import default_connection


@dataclass
class ProgramOptions:
    """NVRTC options; ``extra`` takes any other NVRTC flag verbatim."""

    std: str | None = None  # "c++17"
    arch: str | None = None  # default: the host GPU's sm_XY
    use_fast_math: bool = False
    define_macro: dict = field(default_factory=dict)
    extra: tuple = ()

    def as_list(self) -> list[str]:
        opts = []
        if self.std:
            opts.append(f"--std={self.std}")
        if self.arch:
            opts.append(f"--gpu-architecture={self.arch}")
        if self.use_fast_math:
            opts.append("--use_fast_math")
        for name, value in self.define_macro.items():
            opts.append(f"-D{name}" if value is None else f"-D{name}={value}")
        opts.extend(self.extra)
        return opts


class Program:
    """CUDA C++ (``code_type="c++"``) or PTX (``"ptx"``) to be loaded on the host."""

    def __init__(self, code: str | bytes, code_type: str = "c++",
                 options: ProgramOptions | list | None = None, *,
                 name: str = "hvgpu_program.cu", connection: Connection | None = None,
                 headers: dict | None = None):
        if code_type not in ("c++", "ptx"):
            raise ValueError(f"code_type must be 'c++' or 'ptx', not {code_type!r}")
        self.code = code.encode() if isinstance(code, str) else bytes(code)
        self.code_type = code_type
        self.options = options.as_list() if isinstance(options, ProgramOptions) else list(options or [])
        self.name = name
        # What the source #includes by name (NVRTC's header list): the host resolves
        # #include only to these and the CUDA toolkit's own headers.
        self.headers = {str(k): v.encode() if isinstance(v, str) else bytes(v)
                        for k, v in (headers or {}).items()}
        self.conn = connection or default_connection()
        self.log = ""

    def compile(self, target_type: str = "cubin") -> "ObjectCode":
        """Compile (C++) or JIT-load (PTX) on the host; the log is kept in ``.log``."""
        if self.code_type == "ptx":
            return ObjectCode.from_ptx(self.code, connection=self.conn)
        options = "\0".join(self.options)
        if not self.headers:
            module, self.log = self.conn.call("MODULE_COMPILE", self.name, options,
                                              payload=self.code)
            return ObjectCode(self.conn, module)
        texts = [self.code, *self.headers.values()]
        sizes = b"".join(len(t).to_bytes(8, "little") for t in texts)
        module, self.log = self.conn.call("MODULE_COMPILE_HEADERS", self.name, options,
                                          "\0".join(self.headers), sizes,
                                          payload=b"".join(texts))
        return ObjectCode(self.conn, module)


class ObjectCode:
    """A module loaded in the guest's context on the host."""

    def __init__(self, conn: Connection, module: int):
        self.conn, self.module = conn, module
        self._kernels: dict[str, Kernel] = {}

    @classmethod
    def _load(cls, image: bytes, connection: Connection | None) -> "ObjectCode":
        conn = connection or default_connection()
        module, = conn.call("MODULE_LOAD_DATA", payload=image)
        return cls(conn, module)

    @classmethod
    def from_ptx(cls, ptx: str | bytes, *, connection: Connection | None = None):
        data = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
        return cls._load(data if data.endswith(b"\0") else data + b"\0", connection)

    @classmethod
    def from_cubin(cls, cubin: bytes, *, connection: Connection | None = None):
        return cls._load(bytes(cubin), connection)

    from_fatbin = from_cubin

    def get_kernel(self, name: str) -> "Kernel":
        kernel = self._kernels.get(name)
        if kernel is None:
            function, = self.conn.call("MODULE_GET_FUNCTION", self.module, name)
            kernel = self._kernels[name] = Kernel(self.conn, function, name)
        return kernel

    def close(self) -> None:
        if self.module is not None:
            self.conn.call("MODULE_UNLOAD", self.module)
            self.module = None


class Kernel:
    def __init__(self, conn: Connection, function: int, name: str):
        self.conn, self.function, self.name = conn, function, name
        self._layout: list[tuple[int, int]] | None = None

    @property
    def layout(self) -> list[tuple[int, int]]:
        """(offset, size) of each parameter, from the host's cuFuncGetParamInfo."""
        if self._layout is None:
            raw, = self.conn.call("FUNC_GET_PARAM_INFO", self.function)
            self._layout = [struct.unpack_from("<II", raw, i) for i in range(0, len(raw), 8)]
        return self._layout

    @property
    def num_arguments(self) -> int:
        return len(self.layout)

    def pack(self, args: tuple) -> bytes:
        layout = self.layout
        if len(args) != len(layout):
            raise TypeError(f"kernel {self.name} takes {len(layout)} arguments, "
                            f"{len(args)} given")
        if not layout:
            return b""
        end = layout[-1][0] + layout[-1][1]
        buf = bytearray(end)
        for i, (arg, (offset, size)) in enumerate(zip(args, layout)):
            buf[offset:offset + size] = _arg_bytes(arg, size, self.name, i)
        return bytes(buf)


_FLOATS = {2: "<e", 4: "<f", 8: "<d"}


def _arg_bytes(arg, size: int, kernel: str, index: int) -> bytes:
    """One argument as the ``size`` bytes the kernel's parameter takes."""
    if isinstance(arg, Buffer):
        arg = arg.ptr
    if hasattr(arg, "dtype") and hasattr(arg, "tobytes"):
        # numpy scalars first: np.float64 is also a Python float
        return _exact(arg.tobytes(), size, kernel, index)
    if isinstance(arg, bool):
        arg = int(arg)
    if isinstance(arg, int):
        try:
            return arg.to_bytes(size, "little", signed=arg < 0)
        except OverflowError:
            raise TypeError(f"{kernel} argument {index}: {arg} does not fit its "
                            f"{size}-byte parameter") from None
    if isinstance(arg, float):
        if size not in _FLOATS:
            raise TypeError(f"{kernel} argument {index}: a float cannot fill a "
                            f"{size}-byte parameter")
        return struct.pack(_FLOATS[size], arg)
    try:  # a struct passed by value, as raw bytes
        data = bytes(memoryview(arg))
    except TypeError:
        raise TypeError(f"{kernel} argument {index}: cannot pass "
                        f"{type(arg).__name__} as a kernel parameter") from None
    return _exact(data, size, kernel, index)


def _exact(data: bytes, size: int, kernel: str, index: int) -> bytes:
    if len(data) != size:
        raise TypeError(f"{kernel} argument {index}: {len(data)} bytes given, the "
                        f"parameter takes {size} (use a numpy scalar of the right dtype)")
    return data


@dataclass
class LaunchConfig:
    grid: int | tuple = 1
    block: int | tuple = 1
    shmem_size: int = 0
    stream: Stream | None = None


def _dim3(value) -> tuple[int, int, int]:
    if isinstance(value, int):
        return (value, 1, 1)
    value = tuple(value)
    if not 1 <= len(value) <= 3:
        raise ValueError(f"a grid or block has 1 to 3 dimensions, not {len(value)}")
    return value + (1,) * (3 - len(value))


def launch(kernel: Kernel, config: LaunchConfig, *args) -> None:
    """Launch ``kernel`` asynchronously; errors surface at the next synchronisation."""
    stream = config.stream.handle if config.stream is not None else 0
    kernel.conn.launch(kernel.function, _dim3(config.grid), _dim3(config.block),
                       config.shmem_size, stream, kernel.pack(args))
