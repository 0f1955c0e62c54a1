import logging
import socket
import struct
import threading

import pytest

from hvgpu.errors import CudaError
from hvgpu.host.executor.launch_burst import unavailable_reason
from hvgpu.host.executor.session import Allocations, Handles, Session
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import socket_pair
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame, hello, read_reply, read_to_eof


def test_ranges_inside_allocations_pass_and_others_say_why():
    allocs = Allocations()
    allocs.add(0x1000, 0x100)
    allocs.add(0x3000, 0x100)
    allocs.check(0x1000, 0x100, "dst")
    allocs.check(0x10F0, 0x10, "dst")  # pointer arithmetic inside an allocation
    with pytest.raises(CudaError, match="runs past the end"):
        allocs.check(0x10F0, 0x11, "dst")
    with pytest.raises(CudaError, match="not inside any allocation"):
        allocs.check(0x2000, 1, "dst")
    with pytest.raises(CudaError, match="not inside any allocation"):
        allocs.check(0x0FFF, 1, "dst")
    allocs.remove(0x1000)
    with pytest.raises(CudaError):
        allocs.check(0x1000, 1, "dst")
    with pytest.raises(CudaError, match="not an allocation"):
        allocs.remove(0x3001)
    assert len(allocs) == 1 and allocs.total == 0x100


def test_handles_are_per_kind_and_never_reused():
    table = Handles("event")
    a, b = table.add("a"), table.add("b")
    assert a >= 16 and b == a + 1
    table.pop(a)
    assert table.add("c") == b + 1
    with pytest.raises(CudaError, match="unknown event handle") as info:
        table.get(a)
    assert info.value.status == 400


def test_a_closing_session_logs_its_frames_per_op_the_c_loops_launches_too(caplog):
    device = FakeDevice()
    guest, host = socket_pair()
    session = Session(host, device, peer="guest-7")
    thread = threading.Thread(target=session.serve)
    ptx = b".version 8.0\n.target sm_90\n.visible .entry noop()\n{\n ret;\n}\n\0"
    oneway = P.FLAG_ONEWAY
    with caplog.at_level(logging.INFO, logger="hvgpu.host.executor.session"):
        thread.start()
        guest.settimeout(30)
        guest.sendall(hello() + frame("MODULE_LOAD_DATA", seq=2, payload=ptx)
                      + frame("MODULE_GET_FUNCTION", 16, "noop", seq=3)
                      + frame("FUNC_GET_ATTRIBUTES", 16, 16, seq=4)
                      + frame("FUNC_SET_ATTRIBUTE", 16, 8, 1024, flags=oneway, seq=5)
                      + b"".join(frame("LAUNCH_KERNEL", 16, 1, 1, 1, 32, 1, 1, 0, 0, b"",
                                       flags=oneway, seq=seq) for seq in range(6, 11))
                      + frame("FUNC_SET_ATTRIBUTE", 16, 0, 64, flags=oneway, seq=11)
                      + frame("PING", seq=12) + frame("FUNC_GET_ATTRIBUTE", 16, 8, seq=13))
        replies = [read_reply(guest) for _ in range(6)]
        guest.shutdown(socket.SHUT_WR)
        read_to_eof(guest)
        thread.join(30)
    assert not thread.is_alive()
    assert [(op, seq, status) for _, op, seq, status, _ in replies] == [
        (P.OP["HELLO"], 1, 0), (P.OP["MODULE_LOAD_DATA"], 2, 0),
        (P.OP["MODULE_GET_FUNCTION"], 3, 0), (P.OP["FUNC_GET_ATTRIBUTES"], 4, 0),
        (P.OP["PING"], 12, P.CUDA_ERROR_INVALID_VALUE),  # the read-only attribute's error
        (P.OP["FUNC_GET_ATTRIBUTE"], 13, 0)]
    known, values = codec.REPLY[P.OP["FUNC_GET_ATTRIBUTES"]].decode(replies[3][4])
    assert known == 0xFFFF and struct.unpack("<16i", values)[8] == 49152
    failed_op, _, failed_seq, _ = codec.ERROR.decode(replies[4][4])
    assert (failed_op, failed_seq) == (P.OP["FUNC_SET_ATTRIBUTE"], 11)
    assert codec.REPLY[P.OP["FUNC_GET_ATTRIBUTE"]].decode(replies[5][4]) == (1024,)
    if not unavailable_reason():
        assert device.c_launches >= 1  # the C loop served launches, counted as the others
    lines = [r.getMessage() for r in caplog.records if "frames by op" in r.getMessage()]
    assert lines == ["guest-7: frames by op: LAUNCH_KERNEL 5 one-way, FUNC_SET_ATTRIBUTE 2 "
                     "one-way, FUNC_GET_ATTRIBUTE 1 sync, FUNC_GET_ATTRIBUTES 1 sync, "
                     "MODULE_GET_FUNCTION 1 sync, MODULE_LOAD_DATA 1 sync, PING 1 sync"]


def test_the_per_op_line_stays_short():
    session = Session.__new__(Session)
    session.by_op = {(0x100 + n) << 1 | (n & 1): n for n in range(1, 40)}  # 39 unnamed ops
    line = session.op_counts()
    assert line.startswith("op 0x127 39 one-way, op 0x126 38 sync, ")
    assert line.count(",") == 12 and line.endswith(f"{sum(range(1, 28))} more in 27 other ops")
