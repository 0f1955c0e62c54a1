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

# One row per vGPU: a VM's devices are numbered 0..N-1, as the guest sees them.
SCHEMA = """
CREATE TABLE IF NOT EXISTS vgpus (
    vm TEXT NOT NULL,
    device INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    gpu_index INTEGER NOT NULL,
    mem INTEGER NOT NULL,
    compute INTEGER NOT NULL,
    cid INTEGER,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (vm, device)
)
"""
# The first release's table (one slice per VM), moved into vgpus as device 0.
_MIGRATE_V1 = """
INSERT INTO vgpus SELECT vm, 0, gpu_uuid, gpu_index, mem, compute, cid, created, updated
FROM slices;
DROP TABLE slices;
"""
_COLUMNS = "vm, gpu_uuid, gpu_index, mem, compute, cid, created, updated, device"


class StateError(HvgpuError):
    code = "state"
    expected = False


@dataclass
class Slice:
    """One vGPU of a VM: a share of one physical GPU."""

    vm: str
    gpu_uuid: str
    gpu_index: int
    mem: int  # bytes
    compute: int  # percent of the GPU's SMs; 0: no share reserved (time-shared)
    cid: int | None = None
    created: float = 0.0
    updated: float = 0.0
    device: int = 0  # the guest's device number for it

    @property
    def key(self) -> str:
        """Names this vGPU: the VM's name for device 0, VM#N for device N."""
        return slice_key(self.vm, self.device)

    def as_dict(self) -> dict:
        return asdict(self)


def slice_key(vm: str, device: int = 0) -> str:
    return vm if device == 0 else f"{vm}#{device}"


def split_key(key: str) -> tuple[str, int]:
    """'vm1#1' -> ('vm1', 1); 'vm1' -> ('vm1', 0)."""
    vm, sep, device = key.rpartition("#")
    if sep and vm and device.isdigit():
        return vm, int(device)
    return key, 0


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
            self._migrate()
            self.db.execute("SELECT count(*) FROM vgpus").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StateError(f"cannot read the slice state {self.path}: {exc}; it was left "
                             "as it is: move it aside to start empty, or restore a backup") from None
        except OSError as exc:
            raise StateError(f"cannot use the state directory {self.directory}: {exc}") from None

    def _migrate(self) -> None:
        old = self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                              "name = 'slices'").fetchone()
        if old:  # one transaction: either both steps happen or neither
            self.db.executescript("BEGIN;" + _MIGRATE_V1 + "COMMIT;")

    def all(self) -> list[Slice]:
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM vgpus ORDER BY vm, device").fetchall()
        return [Slice(*row) for row in rows]

    def put(self, *slices: Slice) -> None:
        """Write these vGPUs together: all or none."""
        now = time.time()
        for s in slices:
            s.updated = now
            s.created = s.created or now
        with self.db:  # one transaction
            self.db.execute("BEGIN")
            self.db.executemany(f"INSERT OR REPLACE INTO vgpus ({_COLUMNS}) "
                                "VALUES (?,?,?,?,?,?,?,?,?)",
                                [(s.vm, s.gpu_uuid, s.gpu_index, s.mem, s.compute, s.cid,
                                  s.created, s.updated, s.device) for s in slices])

    def delete(self, vm: str, device: int | None = None) -> None:
        """One vGPU of ``vm``, or all of them."""
        if device is None:
            self.db.execute("DELETE FROM vgpus WHERE vm = ?", (vm,))
        else:
            self.db.execute("DELETE FROM vgpus WHERE vm = ? AND device = ?", (vm, device))

    def close(self) -> None:
        self.db.close()
