"""On-disk cache of compiled CUDA C++ modules, keyed by content hash.

Executors are short-lived (one per guest connection), so the cache lives on
disk and is shared by all of them. Writes are atomic (temp file + rename);
a corrupt or unreadable entry is a miss, never an error. Must not compile
anything itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


class CompileCache:
    def __init__(self, directory: str | os.PathLike | None):
        self.directory = Path(directory) if directory else None

    @staticmethod
    def key(compiler_id: str, name: str, options: list[str], source: bytes) -> str:
        h = hashlib.sha256()
        for part in (compiler_id.encode(), name.encode(), "\0".join(options).encode()):
            h.update(len(part).to_bytes(8, "little") + part)
        h.update(source)
        return h.hexdigest()

    def get_or_build(self, key: str, build: Callable[[], tuple[bytes, str]]) -> tuple[bytes, str, bool]:
        """(image, log, hit)."""
        path = self.directory / f"{key}.cubin" if self.directory else None
        if path is not None:
            try:
                return path.read_bytes(), "", True
            except OSError:
                pass
        image, build_log = build()
        if path is not None:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(image)
                os.replace(tmp, path)
            except OSError as exc:
                log.warning("compile cache %s not writable: %s", self.directory, exc)
        return image, build_log, False
