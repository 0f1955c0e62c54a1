"""The one exception hierarchy of hvgpu, shared by host and guest.

Every error carries a stable ``code`` (a short string that scripts may match;
each class has its own) and an ``expected`` flag: expected errors are the
user's or operator's to fix and a command line reports them in one line;
unexpected ones are bugs or broken hosts, and :func:`report` adds the
traceback to that line so that they can be reported. CUDA status numbers
travel unchanged inside :class:`CudaError`.

This module must not import anything outside the standard library, so that
the guest package can use it without the host's dependencies.
"""

from __future__ import annotations

import sys
import traceback


class HvgpuError(Exception):
    """Base of every error hvgpu raises on purpose."""

    code = "hvgpu-error"
    expected = True

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class AddressError(HvgpuError):
    """An agent or guest address that cannot be parsed or used."""

    code = "bad-address"


class TransportError(HvgpuError):
    """A socket could not be opened, or a peer went away."""

    code = "transport"


class ConnectionLost(TransportError):
    """The peer closed the connection or vanished mid-frame."""

    code = "connection-lost"


class ProtocolError(HvgpuError):
    """The peer sent something that is not valid protocol v1."""

    code = "protocol"


class CudaError(HvgpuError):
    """A CUDA driver status (or an hvgpu wire status) other than success.

    ``status`` is CUDA's own number (``CUresult``), unchanged from the host's
    driver, or one of hvgpu's wire statuses (10000 and above, see
    ``hvgpu.virtio.protocol.STATUSES``). ``deferred`` is true when the status
    belongs to an earlier asynchronous call and surfaced at a synchronising
    one, as CUDA's asynchronous errors do.
    """

    code = "cuda"

    def __init__(self, status: int, message: str = "", *, op: str = "",
                 deferred: bool = False):
        from hvgpu.virtio.protocol import status_name  # stdlib-only module

        self.status = int(status)
        self.name = status_name(self.status)
        self.detail = message  # the message alone: the status travels separately
        self.op = op
        self.deferred = deferred
        text = f"{self.name} ({self.status})"
        if op:
            text += f" in {op}" + (" (an earlier asynchronous call)" if deferred else "")
        if message:
            text += f": {message}"
        super().__init__(text)

    def __reduce__(self):  # pickled whole (a process pool carries one back)
        return (_cuda_error, (type(self), self.status, self.detail, self.op, self.deferred))


def _cuda_error(cls, status, detail, op, deferred):
    return cls(status, detail, op=op, deferred=deferred)


class AgentLost(CudaError, ConnectionLost):
    """The guest's connection to the agent is gone: the agent stopped, the executor
    of its vGPU ended, the slice was detached, or the agent stayed silent for
    $HVGPU_TIMEOUT seconds. The GPU work of that connection is gone with it.

    A :class:`CudaError` with ``status`` CUDA_ERROR_DEVICE_UNAVAILABLE (46), the
    status the guest's ``libcuda.so.1`` shim returns in the same case, so a CUDA
    program and a Python one see the same error; every later call on that
    connection raises it again. Also a :class:`ConnectionLost`, for code that
    catches that.
    """

    code = "agent-lost"


def report(exc: HvgpuError, prog: str, stream=None) -> int:
    """Tell a command line's user about ``exc`` on ``stream`` (stderr) and return
    the exit status: one line ``prog: error: message`` for an expected error; for an
    unexpected one the same line, then its code and traceback (what a bug report
    needs). The status is 1 either way, so scripts see one failure status."""
    stream = sys.stderr if stream is None else stream
    stream.write(f"{prog}: error: {exc}\n")
    if not exc.expected:
        stream.write(f"{prog}: this is not expected (code {exc.code}); please report it "
                     "with what follows:\n")
        stream.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    stream.flush()
    return 1


class CompileError(CudaError):
    """Host-side NVRTC compilation failed; ``log`` holds the compiler's log."""

    code = "compile"

    def __init__(self, status: int, message: str = "", *, op: str = "",
                 deferred: bool = False):
        super().__init__(status, message, op=op, deferred=deferred)
        self.log = message
