import pytest

from hvgpu.errors import AddressError
from hvgpu.virtio.address import VMADDR_CID_ANY, parse_address
from hvgpu.virtio.protocol import DEFAULT_PORT


@pytest.mark.parametrize("text, fields", [
    ("vsock://3:5170", dict(scheme="vsock", cid=3, port=5170)),
    ("vsock://any:9", dict(scheme="vsock", cid=VMADDR_CID_ANY, port=9)),
    ("vsock://host", dict(scheme="vsock", cid=2, port=DEFAULT_PORT)),
    ("unix:///run/hvgpu.sock", dict(scheme="unix", path="/run/hvgpu.sock")),
    ("hvsock:///run/fc/vm1.vsock:5170", dict(scheme="hvsock", path="/run/fc/vm1.vsock", port=5170)),
    ("tcp://10.0.0.5:7000", dict(scheme="tcp", host="10.0.0.5", port=7000)),
    ("tcp://[::1]:7000", dict(scheme="tcp", host="::1", port=7000)),
    ("tcp://127.0.0.1:65535", dict(scheme="tcp", port=65535)),
    ("vsock://3:4294967294", dict(scheme="vsock", port=4294967294)),
])
def test_every_documented_form_parses(text, fields):
    addr = parse_address(text)
    for key, value in fields.items():
        assert getattr(addr, key) == value
    assert parse_address(str(addr)) == addr


def test_hybrid_vsock_guest_connections_arrive_on_path_underscore_port():
    assert parse_address("hvsock:///run/fc/vm1.vsock:52").hvsock_listen_path == "/run/fc/vm1.vsock_52"


@pytest.mark.parametrize("text, words", [
    ("localhost:5170", "use one of"),
    ("unix://relative.sock", "absolute"),
    ("vsock://three:5170", "not a number"),
    ("vsock://3:port", "not a number"),
    ("hvsock:///no-port", "hvsock:///path"),
    ("tcp://:80", "host is missing"),
    ("ftp://x:1", "unknown scheme"),
    ("tcp://h:0", "out of range"),
    ("tcp://127.0.0.1:99999", "a tcp port is 1 to 65535"),  # it listened on 34463
    ("tcp://127.0.0.1:-1", "out of range"),
    ("vsock://3:4294967295", "a vsock port is 1 to 4294967294"),  # bind's any-port
    ("vsock://3:4294967296", "out of range"),
    ("hvsock:///run/fc/vm1.vsock:4294967296", "out of range"),
    ("vsock://4294967296:5170", "CID 4294967296 is out of range"),
    ("vsock://-2:5170", "out of range"),
])
def test_bad_addresses_say_what_is_wrong(text, words):
    with pytest.raises(AddressError) as info:
        parse_address(text)
    assert words in str(info.value)
