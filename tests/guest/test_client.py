"""Where the guest finds each of its VM's vGPUs (hvgpu/guest/client.py)."""

from __future__ import annotations

import pytest

from hvgpu.errors import AddressError
from hvgpu.guest.client import default_address


@pytest.mark.parametrize("env, device, expected", [
    (None, 0, "vsock://2:5170"),
    (None, 1, "vsock://2:5171"),  # the agent listens at the data lane's port + N
    ("vsock://2:6000", 3, "vsock://2:6003"),
    ("tcp://10.0.0.1:7000", 1, "tcp://10.0.0.1:7001"),
    ("hvsock:///run/vm1.vsock:5170", 1, "hvsock:///run/vm1.vsock:5171"),
    ("unix:///run/a.sock, unix:///run/b.sock", 1, "unix:///run/b.sock"),
    ("unix:///run/a.sock", 0, "unix:///run/a.sock"),
])
def test_vgpu_n_is_found_by_port_or_by_list(monkeypatch, env, device, expected):
    if env is None:
        monkeypatch.delenv("HVGPU_AGENT", raising=False)
    else:
        monkeypatch.setenv("HVGPU_AGENT", env)
    assert str(default_address(device)) == expected


def test_a_unix_socket_names_no_second_device(monkeypatch):
    monkeypatch.setenv("HVGPU_AGENT", "unix:///run/a.sock")
    with pytest.raises(AddressError, match="no address for device 1: list one address per"):
        default_address(1)
