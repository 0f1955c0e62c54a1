#!/bin/sh
# Runs in the guest of the libvirt VM test (busybox sh): installs hvgpu from its wheel
# as a user would, asks the host to attach a slice (hvgpu attach DOMAIN), uses it over
# AF_VSOCK, then asks for the slice to be detached and sees the refusal. Same
# VMOUT/VMTEST/VMWANT lines as guest_test.sh.
step() {
    name=$1; shift
    "$@" > /tmp/step.out 2>&1
    rc=$?
    sed "s/^/VMOUT $name /" /tmp/step.out
    echo "VMTEST $name rc=$rc"
    return $rc
}
until_ok() {
    tries=$1; shift
    while [ "$tries" -gt 0 ]; do
        "$@" > /dev/null 2>&1 && return 0
        tries=$((tries - 1)); sleep 0.5
    done
    return 1
}
# Blocks until the host connects to vsock port $1 and sends a line.
host_says() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
s.bind((socket.VMADDR_CID_ANY, int(sys.argv[1])))
s.listen(1)
c, _ = s.accept()
print(c.recv(64).decode().strip())
c.close()
PY
}
cd /tmp
# No network: from hvgpu's wheel and its dependencies' (click), all in /opt/wheels
install() {
    python3 -m venv --without-pip /opt/hvgpu &&
    /opt/hvgpu/bin/python /opt/wheels/pip.whl/pip install --no-index --find-links /opt/wheels \
        --no-cache-dir --disable-pip-version-check --root-user-action=ignore /opt/wheels/hvgpu-*.whl
}
step install install || { echo "VMTEST done rc=1"; exit 1; }
export PATH=/opt/hvgpu/bin:$PATH
echo "VMWANT attach"
until_ok 240 hvgpu-guest info
step info hvgpu-guest info
step smi hvgpu-guest smi
echo "VMWANT detach"
step detached_said host_says 1236
step detached hvgpu-guest info
echo "VMTEST done rc=0"
