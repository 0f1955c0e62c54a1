"""Uploads that stall, and compilations that pile up, cost a VM's host little.

A guest that begins a large frame and goes quiet is closed after the mid-frame
silence; the payload bytes one executor holds whole (module images, sources) are
bounded together, so a frame past the budget is refused and skipped unheld; and a
VM's compilations run one at a time in its compiler slot, queued rather than run
side by side, however many connections ask at once.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from hvgpu.host.executor import admission
from hvgpu.host.executor import session as session_module
from hvgpu.host.executor.compile_cache import CompileCache
from hvgpu.host.executor.session import Session
from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import socket_pair
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame, hello, read_reply

M = 1 << 20
PTX = b".version 8.0\n.target sm_90\n.visible .entry noop()\n{\n ret;\n}\n"


def _serve(device, uploads=None, cache=None):
    guest, host = socket_pair()
    session = Session(host, device, peer="guest", uploads=uploads, cache=cache)
    thread = threading.Thread(target=session.serve, daemon=True)
    thread.start()
    guest.settimeout(30)
    guest.sendall(hello())
    assert read_reply(guest)[3] == 0
    return guest, thread


def _ended(guest: socket.socket, thread: threading.Thread, within: float) -> bool:
    thread.join(within)
    guest.settimeout(5)
    try:
        while guest.recv(65536):  # the rest of what it said, then the end
            pass
    except OSError:
        pass
    return not thread.is_alive()


def test_a_guest_that_stops_mid_upload_is_closed_and_an_idle_one_is_not(monkeypatch):
    monkeypatch.setattr(session_module, "MID_FRAME_SILENCE", 0.5)
    device = FakeDevice()
    idle, idle_thread = _serve(device)
    stalled, stalled_thread = _serve(device)
    # 200 MiB announced, 1 MiB sent, then nothing
    stalled.sendall(frame("MODULE_LOAD_DATA", seq=2, announce=200 * M) + b"\0" * M)
    time.sleep(1.5)  # three times the silence, between frames for the idle one
    assert _ended(stalled, stalled_thread, 10)
    idle.sendall(frame("PING", seq=2))
    assert read_reply(idle)[1:4] == (P.OP["PING"], 2, 0)
    idle.close()


def test_uploads_past_the_executors_budget_are_refused_unheld_and_the_connection_goes_on(
        monkeypatch):
    monkeypatch.setattr(session_module, "MID_FRAME_SILENCE", 1.0)
    device = FakeDevice()
    budget = admission.UploadBudget(8 * M)
    stalled, stalled_thread = _serve(device, budget)
    stalled.sendall(frame("MODULE_LOAD_DATA", seq=2, announce=6 * M) + b"\0" * M)
    time.sleep(0.2)
    other, _ = _serve(device, budget)
    image = PTX + b"\0" * (4 * M - len(PTX))
    other.sendall(frame("MODULE_LOAD_DATA", seq=2, payload=image) + frame("PING", seq=3))
    _, op, seq, status, body = read_reply(other)
    assert (op, seq, status) == (P.OP["MODULE_LOAD_DATA"], 2, P.CUDA_ERROR_OUT_OF_MEMORY)
    assert "6 MiB of uploads of its 8 MiB" in codec.ERROR.decode(body)[3]
    assert read_reply(other)[1:4] == (P.OP["PING"], 3, 0)  # the refused payload was skipped
    assert budget.held == 6 * M
    # once the stalled guest is closed its reservation is given back, and the upload fits
    assert _ended(stalled, stalled_thread, 10)
    assert budget.held == 0
    other.sendall(frame("MODULE_LOAD_DATA", seq=4, payload=image))
    assert read_reply(other)[1:4] == (P.OP["MODULE_LOAD_DATA"], 4, 0)
    other.close()


class SlowCompiler(FakeDevice):
    """The double, whose compilations take a while and count how many run at once."""

    def __init__(self):
        super().__init__()
        self.running = self.most = 0
        self.lock = threading.Lock()

    def compile(self, source, name, options, headers):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.2)
        with self.lock:
            self.running -= 1
        return super().compile(source, name, options, headers)


def test_a_vms_compilations_run_one_at_a_time_however_many_connections_ask(tmp_path):
    # Each connection stands for one of the VM's executors or its connections: they
    # share the VM's cache directory, where its compiler slot is.
    device = SlowCompiler()
    cache_dir = tmp_path / "vm-cache"
    conns = [_serve(device, cache=CompileCache(cache_dir)) for _ in range(4)]
    for i, (guest, _) in enumerate(conns):
        source = b'extern "C" __global__ void noop() {} // ' + str(i).encode()
        guest.sendall(frame("MODULE_COMPILE", f"k{i}.cu", "", seq=2, payload=source))
    statuses = [read_reply(guest)[3] for guest, _ in conns]
    assert statuses == [0, 0, 0, 0]  # queued, not refused
    assert device.most == 1
    for guest, _ in conns:
        guest.close()


def test_compilations_waiting_past_the_bound_are_refused_with_a_reason(tmp_path):
    slots = admission.CompileSlots(tmp_path, slots=1, max_waiting=2)
    release = threading.Event()
    got = []

    def hold():
        with slots.slot(30):
            got.append("held")
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    while not got:
        time.sleep(0.01)
    waiters = [threading.Thread(target=lambda: slots.slot(30).__enter__()) for _ in range(2)]
    for w in waiters:
        w.start()
    while slots.waiting < 2:
        time.sleep(0.01)
    with pytest.raises(Exception) as refused:
        with slots.slot(30):
            pass
    assert getattr(refused.value, "status", None) == P.CUDA_ERROR_OUT_OF_MEMORY
    assert "already waiting" in str(refused.value)
    release.set()
    holder.join(30)
    for w in waiters:
        w.join(30)
