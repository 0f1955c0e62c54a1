"""Review: graph-node counting while captures overlap. A captured frame is counted
(in_capture) while its capture is under way, and its graph counted whole when the
capture ends; but the frames are given back only once no capture at all is under
way. A program that always has one capture going (a stream captured for long, or
threads capturing by turns) is charged every frame of every capture that ended
meanwhile, even of graphs it destroyed, until it is refused for nodes it no longer
holds.
"""

from __future__ import annotations

from tests.security.test_graph_nodes import GLOBAL, bounds  # noqa: F401 (a fixture)
from tests.security.test_regions import MiB, Guest


def test_frames_of_an_ended_capture_are_not_held_while_another_goes_on(bounds):  # noqa: F811
    g = Guest()
    try:
        dptr = g.alloc(MiB)
        _, (long_lived,) = g.call("STREAM_CREATE", 1)
        _, (s,) = g.call("STREAM_CREATE", 1)
        assert g.call("STREAM_BEGIN_CAPTURE", long_lived, GLOBAL)[0] == 0
        for turn in range(15):  # 15 x 100 frames, 100 nodes held at most at any time
            assert g.call("STREAM_BEGIN_CAPTURE", s, GLOBAL)[0] == 0
            for i in range(100):
                g.post("MEMSET", dptr + i, 1, i & 0xFF, 1, s)
            status, got = g.call("STREAM_END_CAPTURE", s)
            assert status == 0, (f"capture {turn + 1} of 100 frames failed, the budget "
                                 f"counting {bounds.held} nodes: {got}")
            assert g.call("GRAPH_DESTROY", got[0])[0] == 0
        assert bounds.held <= 100, f"{bounds.held} nodes counted for a connection holding none"
        status, _ = g.call("STREAM_END_CAPTURE", long_lived)
        assert status == 0
    finally:
        g.close()
    assert bounds.held == 0
