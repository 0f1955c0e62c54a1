"""Undo a multi-step side effect in reverse order when a later step fails.

    with Transaction() as tx:
        create_executor(); tx.on_undo(stop_executor)
        write_state();     tx.on_undo(remove_state)

Must not swallow the failure: the original exception propagates after the
undo steps have run (an undo step's own failure is logged, not raised).
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


class Transaction:
    def __init__(self):
        self._undo: list[tuple[str, Callable[[], object]]] = []

    def on_undo(self, fn: Callable[[], object], what: str = "") -> None:
        self._undo.append((what or getattr(fn, "__name__", "step"), fn))

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            for what, fn in reversed(self._undo):
                try:
                    fn()
                except Exception:
                    log.exception("undoing %s failed", what)
        self._undo.clear()
        return False
