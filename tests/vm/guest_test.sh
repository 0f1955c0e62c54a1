#!/bin/sh
# Runs in the guest (busybox sh): installs hvgpu from its wheel as a user would, then
# each step of the VM tests. A step's output comes back as "VMOUT <step> <line>" and
# its exit status as "VMTEST <step> rc=<n>"; "VMWANT <what>" asks the host to act.
step() {
    name=$1; shift
    "$@" > /tmp/step.out 2>&1
    rc=$?
    sed "s/^/VMOUT $name /" /tmp/step.out
    echo "VMTEST $name rc=$rc"
    return $rc
}
# Waits (up to $2 half-seconds) until a command succeeds.
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
# Debian's python is externally managed (PEP 668): a venv, as pip itself advises.
# No network: from hvgpu's wheel and its dependencies' (click), all in /opt/wheels
install() {
    python3 -m venv --without-pip /opt/hvgpu &&
    /opt/hvgpu/bin/python /opt/wheels/pip.whl/pip install --no-index --find-links /opt/wheels \
        --no-cache-dir --disable-pip-version-check --root-user-action=ignore /opt/wheels/hvgpu-*.whl
}
step install install
export PATH=/opt/hvgpu/bin:$PATH
# The region device (ivshmem-plain): mapped by root, then by an ordinary user,
# refused before `hvgpu-guest install` gives group hvgpu its resource2 and served
# after. This minimal guest has no useradd or groupadd: the user and the group are
# written as those tools (and `usermod -aG hvgpu cuda`) would write them.
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'cuda:x:1000:1000:a CUDA user:/tmp:/bin/sh' \
    >> /etc/passwd
printf '%s\n' 'root:x:0:' 'cuda:x:1000:' 'hvgpu:x:990:cuda' >> /etc/group
REGION="/opt/hvgpu/bin/python /opt/tests/guest_region.py /opt/tests/region-token"
step region $REGION root
step region_shim $REGION shim
step region_denied $REGION user cuda
step region_install hvgpu-guest install
step region_user $REGION user cuda
step noslice hvgpu-guest info
echo "VMWANT attach"
until_ok 240 hvgpu-guest info
step info hvgpu-guest info
step smi hvgpu-guest smi
step api /opt/hvgpu/bin/python /opt/tests/guest_api.py
step region_api /opt/hvgpu/bin/python /opt/tests/guest_region_api.py
step cuda hvgpu-guest run -- /opt/programs/saxpy_static
# The agent restarts under a running program: its next call fails, the next program works.
mkfifo /tmp/go
(hvgpu-guest run -- /opt/programs/agent_loss < /tmp/go > /tmp/loss.out 2>&1;
 echo "exit $?" >> /tmp/loss.out) &
exec 3> /tmp/go
until_ok 240 grep -q "first:" /tmp/loss.out
echo "VMWANT restart"
step restarted host_says 1235
echo go >&3
exec 3>&-
wait
step loss cat /tmp/loss.out
until_ok 240 hvgpu-guest info
step after hvgpu-guest run -- /opt/programs/saxpy_static
echo "VMTEST done rc=0"
