"""The supervisor: starts, retires, ends and reaps executor processes.

A vGPU's executor is started with its slice's limits (an MPS client with the
slice's memory limit and compute share when MPS runs) and an executor lane
(a SOCK_SEQPACKET pair) that the agent's loop watches; a host-local
connection gets an executor of its own with the whole GPU. An executor
whose lane ended is kept in ``ending`` until its exit is collected, and killed
if it lingers.

Must not decide which guest goes where (router.py) or answer an executor's
messages (agent.py), and never waits on an executor: the loop must not stall.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from typing import Callable

from hvgpu.host.executor import messages
from hvgpu.host.spawn import Launcher
from hvgpu.host.mps import MpsDaemon
from hvgpu.host.registry import Executor, SliceExecutor, VgpuRecord
from hvgpu.virtio.transport import control_pair, send_message

log = logging.getLogger("hvgpu.host.agent")

ENDING_GRACE = 30.0  # an executor whose channel ended exits by itself well within this


class Supervisor:
    def __init__(self, config, launcher: Launcher, mps: MpsDaemon,
                 watch: Callable[[object, SliceExecutor], None],
                 unwatch: Callable[[object], None]):
        self.config = config
        self.launcher = launcher
        self.mps = mps
        self._watch, self._unwatch = watch, unwatch
        self.whole: dict[int, Executor] = {}  # pid -> executor of a host-local connection
        self.released: list[SliceExecutor] = []  # lane shut down by us, not yet closed
        self.ending: list[SliceExecutor] = []  # lane closed, process not yet reaped

    # -- starting ------------------------------------------------------------------

    def start_whole(self, fd: int, peer: str) -> Executor:
        proc = self._start(fd, ["--fd", str(fd), "--peer", peer, "--gpu", str(self.config.gpu),
                                "--region", str(self.config.local_region)], {})
        ex = self.whole[proc.pid] = Executor(proc, peer, time.monotonic())
        return ex

    def start_slice(self, record: VgpuRecord) -> SliceExecutor:
        """A new current executor for the vGPU."""
        s, key = record.slice, record.key
        ours, theirs = control_pair()
        # The agent never waits on an executor: one that asks and reads none of the
        # answers fills its channel, and is then killed instead of stopping every VM.
        ours.setblocking(False)
        env = {"CUDA_VISIBLE_DEVICES": s.gpu_uuid}
        if self.mps.running:
            env.update(self.mps.client_env(s.mem, s.compute))
        try:
            proc = self._start(theirs.fileno(), [
                "--control-fd", str(theirs.fileno()), "--vm", key.vm, "--vgpu", str(key.device),
                "--compute", str(s.compute), "--region", str(s.region), "--gpu", "0"],
                env, vm=key.vm)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        record.generations += 1
        ex = SliceExecutor(key, proc, ours, record.generations, s.mem, s.compute,
                           self.mps.running, record=record)
        record.current = ex
        self._watch(ours, ex)
        log.info("slice %s: executor pid %d (generation %d) on %s, %d MiB%s", key, proc.pid,
                 ex.generation, s.gpu_uuid, s.mem >> 20,
                 f", {s.compute}% of the SMs (MPS)" if self.mps.running and s.compute else "")
        return ex

    def _start(self, fd: int, args: list[str], env: dict, vm: str | None = None):
        """An executor process inheriting ``fd``, with the agent's common options; ``vm``:
        whose cache directory it gets (None: a host-local one)."""
        config = self.config
        args = [*args, "--log-level", config.log_level, "--log-format", config.log_format,
                "--confine", config.confine]
        args += ["--gpu-locks", str(self.launcher.gpu_locks)]
        cache = self.launcher.cache_for(vm)
        if cache:
            args += ["--cache-dir", cache]
        if config.device:
            args += ["--device", config.device]
        for flag, paths in (("--allow-read", config.executor_read),
                            ("--allow-write", config.executor_write)):
            for path in paths:
                args += [flag, path]
        return self.launcher.popen(args, fd, self.launcher.environment(config.env, env))

    # -- ending --------------------------------------------------------------------

    def retire(self, record: VgpuRecord | None, ex: SliceExecutor) -> None:
        """New connections of its vGPU go to a new executor; this one ends with its last."""
        if ex.retiring:
            return
        ex.retiring = True
        if record is not None and record.current is ex:
            record.current = None
            record.retiring.append(ex)
        try:
            send_message(ex.ctrl, messages.encode(messages.RETIRE))
        except OSError:
            pass

    def end(self, record: VgpuRecord) -> None:
        """Every executor of the vGPU sees the end of its lane (its guests are
        disconnected); each is collected as its channel ends."""
        for ex in record.executors():
            try:
                ex.ctrl.shutdown(2)
            except OSError:
                pass
        self.released += record.executors()
        record.current, record.retiring = None, []

    def gone(self, record: VgpuRecord | None, ex: SliceExecutor) -> int:
        """Its lane ended: forget it now, collect its exit in reap(); returns what it
        held of its vGPU's ledger."""
        self._unwatch(ex.ctrl)
        ex.ctrl.close()
        freed = 0
        if record is not None:
            if record.current is ex:
                record.current = None
            if ex in record.retiring:
                record.retiring.remove(ex)
            freed = record.ledger.drop(ex)
        if ex in self.released:
            self.released.remove(ex)
        ex.gone = time.monotonic()
        self.ending.append(ex)
        return freed

    @staticmethod
    def kill(ex) -> None:
        try:
            ex.process.kill()
        except OSError:
            pass

    def reap(self) -> None:
        for sx in list(self.ending):
            code = sx.process.poll()
            if code is None:
                # its reservations are released already: it must not keep serving
                if time.monotonic() - sx.gone > ENDING_GRACE:
                    log.warning("slice %s: executor pid %d did not exit after its channel "
                                "ended; killed", sx.key, sx.process.pid)
                    sx.process.kill()
                continue
            self.ending.remove(sx)
            log.log(logging.INFO if code == 0 else logging.WARNING,
                    "slice %s: executor pid %d ended with %s", sx.key, sx.process.pid,
                    describe_exit(code))
        for pid, ex in list(self.whole.items()):
            code = ex.process.poll()
            if code is None:
                continue
            del self.whole[pid]
            took = time.monotonic() - ex.started
            if code == 0:
                log.info("executor pid %d for %s finished after %.1fs", pid, ex.peer, took)
            else:
                log.warning("executor pid %d for %s exited with %s after %.1fs; its GPU "
                            "resources went with it", pid, ex.peer, describe_exit(code), took)

    def shutdown(self, executors: list[SliceExecutor]) -> None:
        """Every executor ends: slice executors on the end of their lane, host-local ones
        on SIGTERM; any still running after a grace is killed."""
        for ex in executors + self.released + self.ending:
            self._unwatch(ex.ctrl)
            ex.ctrl.close()
            try:
                ex.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ex.process.kill()
                ex.process.wait()
        self.released.clear()
        self.ending.clear()
        for ex in self.whole.values():
            if ex.process.poll() is None:
                ex.process.terminate()
        deadline = time.monotonic() + 5
        for ex in self.whole.values():
            try:
                ex.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ex.process.kill()
                ex.process.wait()
        self.whole.clear()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"
