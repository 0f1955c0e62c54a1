"""Progress frames: "still working on seq N" to guests waiting on long work.

A guest gives up on an agent that stays silent for its timeout (HVGPU_TIMEOUT).
A synchronize behind a long kernel is not silence: while a session has been
busy with one frame for more than :data:`AFTER` seconds, one thread per
executor process sends that guest a progress frame (``FLAG_PROGRESS``) every
:data:`EVERY` seconds, and the guest's timer starts again. Only guests that
set ``CAP_PROGRESS`` in HELLO get them.

Must not decide anything about the work itself, and must never block on a
guest's socket (the session sends; this thread only tries).
"""

from __future__ import annotations

import logging
import threading
import time

from hvgpu.virtio import protocol as P

log = logging.getLogger(__name__)

AFTER = 1.0  # seconds a frame has been in work before its first progress frame
EVERY = P.PROGRESS_EVERY  # seconds between progress frames (a guest's timeout is longer)
_TICK = 0.25


class Heartbeat:
    """Sends the progress frames of every session of this process that needs one."""

    def __init__(self, after: float = AFTER, every: float = EVERY):
        self.after, self.every = after, every
        self.sessions: set = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, session) -> None:
        with self.lock:
            self.sessions.add(session)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="hvgpu-progress",
                                               daemon=True)
                self.thread.start()

    def remove(self, session) -> None:
        with self.lock:
            self.sessions.discard(session)

    def _loop(self) -> None:
        while True:
            time.sleep(_TICK)
            with self.lock:
                sessions = list(self.sessions)
            now = time.monotonic()
            for session in sessions:
                try:
                    session.send_progress(now, self.after, self.every)
                except Exception:  # one session's trouble never stops the others' progress
                    log.debug("progress frame for %s failed", session.peer, exc_info=True)
