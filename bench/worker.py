"""A benchmark process driven one command at a time over its stdin and stdout.

Where a side of a comparison must be its own process (a CUDA program natively and
through the shim, a training workload with its framework loaded once), the runner
starts it, lets it warm up, and then asks it for one timed window at a time, so that
native and hvgpu windows can alternate without paying a process start per window.

The protocol is lines of text. Set up and warm, the process prints one JSON object:
``{"ready": true, ...}`` (or ``{"error": "..."}``). Then, for each command it reads:

    window ROW SEED SECONDS   one timed window of ROW (see bench/pairs.py), fresh data
                              drawn from SEED; answers {"ops", "seconds", "check", ...}
    finish STEPS              (training workloads) catch up to STEPS, answer the checks
    quit                      exit

Every answer is one JSON line; {"error": ...} says the command failed. Only stdout
lines that begin with "{" are protocol: whatever else a library prints there goes to
the process's log with its stderr, which is kept for the run's record.

The runner's half is Worker; serve() is the process's half, for workers in Python
(bench/shim_bench.cu speaks the same protocol in C). Must not import CUDA or hvgpu.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable

# Warm-up may compile (torch.compile, XLA) beside everything else; a worker still silent
# after this is stuck, and waiting longer would spend the GPU machine's time on nothing.
READY_TIMEOUT = 480.0


class WorkerFailed(Exception):
    pass


class Worker:
    """One process that speaks the protocol; its stdout and stderr go to ``log``."""

    def __init__(self, name: str, cmd: list[str], env: dict | None = None,
                 cwd: Path | str | None = None, log: Path | None = None):
        self.name, self.cmd, self.env, self.cwd = name, cmd, env, cwd
        if log is None:
            fd, path = tempfile.mkstemp(prefix=f"hvgpu-bench-{name}-", suffix=".log")
            os.close(fd)
            log = Path(path)
        self.log = Path(log)
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}  # its ready line
        self._replies: queue.Queue = queue.Queue()
        self._out = None

    def start(self) -> "Worker":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.log, "a", buffering=1)
        self._out.write(f"$ {' '.join(self.cmd)}\n")
        err = open(self.log, "a")
        try:
            # Its own session: a timeout ends the whole group (compile workers included).
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=self.env, cwd=self.cwd, text=True,
                                         bufsize=1, start_new_session=True)
        finally:
            err.close()
        threading.Thread(target=self._read, daemon=True, name=f"{self.name}-stdout").start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._out.write(line)
            if line.startswith("{"):
                self._replies.put(line)
        self._replies.put(None)

    def ready(self, timeout: float = READY_TIMEOUT) -> dict:
        self.info = self._reply(timeout, "to get ready")
        return self.info

    def ask(self, command: str, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise WorkerFailed(self._ended())
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerFailed(self._ended()) from None
        return self._reply(timeout, f"to answer {command!r}")

    def window(self, row: str, seed: int, seconds: float) -> dict:
        return self.ask(f"window {row} {seed} {seconds!r}", timeout=20 * seconds + 120)

    def _reply(self, timeout: float, what: str) -> dict:
        try:
            line = self._replies.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise WorkerFailed(f"{self.name} took more than {timeout:.0f} s {what} and was "
                               f"ended; its log: {self.log}\n{self.tail()}") from None
        if line is None:
            raise WorkerFailed(self._ended())
        try:
            reply = json.loads(line)
        except ValueError:
            raise WorkerFailed(f"{self.name} answered {line.strip()[:200]!r}") from None
        if "error" in reply:
            raise WorkerFailed(f"{self.name}: {reply['error']}")
        return reply

    def _ended(self) -> str:
        try:
            status = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            status = "unknown"
        tail = self.tail()
        last = next((x.strip() for x in reversed(tail.splitlines()) if x.strip()), "")
        return (f"{self.name} exited with status {status}: {last[:300]} (its log: {self.log})"
                f"\n{tail}")

    def tail(self, n: int = 3000) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return text[-n:]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()

    def close(self, timeout: float = 30.0) -> None:
        """Ask it to quit; end its group if it does not."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=timeout)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.kill()
        for f in (self.proc.stdin,):
            try:
                f.close()
            except OSError:
                pass


def serve(commands: dict[str, Callable[..., dict]], ready: dict, stdin=None, stdout=None) -> None:
    """The process's half: say ready, then answer each command with one JSON line.

    A command's exception is answered as {"error": ...} (its traceback to stderr) and
    the process goes on: one failed window fails its row, not the run.
    """
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    print(json.dumps({"ready": True, **ready}), file=stdout, flush=True)
    for line in stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        fn = commands.get(words[0])
        if fn is None:
            reply = {"error": f"unknown command {words[0]!r}"}
        else:
            try:
                reply = fn(*words[1:])
            except Exception as exc:  # reported to the runner, which fails the row
                traceback.print_exc()
                reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), file=stdout, flush=True)
