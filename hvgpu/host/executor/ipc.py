"""CUDA IPC among the processes of one VM: the executor's table of what they export.

Every process of a VM that uses a vGPU has its own connection (session) to that
vGPU's one executor, and all of them work in the executor's one context. So a
cuIpcGetMemHandle needs no host IPC: the handle the guest passes between its
processes is a token (:data:`TOKEN_SIZE` random bytes, never derived from an
address or a counter) naming an export in this executor's :class:`Exports`, and
opening it gives the opening connection the same device memory (or event).
Another VM's executor is another process with another table: its tokens name
nothing here. The same table holds VMM memory's shareable handles (vmm.py) and
memory pools' and their allocations' (pools.py), each kind opening only as itself.

An :class:`Export` keeps the device object alive while anyone holds it: the
exporter until it frees (or destroys) it, and each connection that opened it
until it closes it (or ends). The exporter's free withdraws the token at once
(nothing opens it again) and gives the driver the memory back only when the last
opener lets go; its charge stays on the slice (the same VM's) until then.

Must not import CUDA (the session's device does every call) or let a connection
reach an export but through a token it was given.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any, Callable

from hvgpu.errors import CudaError
from hvgpu.virtio import protocol as P

TOKEN_SIZE = P.IPC_HANDLE_SIZE
MEMORY, EVENT, VMM = "memory", "event", "vmm"  # cuMemAlloc's, an event, cuMemCreate's
POOL, POINTER = "pool", "pool pointer"  # a memory pool, an allocation from one
KINDS = (MEMORY, EVENT, VMM, POOL, POINTER)


class Export:
    """One exported allocation or event, and who holds it."""

    __slots__ = ("token", "kind", "exporter", "base", "size", "obj", "holders", "last",
                 "uncharge")

    def __init__(self, token: bytes, kind: str, exporter: Any, base: int = 0, size: int = 0,
                 obj: Any = None):
        self.token, self.kind, self.exporter = token, kind, exporter
        self.base, self.size, self.obj = base, size, obj
        self.holders = 1  # the exporter's, until it frees or destroys what it exported
        # what the last holder's letting go runs, with what that holder passes (a pool
        # pointer's: the stream its memory is freed on)
        self.last: Callable[..., None] | None = None
        self.uncharge: Callable[[], None] = lambda: None  # gives the slice its charge back


class Exports:
    """The executor's exports by token (one table per executor: per VM and vGPU)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_token: dict[bytes, Export] = {}

    def export(self, kind: str, exporter: Any, **what) -> Export:
        with self.lock:
            token = secrets.token_bytes(TOKEN_SIZE)
            while token in self.by_token:  # 2**-512: never, but never twice either
                token = secrets.token_bytes(TOKEN_SIZE)
            made = self.by_token[token] = Export(token, kind, exporter, **what)
            return made

    def find(self, token: bytes, kind: str) -> Export:
        """The live export ``token`` names; CUDA_ERROR_INVALID_VALUE for anything else
        (a guess, another VM's, one withdrawn, an event's where memory is asked)."""
        if len(token) != TOKEN_SIZE:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"an IPC handle is {TOKEN_SIZE} bytes, not {len(token)}")
        with self.lock:
            found = self.by_token.get(bytes(token))
        if found is None or found.kind != kind:
            raise CudaError(P.CUDA_ERROR_INVALID_VALUE,
                            f"the IPC {kind} handle names nothing this vGPU exported (never "
                            "made here, or what it named is gone)")
        return found

    def hold(self, export: Export) -> bool:
        """One more holder, unless it was withdrawn meanwhile (False)."""
        with self.lock:
            if self.by_token.get(export.token) is not export:
                return False
            export.holders += 1
            return True

    def withdraw(self, export: Export, last: Callable[..., None]) -> Callable[..., None]:
        """The exporter lets go: nothing opens the token again, and ``last`` runs once
        the last holder lets go. Returns the exporter's letting go (run it now, or
        once its own graphs are gone)."""
        with self.lock:
            self.by_token.pop(export.token, None)
            export.last = last
        return lambda *args: self.let_go(export, *args)

    def let_go(self, export: Export, *args) -> None:
        """One holder fewer; the last one's runs ``last(*args)`` (the token opens nothing
        from then on)."""
        with self.lock:
            export.holders -= 1
            last = export.last if export.holders == 0 else None
            if last is not None:
                self.by_token.pop(export.token, None)
        if last is not None:
            last(*args)

    def __len__(self) -> int:
        return len(self.by_token)


class Held:
    """What one connection exported and opened."""

    def __init__(self):
        self.exports: dict[int, Export] = {}  # allocation base -> its export
        self.opened: dict[int, list] = {}  # base -> [export, times opened]
