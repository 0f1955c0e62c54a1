"""On-disk cache of compiled CUDA C++ modules, keyed by content hash, one per VM.

Executors come and go, so the cache lives on disk; the agent gives each VM's
executors a directory of its own, so one guest can neither fill another's
cache nor learn from a hit what another compiled. It is bounded in bytes and
in entries: the least recently used modules go first. Writes are atomic (temp
file + rename); a corrupt or unreadable entry is a miss, never an error.
Must not compile anything itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

MAX_BYTES = 256 << 20
MAX_ENTRIES = 1024
_SUFFIX = ".cubin"


class CompileCache:
    def __init__(self, directory: str | os.PathLike | None, *, max_bytes: int = MAX_BYTES,
                 max_entries: int = MAX_ENTRIES):
        self.directory = Path(directory) if directory else None
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._lock = threading.Lock()

    @staticmethod
    def key(compiler_id: str, name: str, options: list[str], source: bytes,
            headers: dict[str, bytes] | None = None) -> str:
        h = hashlib.sha256()
        parts = [compiler_id.encode(), name.encode(), "\0".join(options).encode(), bytes(source)]
        for hname, text in sorted((headers or {}).items()):
            parts += [hname.encode(), bytes(text)]
        for part in parts:  # length-prefixed: no two inputs hash alike by shifting bytes
            h.update(len(part).to_bytes(8, "little") + part)
        return h.hexdigest()

    def get_or_build(self, key: str, build: Callable[[], tuple[bytes, str]]) -> tuple[bytes, str, bool]:
        """(image, log, hit)."""
        path = self.directory / f"{key}{_SUFFIX}" if self.directory else None
        if path is not None:
            try:
                image = path.read_bytes()
                os.utime(path)  # most recently used
                return image, "", True
            except OSError:
                pass
        image, build_log = build()
        if path is not None and len(image) <= self.max_bytes:
            try:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                os.replace(tmp, path)
                self._evict()
            except OSError as exc:
                log.warning("compile cache %s not writable: %s", self.directory, exc)
        return image, build_log, False

    def _evict(self) -> None:
        """Least recently used entries out until both bounds hold."""
        with self._lock:
            entries = []
            for entry in os.scandir(self.directory):
                if entry.name.endswith(_SUFFIX):
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    entries.append((st.st_mtime, st.st_size, entry.path))
            entries.sort()
            total = sum(size for _, size, _ in entries)
            while entries and (total > self.max_bytes or len(entries) > self.max_entries):
                _, size, victim = entries.pop(0)
                try:
                    os.unlink(victim)
                except OSError:
                    pass
                total -= size
