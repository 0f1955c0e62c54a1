"""How the agent and its executors write their log lines: text, journal or JSON.

* ``text`` (a terminal): ``TIME SOURCE LEVEL message``, as before.
* ``journal`` (under systemd, whose journal adds the time itself): no time of
  our own, and each line starts with the sd-daemon priority prefix ``<N>``
  (journald takes it for the entry's priority, so ``journalctl -p warning``
  and colours work; a traceback keeps its priority on every line).
* ``json`` (log collectors): one object per line with ``time`` (UTC, ISO 8601),
  ``level``, ``logger``, ``source`` (agent or which executor), ``message``, the
  record's extra fields where present, and ``exception`` for a traceback.

``auto`` is ``journal`` when stderr is the stream systemd's ``$JOURNAL_STREAM``
names, else ``text``. The agent resolves it once and passes the concrete
format to its executors (they write to the agent's stderr).

What a guest controls must not fill the host's disk through the journal: a
guest-supplied string goes into a line through :func:`clip` (escaped, 120
characters at most, its length said), no message is longer than LINE_MAX,
and :class:`PerVm` lets through at most VM_LINES lines about one VM in
VM_SECONDS, saying how many it held back. :class:`Budget` is the counter
beneath (a listener whose accept keeps failing uses one too). Must not decide
what is logged or at which level.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict

FORMATS = ("auto", "text", "journal", "json")
LINE_MAX = 4096  # characters of one message; the rest is cut and its length said
GUEST_TEXT_MAX = 120  # characters of one guest-supplied string in a line (clip)
# Lines about one VM, whatever their level: a burst of VM_LINES, then one every
# VM_SECONDS / VM_LINES seconds (a busy VM writes about three lines per program).
VM_LINES, VM_SECONDS = 60, 60.0
# sd-daemon(3) priorities: syslog's numbers
PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
            logging.CRITICAL: 2}
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


def under_journal(stream=None, environ=None) -> bool:
    """True when ``stream`` (stderr) is connected to the journal: systemd sets
    ``JOURNAL_STREAM=DEV:INODE`` of the stream it gave the service, which a child
    whose stderr was redirected no longer matches."""
    environ = os.environ if environ is None else environ
    value = environ.get("JOURNAL_STREAM", "")
    stream = sys.stderr if stream is None else stream
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def resolve(fmt: str, stream=None, environ=None) -> str:
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "auto":
        return "journal" if under_journal(stream, environ) else "text"
    return fmt


def priority(levelno: int) -> int:
    for level in sorted(PRIORITY, reverse=True):
        if levelno >= level:
            return PRIORITY[level]
    return 7


class Formatter(logging.Formatter):
    """One of FORMATS' lines for records of ``source`` (``agent``, ``executor[...]``)."""

    def __init__(self, fmt: str, source: str):
        super().__init__()
        self.fmt = resolve(fmt)
        self.source = source

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if len(message) > LINE_MAX:  # whatever a caller forgot to clip
            message = f"{message[:LINE_MAX]}... (cut: {len(message)} characters)"
        if self.fmt == "json":
            return self._json(record, message)
        text = f"{self.source} {record.levelname} {message}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        if self.fmt == "journal":
            prefix = f"<{priority(record.levelno)}>"
            return "\n".join(prefix + line for line in text.split("\n"))
        return f"{self.formatTime(record)} {text}"

    def _json(self, record: logging.LogRecord, message: str) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        obj = {"time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname,
               "logger": record.name, "source": self.source, "message": message}
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_") and key not in obj:
                obj[key] = value
        if record.exc_info:
            obj["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        return json.dumps(obj, default=str, ensure_ascii=False)


def clip(text, most: int = GUEST_TEXT_MAX) -> str:
    """A string a guest chose, for a log line: its repr (quoted, control characters
    escaped, so it stays one line and forges none), of its first ``most``
    characters, and its length when it had more."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}... ({len(text)} characters)"


class PerVm(logging.Filter):
    """At most VM_LINES lines about one VM in VM_SECONDS (a :class:`Budget` per VM),
    whatever their level: a guest that connects, errs or faults in a loop must not
    flood the host's log. A record is about a VM when it carries ``vm``
    (``extra={"vm": name}``) or one of its arguments is a vGPU key (a tuple with a
    ``vm``, names.VgpuKey); in an executor, ``about`` names the VM (or host-local
    peer) of every record. The first line let through after some were held back
    says how many."""

    def __init__(self, about: str | None = None, budget: Budget | None = None):
        super().__init__()
        self.about = about
        self.budget = budget or Budget(VM_LINES, VM_SECONDS)

    def filter(self, record: logging.LogRecord) -> bool:
        vm = getattr(record, "vm", None) or _vm_of(record.args) or self.about
        if vm is None:
            return True
        dropped = self.budget.take(vm)
        if dropped is None:
            return False
        if dropped:
            record.msg = (f"{record.getMessage()} [{dropped} lines about {vm} suppressed "
                          f"before this one: {self.budget.lines} in {self.budget.per:g} s "
                          "at most]")
            record.args = None
        return True


def _vm_of(args) -> str | None:
    if isinstance(args, tuple):
        for arg in args:
            if isinstance(arg, tuple) and isinstance(getattr(arg, "vm", None), str):
                return arg.vm
    return None


def handler(fmt: str, source: str, stream=None, about: str | None = None) -> logging.Handler:
    """The handler ``setup`` installs: FORMATS' lines, at most VM_LINES about a VM in
    VM_SECONDS (``about``: the VM of every record, in an executor)."""
    stream = sys.stderr if stream is None else stream
    h = logging.StreamHandler(stream)
    h.setFormatter(Formatter(resolve(fmt, stream), source))
    h.addFilter(PerVm(about))
    return h


def setup(level: str, fmt: str, source: str, stream=None, about: str | None = None) -> str:
    """Log to ``stream`` (stderr) in ``fmt`` at ``level``, unless logging is set up
    already (a test harness); returns the concrete format."""
    stream = sys.stderr if stream is None else stream
    h = handler(fmt, source, stream, about)
    logging.basicConfig(level=level.upper(), handlers=[h])
    return h.formatter.fmt


class Budget:
    """At most ``lines`` lines per key in any ``per`` seconds, as a token bucket: a
    burst of ``lines``, then one line every ``per / lines`` seconds. :meth:`take` says
    whether a line may be written and how many of that key's were dropped since its
    last one, so the line that is written can say so. Thread-safe; it remembers
    ``keys`` keys at most (the longest unused is forgotten: a peer naming itself anew
    each time gets a fresh budget, never unbounded memory)."""

    def __init__(self, lines: int, per: float, keys: int = 1024, clock=time.monotonic):
        self.lines, self.per, self.keys, self.clock = lines, per, keys, clock
        self._state: OrderedDict = OrderedDict()  # key -> [tokens, when, dropped]
        self._lock = threading.Lock()

    def take(self, key) -> int | None:
        """None: drop this line; else the number dropped before it (0 mostly)."""
        now = self.clock()
        with self._lock:
            state = self._state.get(key)
            if state is None:
                state = self._state[key] = [float(self.lines), now, 0]
                while len(self._state) > self.keys:
                    self._state.popitem(last=False)
            else:
                self._state.move_to_end(key)
                state[0] = min(float(self.lines),
                               state[0] + (now - state[1]) * self.lines / self.per)
                state[1] = now
            if state[0] < 1.0:
                state[2] += 1
                return None
            state[0] -= 1.0
            dropped, state[2] = state[2], 0
            return dropped
