"""Freed pool blocks the shim keeps for reuse stay the program's, in its own pool.

The shim keeps a freed block of a stream-ordered pool in the guest for the next
allocation of that pool, size and stream (hvgpu/guest/shim/poolcache.c). Nothing
new reaches the executor: a kept block is still an allocation of the program's
own pool there, charged to its VM. What must not happen is a kept block
outliving its pool: destroying the pool frees what the guest keeps of it first,
so the memory goes back to the slice, the pool hands out nothing more, and a
copy into one of its old blocks is refused by the executor.
"""

from __future__ import annotations

import time

from tests.guest.test_shim_cache import shim_stats
from tests.guest.test_shim_pool_cache import build, run


def test_a_kept_block_does_not_outlive_its_pool(agent, control, tmp_path):
    control.call("attach", vm="vm1", mem="64M")
    out = run(build(tmp_path), agent.vm_address("vm1"), "destroyed")
    assert out.stdout == ("destroyed: its kept blocks freed, the memory given back, a copy "
                          "refused\n")
    stats = shim_stats(out.stderr)
    assert stats["MEM_FREE_ASYNC"] == (0, 4)  # the kept blocks, before the destroy
    assert stats["MEM_POOL_DESTROY"] == (1, 0)
    deadline = time.monotonic() + 20
    while control.call("status")[0]["mem_used"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert control.call("status")[0]["mem_used"] == 0
