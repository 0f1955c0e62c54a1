"""A lying host for the guest's NVML library: a unix-socket server that answers
HELLO properly and every other op with what the test says (any bytes)."""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

from hvgpu.virtio import codec
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import pack_header

HDR = P.HEADER


def _recv(sock, n):
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


class LyingAgent:
    def __init__(self, path: str, answers: dict):
        """answers: op name -> callable(nth call, body) -> reply body bytes (or (delay, bytes))"""
        self.path, self.answers = path, answers
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self):
        return "unix://" + self.path

    def _accept(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                h = HDR.unpack(_recv(conn, HDR.size))
                magic, ver, flags, op, _, seq, status, body_len, _, payload_len = h
                body = _recv(conn, body_len) if body_len else b""
                if payload_len:
                    _recv(conn, payload_len)
                name = P.OPS_BY_CODE[op].name
                if flags & P.FLAG_ONEWAY:
                    continue
                if name == "HELLO":
                    with self.lock:
                        self.runs = getattr(self, "runs", 0) + 1
                        self.calls = {}  # counted per connection (one per test process)
                    rep = codec.REPLY[op].encode((P.VERSION, 0, P.CAP_MONITOR | P.CAP_PROGRESS,
                                                  1 << 20, 1 << 16, "lying", "lying"))
                else:
                    with self.lock:
                        n = self.calls[name] = self.calls.get(name, 0) + 1
                    answer = self.answers[name](n, body)
                    if isinstance(answer, tuple):
                        time.sleep(answer[0])
                        answer = answer[1]
                    rep = answer
                conn.sendall(pack_header(op, P.FLAG_REPLY, seq, 0, len(rep)) + rep)
        except (EOFError, OSError, KeyError):
            conn.close()

    def close(self):
        self.srv.close()
