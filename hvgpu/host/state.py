"""Persisted slices: one SQLite database under the agent's state directory.

SQLite gives atomic, journaled writes: a crash (kill -9 included) mid-write
leaves the previous state. A database that cannot be read is reported with
its path and left untouched for the operator; nothing is ever silently reset.
Must not decide anything: the slice manager does.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hvgpu.errors import HvgpuError

SCHEMA = """
CREATE TABLE IF NOT EXISTS slices (
    vm TEXT PRIMARY KEY,
    gpu_uuid TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    mem INTEGER NOT NULL,
    compute INTEGER NOT NULL,
    cid INTEGER UNIQUE,
    created REAL NOT NULL,
    updated REAL NOT NULL
)
"""


class StateError(HvgpuError):
    code = "state"
    expected = False


@dataclass
class Slice:
    vm: str
    gpu_uuid: str
    gpu_index: int
    mem: int  # bytes
    compute: int  # percent of the GPU's SMs; 0: no share reserved (time-shared)
    cid: int | None = None
    created: float = 0.0
    updated: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class StateStore:
    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / "slices.db"
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute(SCHEMA)
            self.db.execute("SELECT count(*) FROM slices").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StateError(f"cannot read the slice state {self.path}: {exc}; it was left "
                             "as it is: move it aside to start empty, or restore a backup") from None
        except OSError as exc:
            raise StateError(f"cannot use the state directory {self.directory}: {exc}") from None

    def all(self) -> list[Slice]:
        rows = self.db.execute("SELECT vm, gpu_uuid, gpu_index, mem, compute, cid, created, "
                               "updated FROM slices ORDER BY vm").fetchall()
        return [Slice(*row) for row in rows]

    def put(self, s: Slice) -> None:
        now = time.time()
        s.updated = now
        s.created = s.created or now
        # one statement: SQLite applies it whole or not at all
        self.db.execute("INSERT OR REPLACE INTO slices VALUES (?,?,?,?,?,?,?,?)",
                        (s.vm, s.gpu_uuid, s.gpu_index, s.mem, s.compute, s.cid,
                         s.created, s.updated))

    def delete(self, vm: str) -> None:
        self.db.execute("DELETE FROM slices WHERE vm = ?", (vm,))

    def close(self) -> None:
        self.db.close()
