"""Review: the mid-frame silence is a bound on each pause, not on the frame. A guest
that announces a large module image and then sends one byte a little more often than
the silence keeps its connection, and the upload budget reserved for the whole image,
for as long as it likes (512 MiB announced, a byte a minute: a year), so the VM's
other uploads are refused all that time. A frame begun should have to make progress
at some rate, or end within a bound, as well as not pause for long.
"""

from __future__ import annotations

import time

from hvgpu.host.executor import admission
from hvgpu.host.executor import session as session_module
from tests.fake_gpu import FakeDevice
from tests.security.data_lane import frame
from tests.security.test_stalled_uploads import M, _ended, _serve


def test_a_trickled_upload_does_not_hold_the_budget_for_ever(monkeypatch):
    monkeypatch.setattr(session_module, "MID_FRAME_SILENCE", 0.5)
    uploads = admission.UploadBudget(64 * M)
    guest, thread = _serve(FakeDevice(), uploads=uploads)
    guest.sendall(frame("MODULE_LOAD_DATA", seq=2, announce=64 * M))
    deadline = time.monotonic() + 8.0  # 16 silences long, a byte every 0.3 s
    try:
        while time.monotonic() < deadline and thread.is_alive():
            guest.sendall(b"\0")
            time.sleep(0.3)
    except OSError:
        pass  # closed on it: what is wanted
    held = uploads.held
    assert _ended(guest, thread, 2.0) and held < 64 * M, \
        f"a guest trickling a byte per 0.3 s still holds {held >> 20} MiB of the budget"
