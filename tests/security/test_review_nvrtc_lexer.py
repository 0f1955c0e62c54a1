"""Review: nvrtc_policy's include check reads a guest's source in the executor's own
process (not the CPU-limited compiler child), holding the GIL. Its lexer must take time
linear in the source: a number pattern that starts anew at every digit of a long
pp-number ("1.1.1...", "1e+1e+...") and fails at its end made it quadratic, so one
16 MiB source would keep a host core (and every thread of the executor) busy for days.
"""

from __future__ import annotations

import time

import pytest

from hvgpu.host.executor import nvrtc_policy


@pytest.mark.parametrize("unit", [b"1.", b"1e+", b"0x1p-", b".1"])
def test_a_long_number_is_read_in_linear_time(unit):
    source = b"int x = " + unit * ((32 << 10) // len(unit)) + b";\n"
    started = time.monotonic()
    nvrtc_policy.check_includes(source, {}, "k.cu")
    assert time.monotonic() - started < 2.0


def test_a_number_still_hides_no_include_and_steps_over_separators():
    # A digit separator's quote starts no character literal (c++14 and later), so the
    # include after it is still found and checked.
    with pytest.raises(Exception):
        nvrtc_policy.check_includes(b"int x = 1'2;\n#include \"/etc/passwd\"\n", {}, "k.cu")
    nvrtc_policy.check_includes(b"int x = 1.5e+3;\nint y = 1'000;\n", {}, "k.cu")
