"""The data lane's ops as one table, keyed by protocol op code.

Each family of ops is a module that declares, for each of its ops, its check,
its charge and its action (``table.Family.declare``); :data:`TABLE` is all of
them, each op once. The session serves every frame through it
(``TABLE[op].serve(session, hdr, body)``) and, when the guest goes,
:func:`release` gives back everything it held.

Must not import CUDA; the families drive the session's ``GpuDevice``.
"""

from __future__ import annotations

from hvgpu.host.executor.ops import (arrays, device, graphs, hostmem, ipc, memory, modules,
                                     regions, streams, vmm)
from hvgpu.host.executor.ops.table import ALREADY_REPLIED, Op, build

FAMILIES = (device.FAMILY, memory.FAMILY, modules.FAMILY, streams.FAMILY, graphs.FAMILY,
            vmm.FAMILY, regions.FAMILY, arrays.FAMILY, ipc.FAMILY, hostmem.FAMILY)
TABLE: dict[int, Op] = build(*FAMILIES)


def release(session) -> None:
    """Everything the guest held, in the order CUDA needs, then what is left of its
    charge. Each step goes on past a failure (logged), so nothing is left held."""
    graphs.release_all(session)  # what graphs held back (parked) goes with them
    regions.release_all(session)
    ipc.release_all(session)  # memory opened from another process's IPC handle
    arrays.release_all(session)  # textures refer to arrays and memory: before both
    memory.release_staging(session)
    vmm.release_all(session)  # on the guest's streams, which are still there
    streams.release_all(session)
    modules.release_all(session)
    memory.release_all(session)
    device.release_limits(session)
    session.ledger.uncharge(session.ledger.charged)


__all__ = ["ALREADY_REPLIED", "FAMILIES", "Op", "TABLE", "release"]
