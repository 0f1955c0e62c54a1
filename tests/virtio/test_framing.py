import threading

import pytest

from hvgpu.errors import ConnectionLost, ProtocolError
from hvgpu.virtio import protocol as P
from hvgpu.virtio.framing import FrameReader, PeerClosed, pack_header, send_frame
from hvgpu.virtio.transport import socket_pair


@pytest.fixture
def pair():
    a, b = socket_pair()
    yield a, b
    a.close()
    b.close()


def test_many_small_frames_and_a_payload(pair):
    a, b = pair

    def send():
        for seq in range(1, 100):
            send_frame(a, 0x02, P.FLAG_ONEWAY, seq, 0, b"body%d" % seq)
        send_frame(a, 0x24, 0, 100, 0, b"", payload=bytes(range(256)) * 1000)

    sender = threading.Thread(target=send)
    sender.start()
    reader = FrameReader(b, bufsize=4096)
    for seq in range(1, 100):
        hdr, body = reader.read_frame()
        assert (hdr.seq, bytes(body)) == (seq, b"body%d" % seq)
    hdr, _ = reader.read_frame()
    assert hdr.payload_len == 256000
    dest = bytearray(256000)
    reader.read_payload_into(dest)
    sender.join()
    assert dest == bytes(range(256)) * 1000


def test_large_payload_streams_into_its_destination(pair):
    a, b = pair
    data = bytes(range(256)) * (64 << 12)  # 64 MiB
    t = threading.Thread(target=send_frame, args=(a, 0x24, 0, 1, 0, b"", data))
    t.start()
    reader = FrameReader(b)
    hdr, _ = reader.read_frame()
    dest = bytearray(hdr.payload_len)
    reader.read_payload_into(dest)
    t.join()
    assert dest == data


def test_clean_close_between_frames_is_peer_closed(pair):
    a, b = pair
    a.close()
    with pytest.raises(PeerClosed):
        FrameReader(b).read_frame()


def test_truncated_header_is_connection_lost(pair):
    a, b = pair
    a.sendall(pack_header(0x02, 0, 1, 0, 0)[:10])
    a.close()
    with pytest.raises(ConnectionLost, match="mid-frame"):
        FrameReader(b).read_frame()


def test_truncated_payload_is_connection_lost(pair):
    a, b = pair
    a.sendall(pack_header(0x24, 0, 1, 0, 0, 1000) + b"x" * 10)
    a.close()
    reader = FrameReader(b)
    reader.read_frame()
    with pytest.raises(ConnectionLost, match="mid-payload"):
        reader.read_payload_into(bytearray(1000))


def test_bad_magic_is_a_protocol_error(pair):
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 8)
    with pytest.raises(ProtocolError, match="magic"):
        FrameReader(b).read_frame()


def test_oversize_body_and_payload_are_refused_before_reading(pair):
    a, b = pair
    a.sendall(P.HEADER.pack(P.MAGIC, 1, 0, 2, 0, 1, 0, P.MAX_BODY + 1, 0, 0))
    with pytest.raises(ProtocolError) as info:
        FrameReader(b).read_frame()
    assert info.value.code == "oversize"
    a.sendall(P.HEADER.pack(P.MAGIC, 1, 0, 2, 0, 1, 0, 0, 0, P.MAX_PAYLOAD + 1))
    with pytest.raises(ProtocolError) as info:
        FrameReader(b).read_frame()
    assert info.value.code == "oversize"


def test_a_vsock_socket_takes_the_silence_timeout():
    # Python hands an AF_VSOCK socket's option values to the kernel as 64-bit integers;
    # the timeout is a struct timeval (found in a real guest, where the guest API failed).
    import os
    import socket
    import struct

    from hvgpu.virtio.framing import set_silence_timeout

    try:
        sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (AttributeError, OSError) as exc:
        pytest.skip(f"no AF_VSOCK sockets here: {exc}")
    with sock:
        set_silence_timeout(sock, 2.5)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, os.dup(sock.fileno())) as alias:
            for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                got = alias.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("ll"))
                assert struct.unpack("ll", got) == (2, 500000)
