"""Persisted slices: one SQLite database under the agent's state directory.

SQLite gives atomic, journaled writes: a crash (kill -9 included) mid-write
leaves the previous state, and every change is checkpointed into the main
file at once, so ``slices.db`` alone holds every change (its WAL may be lost).
After each change a copy of the table goes to ``slices.json`` (written
atomically), with a generation number that the database carries too: a
database that is missing, emptied or older than that copy is detected at
open and restored from it, and the restoration is reported.

Rows are checked when loaded (VM name, device, sizes, shares, CID, a CRC of
the row's values; the region size is 0 in rows written before it
existed): a bad row is reported with its VM in ``problems`` and left out, and
the file is kept as it is. A database that cannot be read is
reported in one line with its path and left untouched for the operator;
nothing is ever silently reset.

Must not decide anything: the slice manager does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import time
import zlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hvgpu.errors import HvgpuError
from hvgpu.host.names import MAX_VGPUS, BadVmName, VgpuKey, check_vm_name
from hvgpu.units import BadValue, check_region_size

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
    region INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (vm, device)
);
CREATE TABLE IF NOT EXISTS sums (
    vm TEXT NOT NULL,
    device INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    PRIMARY KEY (vm, device)
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""
# The first release's table (one slice per VM), moved into vgpus as device 0.
_MIGRATE_V1 = """
INSERT INTO vgpus (vm, device, gpu_uuid, gpu_index, mem, compute, cid, created, updated)
SELECT vm, 0, gpu_uuid, gpu_index, mem, compute, cid, created, updated FROM slices;
DROP TABLE slices;
"""
# Tables written before the region lane lack region: it is added, 0 for every row.
_MIGRATE_REGION = "ALTER TABLE vgpus ADD COLUMN region INTEGER NOT NULL DEFAULT 0"
# Tables written before region had its name call the column shm: renamed in place.
OLD_REGION = "shm"
_RENAME_REGION = f"ALTER TABLE vgpus RENAME COLUMN {OLD_REGION} TO region"
_COLUMNS = ("vm", "gpu_uuid", "gpu_index", "mem", "compute", "cid", "created", "updated",
            "device", "region")
_SELECT = ", ".join(_COLUMNS)
_VALUES = ",".join("?" * len(_COLUMNS))
MAX_CID = 2 ** 32 - 2  # VMADDR_CID_ANY (2^32-1) is no guest's
SIDECAR = "slices.json"


class StateError(HvgpuError):
    """The state directory or file cannot be used: the operator's to fix, so reported
    in one line (expected, as HvgpuError's default)."""

    code = "state"


class StateInUse(StateError):
    code = "agent-running"


LOCK = "agent.lock"


def lock_state_dir(directory: str | os.PathLike):
    """Hold the state directory for this process's life (close the returned file to
    let go); StateInUse when another agent holds it. One agent per state directory:
    two would overwrite each other's slices and remove each other's sockets."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        f = open(os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600),
                 "r+")
    except OSError as exc:
        raise StateError(f"cannot use the state directory {directory}: {exc}") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = f.read().strip() or "unknown"
        f.close()
        raise StateInUse(f"another hvgpu agent (pid {holder}) is running with the state "
                         f"directory {directory}; stop it first, or give this one its own "
                         "--state-dir") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


@dataclass(frozen=True)
class Slice:
    """One vGPU of a VM: a share of one physical GPU. Immutable: a change is a new
    Slice, so whoever holds one holds what was true when it was made (the slice
    manager's is the current one)."""

    vm: str
    gpu_uuid: str
    gpu_index: int
    mem: int  # bytes
    compute: int  # percent of the GPU's SMs; 0: no share reserved (time-shared)
    cid: int | None = None
    created: float = 0.0
    updated: float = 0.0
    device: int = 0  # the guest's device number for it
    region: int = 0  # bytes of its region; 0: none

    @property
    def key(self) -> VgpuKey:
        return VgpuKey(self.vm, self.device)

    def as_dict(self) -> dict:
        return asdict(self)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_row(row: tuple) -> Slice:
    """A stored row as a Slice, or ValueError saying what is wrong with it."""
    vm, gpu_uuid, gpu_index, mem, compute, cid, created, updated, device, region = row
    try:
        check_vm_name(vm)
    except BadVmName as exc:
        raise ValueError(str(exc)) from None
    if not _is_int(device) or not 0 <= device < MAX_VGPUS:
        raise ValueError(f"device {device!r} is not 0..{MAX_VGPUS - 1}")
    if not _is_int(mem) or mem <= 0:
        raise ValueError(f"memory quota {mem!r} is not a positive number of bytes")
    if not _is_int(compute) or not 0 <= compute <= 100:
        raise ValueError(f"compute share {compute!r} is not a percentage 0..100")
    try:
        check_region_size(region)
    except BadValue as exc:
        raise ValueError(f"region {exc}") from None
    if cid is not None and (not _is_int(cid) or not 3 <= cid <= MAX_CID):
        raise ValueError(f"CID {cid!r} is not a guest CID (3..{MAX_CID})")
    if not isinstance(gpu_uuid, str) or not gpu_uuid or len(gpu_uuid) > 128 \
            or not gpu_uuid.isprintable():
        raise ValueError(f"GPU UUID {gpu_uuid!r} is not one")
    if not _is_int(gpu_index) or not 0 <= gpu_index < 4096:
        raise ValueError(f"GPU index {gpu_index!r} is not one")
    for v in (created, updated):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"time stamp {v!r} is not a number")
    return Slice(vm, gpu_uuid, gpu_index, mem, compute, cid, float(created), float(updated),
                 device, region)


def row_crc(row: tuple) -> int:
    # A row without a region sums as rows did before regions existed, so the
    # sums of rows written then still hold (values only: the column's name is in no sum).
    values = list(row[:9]) if row[9] == 0 else list(row)
    return zlib.crc32(json.dumps(values).encode())


def _describe_sqlite(exc: sqlite3.Error) -> str:
    return getattr(exc, "sqlite_errorname", "") or type(exc).__name__


class StateStore:
    """``problems``: what was wrong with the state when it was opened and loaded, one
    line each (the agent logs them at start)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / "slices.db"
        self.sidecar = self.directory / SIDECAR
        self.problems: list[str] = []
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            existed = self.path.exists() and self.path.stat().st_size > 0
            self._check_writable()
            copy = self._read_sidecar()
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("BEGIN IMMEDIATE")  # a write lock, or the reason why not
            self.db.execute("ROLLBACK")
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed ({check})")
            self.db.executescript(SCHEMA)
            self._migrate()
            self._restore(existed, copy)
            self._checkpoint()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        except OSError as exc:
            raise StateError(f"cannot use the state directory {self.directory}: {exc}") from None

    def _read_only(self, what: Path, why: str) -> StateError:
        """What to do about a slice state that this process may not write."""
        try:
            st = what.stat()
            owner = f"it belongs to uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}"
        except OSError:
            owner = "its owner is unknown"
        kind = ("the state directory" if what == self.directory else
                "the slice state" if what == self.path else "SQLite's file")
        holds = (" (it holds slices.db and SQLite's -wal and -shm files beside it)"
                 if what == self.directory else "")
        if why == os.strerror(errno.EROFS):
            return StateError(f"{kind} {what} is on a read-only filesystem{holds}: remount it "
                              "read-write, or give the agent a --state-dir on a writable one")
        return StateError(f"{kind} {what} is read-only for this process (uid {os.geteuid()}; "
                          f"{why}){holds}; {owner}: the agent must write it. Fix its "
                          "permissions (chmod u+w, or chown it to the agent's user), or run "
                          "the agent as its owner")

    def _check_writable(self) -> None:
        # sqlite opens a file it may not write read-only, quietly, and in WAL mode
        # would even take changes into the WAL that never reach the file: ask first
        wal, shm = (self.path.with_name(self.path.name + x) for x in ("-wal", "-shm"))
        for what, flags in ((self.directory, os.O_RDONLY | os.O_DIRECTORY),
                            (self.path, os.O_RDWR), (wal, os.O_RDWR), (shm, os.O_RDWR)):
            try:
                if what == self.directory:
                    if not os.access(what, os.W_OK | os.X_OK):
                        # access() says EROFS and EACCES alike: tell them apart by statvfs
                        ro = os.statvfs(what).f_flag & os.ST_RDONLY
                        raise OSError(errno.EROFS if ro else errno.EACCES,
                                      os.strerror(errno.EROFS if ro else errno.EACCES))
                elif what.exists():
                    os.close(os.open(what, flags))
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise self._read_only(what, exc.strerror) from None
                raise

    def _error(self, exc: sqlite3.Error) -> StateError:
        name = _describe_sqlite(exc)
        if name.startswith("SQLITE_READONLY") or (
                self.path.exists() and not os.access(self.path, os.W_OK)):
            return self._read_only(self.path, str(exc))
        return StateError(f"cannot read the slice state {self.path}: {exc}; it was left as "
                          "it is: restore a backup, or move it aside to start empty (libvirt "
                          "domains get their slices back from their metadata)")

    # -- the sidecar copy -------------------------------------------------------------

    def _read_sidecar(self) -> dict | None:
        try:
            doc = json.loads(self.sidecar.read_text())
            if not (isinstance(doc, dict) and _is_int(doc.get("generation"))
                    and isinstance(doc.get("vgpus"), list)):
                raise ValueError("not a copy of the slice table")
            return doc
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._problem(f"{self.sidecar} cannot be read ({exc}); it is ignored and "
                          "rewritten from the database")
            return None

    def _write_sidecar(self) -> None:
        rows = self.db.execute(f"SELECT {_SELECT} FROM vgpus ORDER BY vm, device").fetchall()
        sums = dict(((vm, d), crc) for vm, d, crc in
                    self.db.execute("SELECT vm, device, crc FROM sums").fetchall())
        doc = {"generation": self._generation(),
               "vgpus": [dict(zip(_COLUMNS, r), crc=sums.get((r[0], r[8]))) for r in rows]}
        tmp = self.sidecar.with_name(SIDECAR + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.sidecar)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _restore(self, existed: bool, copy: dict | None) -> None:
        """Bring back what the database lost from the sidecar copy, saying so."""
        ours = self._generation()
        if copy is None or copy["generation"] <= ours:
            if copy is None or copy["generation"] < ours or not existed:
                self._write_sidecar()
            return
        why = (f"{self.path} was missing or empty" if not existed else
               f"{self.path} is older than {self.sidecar} (change {ours} < "
               f"{copy['generation']}): it lost changes")
        rows, sums = [], []
        for r in copy["vgpus"]:
            if not isinstance(r, dict) or any(c not in r for c in _COLUMNS if c != "region"):
                continue
            # a copy written before region had its name says shm; older ones neither
            region = r.get("region", r.get(OLD_REGION, 0))
            rows.append(tuple(region if c == "region" else r[c] for c in _COLUMNS))
            if r.get("crc") is not None:
                sums.append((r["vm"], r["device"], r["crc"]))
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM vgpus")
            self.db.execute("DELETE FROM sums")
            self.db.executemany(f"INSERT OR REPLACE INTO vgpus ({_SELECT}) VALUES ({_VALUES})",
                                rows)
            self.db.executemany("INSERT OR REPLACE INTO sums VALUES (?,?,?)", sums)
            self._set_generation(copy["generation"])
        names = ", ".join(str(VgpuKey(r[0], r[8])) for r in rows) or "none"
        self._problem(f"{why}: restored {len(rows)} vGPU(s) from {self.sidecar}: {names}")

    # -- reading and writing --------------------------------------------------------------

    def _problem(self, text: str) -> None:
        self.problems.append(text)  # the agent logs them

    def _migrate(self) -> None:
        old = self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                              "name = 'slices'").fetchone()
        if old:  # one transaction: either both steps happen or neither
            self.db.executescript("BEGIN;" + _MIGRATE_V1 + "COMMIT;")
        columns = [r[1] for r in self.db.execute("PRAGMA table_info(vgpus)").fetchall()]
        if OLD_REGION in columns and "region" not in columns:
            self.db.execute(_RENAME_REGION)
        elif "region" not in columns:
            self.db.execute(_MIGRATE_REGION)

    def _generation(self) -> int:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return row[0] if row and _is_int(row[0]) else 0

    def _set_generation(self, value: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('generation', ?)", (value,))

    def _checkpoint(self) -> None:
        # The main file then holds every change: a lost WAL loses nothing.
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def all(self) -> list[Slice]:
        """Every stored vGPU that passes its checks; the others are reported (and
        appended to ``problems``), and left in the file."""
        try:
            rows = self.db.execute(f"SELECT {_SELECT} FROM vgpus ORDER BY vm, device").fetchall()
            sums = {(vm, d): crc for vm, d, crc in
                    self.db.execute("SELECT vm, device, crc FROM sums").fetchall()}
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        out = []
        for row in rows:
            who = f"VM {row[0]!r} device {row[8]!r}"
            try:
                s = check_row(row)
            except ValueError as exc:
                self._problem(f"{who}: the stored row is left out: {exc}")
                continue
            crc = sums.get((s.vm, s.device))
            if crc is not None and crc != row_crc(row):
                self._problem(f"{who}: the stored row is left out: its values do not match "
                              "their checksum (changed outside hvgpu, or damaged)")
                continue
            out.append(s)
        return out

    def put(self, *slices: Slice) -> list[Slice]:
        """Write these vGPUs together: all or none. Returns them as stored (stamped with
        when they were made and changed)."""
        now = time.time()
        rows, stamped = [], []
        for s in slices:
            s = replace(s, updated=now, created=float(s.created or now))
            stamped.append(s)
            row = (s.vm, s.gpu_uuid, s.gpu_index, s.mem, s.compute, s.cid, s.created,
                   s.updated, s.device, s.region)
            try:  # what could not be loaded back is never stored
                check_row(row)
            except ValueError as exc:
                raise StateError(f"refusing to store vGPU {s.device} of {s.vm!r}: {exc}") \
                    from None
            rows.append(row)
        self._change([(f"INSERT OR REPLACE INTO vgpus ({_SELECT}) VALUES ({_VALUES})", rows),
                      ("INSERT OR REPLACE INTO sums VALUES (?,?,?)",
                       [(r[0], r[8], row_crc(r)) for r in rows])])
        return stamped

    def delete(self, vm: str, device: int | None = None) -> None:
        """One vGPU of ``vm``, or all of them."""
        if device is None:
            where, args = "vm = ?", (vm,)
        else:
            where, args = "vm = ? AND device = ?", (vm, device)
        self._change([(f"DELETE FROM vgpus WHERE {where}", [args]),
                      (f"DELETE FROM sums WHERE {where}", [args])])

    def _change(self, steps: list) -> None:
        """One transaction, then the checkpoint and the sidecar copy."""
        try:
            with self.db:
                self.db.execute("BEGIN")
                for sql, rows in steps:
                    self.db.executemany(sql, rows)
                self._set_generation(self._generation() + 1)
            self._checkpoint()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            self._write_sidecar()
        except (OSError, sqlite3.Error) as exc:  # the database has the change: say so, go on
            self._problem(f"cannot write {self.sidecar}: {exc}")

    def close(self) -> None:
        self.db.close()
