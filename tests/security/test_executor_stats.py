"""What an executor reports for the metrics (STATS) can neither stop the agent nor
break the metrics.

An executor may be compromised. Its STATS are totals since it started; the
agent adds up the increases. A report with absurd numbers the lane does not
allow ends that executor (as any bad message does) and the vGPU's counters
stay; numbers that go down change nothing (counters never go back); statuses
the table does not name count as one series, so no report can grow the
number of series or the agent's memory.
"""

from __future__ import annotations

import signal

import pytest

from hvgpu.guest import Connection, Device
from hvgpu.host.executor import messages
from hvgpu.virtio import protocol as P
from hvgpu.virtio.transport import connect, send_message
from tests.conftest import FAKE_DEVICE, RunningAgent
from tests.security.test_executor_lane import FakeExecutors, _receive, _wait

M = 1 << 20


def stats(launches=0, round_trips=0, to_gpu=0, from_gpu=0, errors=None) -> bytes:
    return messages.encode(messages.STATS, launches=launches, round_trips=round_trips, to_gpu=to_gpu,
                       from_gpu=from_gpu, errors=errors or {})


def test_the_table_bounds_every_count():
    ok = stats(5, 1, 2, 3, {"2": 4})
    assert messages.decode(ok, 0, messages.TO_AGENT)[1]["errors"] == {"2": 4}
    messages.encode(messages.STATS, launches=messages.MAX_COUNT, round_trips=0, to_gpu=0, from_gpu=0,
                errors={str(messages.MAX_STATUS): messages.MAX_COUNT})
    for bad in ({"launches": -1}, {"launches": messages.MAX_COUNT + 1}, {"to_gpu": True},
                {"from_gpu": 1.5}, {"errors": []}, {"errors": {"x": 1}},
                {"errors": {"0": 1}}, {"errors": {"02": 1}}, {"errors": {"-2": 1}},
                {"errors": {"2": -1}}, {"errors": {"2": True}}, {"errors": {"2": "1"}},
                {"errors": {"²": 1}}, {"errors": {str(messages.MAX_STATUS + 1): 1}},
                {"errors": {str(s): 1 for s in range(1, messages.STATS_STATUSES_MAX + 2)}}):
        fields = {"launches": 0, "round_trips": 0, "to_gpu": 0, "from_gpu": 0,
                  "errors": {}, **bad}
        with pytest.raises(messages.LaneError):
            messages.encode(messages.STATS, **fields)
        raw = ('{"v":1,"op":"stats",' + ",".join(
            f'"{k}":{_json(v)}' for k, v in fields.items()) + "}").encode()
        with pytest.raises(messages.LaneError):
            messages.decode(raw, 0, messages.TO_AGENT)


def _json(v):
    import json

    return json.dumps(v)


@pytest.fixture
def running(tmp_path):
    agent = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1", "vm2"))
    agent.api.attach("vm1", "32M")
    agent.api.attach("vm2", "32M")
    yield agent
    agent.stop()


def _vgpu(running, vm):
    """The vGPU in the agent's latest snapshot (published about once a second)."""
    return next((v for v in running.agent.snapshot.vgpus if v.vm == vm), None)


def _launches(running, vm):
    v = _vgpu(running, vm)
    return v.launches if v is not None else None


def test_a_hostile_executor_cannot_lower_inflate_past_bounds_or_multiply_series(running,
                                                                                 monkeypatch):
    fakes = FakeExecutors(running.agent, "vm2", monkeypatch)
    guest = connect(running.vm_address("vm2"))
    end, proc = fakes.ends.get(timeout=20)
    try:
        assert _receive(end)[0] is messages.CONN
        send_message(end, stats(100, 10, 1000, 2000, {str(P.CUDA_ERROR_OUT_OF_MEMORY): 3}))
        _wait(lambda: _launches(running, "vm2") == 100)
        send_message(end, stats(1, 1, 1, 1, {str(P.CUDA_ERROR_OUT_OF_MEMORY): 1}))  # lower
        # statuses no table names, many reports of them: one series
        for first in range(1, 20 * messages.STATS_STATUSES_MAX, messages.STATS_STATUSES_MAX):
            send_message(end, stats(messages.MAX_COUNT, 10, 1000, 2000, {
                str(100000 + s): 1 for s in range(first, first + messages.STATS_STATUSES_MAX)}))
        _wait(lambda: _launches(running, "vm2") == messages.MAX_COUNT)
        v = _vgpu(running, "vm2")
        assert (v.round_trips, v.to_gpu, v.from_gpu) == (10, 1000, 2000)  # never went back
        assert dict(v.errors)["CUDA_ERROR_OUT_OF_MEMORY"] == 3
        assert set(dict(v.errors)) == {"CUDA_ERROR_OUT_OF_MEMORY", "UNKNOWN"}
        # beyond what the lane allows: that executor's end, as any bad message
        end.send(b'{"v":1,"op":"stats","launches":18014398509481984,"round_trips":0,'
                 b'"to_gpu":0,"from_gpu":0,"errors":{}}')
        assert proc.wait(timeout=20) == -signal.SIGKILL
        assert running.thread.is_alive()
        _wait(lambda: _vgpu(running, "vm2").connections == 0)
        assert _vgpu(running, "vm2").launches == messages.MAX_COUNT  # its counters stay
        with Connection(running.vm_address("vm1")) as conn:  # vm1 never noticed
            Device(connection=conn).allocate(M).close()
    finally:
        end.close()
        guest.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
