"""Log lines: text on a terminal as before, journald's priority prefix and no time of
our own under the journal, one JSON object a line for collectors; executors follow."""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile

from hvgpu.host import logs


def record(level=logging.WARNING, msg="slice %s: %d MiB", args=("vm1", 40), exc=None, **extra):
    r = logging.LogRecord("hvgpu.host.agent", level, __file__, 1, msg, args, exc)
    for key, value in extra.items():
        setattr(r, key, value)
    return r


def test_text_keeps_the_time_source_and_level():
    line = logs.Formatter("text", "agent").format(record())
    assert line.endswith(" agent WARNING slice vm1: 40 MiB")
    assert line[:4].isdigit()  # the time first, as before


def test_journal_lines_carry_the_priority_and_no_time():
    f = logs.Formatter("journal", "executor[slice vm1]")
    assert f.format(record()) == "<4>executor[slice vm1] WARNING slice vm1: 40 MiB"
    assert f.format(record(logging.DEBUG)).startswith("<7>")
    assert f.format(record(logging.INFO)).startswith("<6>")
    assert f.format(record(logging.ERROR)).startswith("<3>")
    assert f.format(record(logging.CRITICAL)).startswith("<2>")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        text = f.format(record(logging.ERROR, exc=sys.exc_info()))
    lines = text.split("\n")
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)  # a traceback too


def test_json_is_one_object_a_line_with_extra_fields():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        exc = sys.exc_info()
    line = logs.Formatter("json", "agent").format(record(exc=exc, vm="vm1", peer="cid 3"))
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "WARNING" and obj["logger"] == "hvgpu.host.agent"
    assert obj["message"] == "slice vm1: 40 MiB" and obj["source"] == "agent"
    assert obj["vm"] == "vm1" and obj["peer"] == "cid 3"
    assert obj["time"].endswith("Z") and "T" in obj["time"]
    assert "ValueError: boom" in obj["exception"]
    assert "args" not in obj and "msg" not in obj  # the record's own fields stay out


def test_auto_is_journal_only_on_the_stream_systemd_named():
    with tempfile.TemporaryFile() as f:
        st = os.fstat(f.fileno())
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logs.resolve("auto", f, named) == "journal"
        assert logs.resolve("auto", f, {}) == "text"
        with tempfile.TemporaryFile() as other:  # stderr redirected: not the journal
            assert logs.resolve("auto", other, named) == "text"
        assert logs.resolve("json", f, named) == "json"


def test_setup_leaves_a_harness_s_logging_alone():
    root = logging.getLogger()
    before = list(root.handlers)
    if not before:
        root.addHandler(logging.NullHandler())
    try:
        stream = io.StringIO()
        assert logs.setup("INFO", "json", "agent", stream) == "json"
        logging.getLogger("hvgpu.test").warning("x")
        assert stream.getvalue() == ""
    finally:
        if not before:
            root.handlers.clear()


def test_executors_write_the_agent_s_format(tmp_path, monkeypatch):
    """Their stderr is the agent's: the agent hands its resolved format down."""
    import functools
    import subprocess

    from hvgpu.guest import Connection
    from tests.conftest import FAKE_DEVICE, RunningAgent

    out = open(tmp_path / "executor.log", "w+")
    monkeypatch.setattr(subprocess, "Popen", functools.partial(subprocess.Popen, stderr=out))
    agent = RunningAgent(tmp_path, FAKE_DEVICE)
    try:
        agent.config.log_format = "json"  # read when an executor starts
        with Connection(agent.address) as conn:
            conn.call("PING")
    finally:
        agent.stop()
    out.seek(0)
    # an executor may still be ending (on its lifeline): its last line may be half out
    lines = [json.loads(line) for line in out.read().split("\n")[:-1] if line.strip()]
    executor = [line for line in lines if line["source"].startswith("executor[")]
    assert executor and all(line["level"] in ("DEBUG", "INFO", "WARNING") for line in executor)


def test_a_budget_allows_a_burst_then_a_line_per_interval_and_counts_the_rest():
    now = [0.0]
    budget = logs.Budget(lines=3, per=30.0, keys=2, clock=lambda: now[0])
    assert [budget.take("vm1") for _ in range(5)] == [0, 0, 0, None, None]
    assert budget.take("vm2") == 0  # each key has its own
    now[0] += 10.0  # one line's worth
    assert budget.take("vm1") == 2  # and it says how many were dropped
    assert budget.take("vm1") is None
    budget.take("vm3")  # a third key: the longest unused (vm2) is forgotten
    assert set(budget._state) == {"vm1", "vm3"}


def test_no_message_is_longer_than_its_bound_and_guest_text_is_one_quoted_line():
    line = logs.Formatter("text", "agent").format(record(msg="%s", args=("x" * 100000,)))
    assert len(line) < logs.LINE_MAX + 100 and line.endswith("(cut: 100000 characters)")
    assert logs.clip("a\nb") == "'a\\nb'"
    assert logs.clip("y" * 500) == repr("y" * 120) + "... (500 characters)"


def test_lines_about_a_vm_are_held_to_its_budget_whoever_writes_them():
    from hvgpu.host.names import VgpuKey

    now = [0.0]
    limit = logs.PerVm(budget=logs.Budget(2, 10.0, clock=lambda: now[0]))
    about_vm1 = [record(msg="slice %s: x", args=(VgpuKey("vm1", 1),)) for _ in range(4)]
    assert [limit.filter(r) for r in about_vm1] == [True, True, False, False]
    assert limit.filter(record(msg="nothing about a VM", args=()))
    assert limit.filter(record(vm="vm2"))
    now[0] += 5.0
    r = record(msg="slice %s: again", args=(VgpuKey("vm1", 0),))
    assert limit.filter(r)
    assert r.getMessage() == ("slice vm1: again [2 lines about vm1 suppressed before this "
                              "one: 2 in 10 s at most]")
