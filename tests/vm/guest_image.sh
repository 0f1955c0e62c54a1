#!/usr/bin/env bash
# Builds (once, cached) what a real Linux guest for hvgpu's VM tests is made of:
# Debian bookworm's cloud kernel, an initramfs with busybox and the host's Debian
# python3.11 (no hvgpu: each boot adds it as an overlay), and rust-vmm's
# vhost-device-vsock, the vhost-user backend that gives a TCG guest AF_VSOCK to the
# host as hybrid-vsock unix sockets. vhost-device-vsock is packaged only in Debian's
# unstable suite: it is fetched with a private apt index, the system's sources are
# left as they are.
#
#   tests/vm/guest_image.sh [CACHE]     (default: $HVGPU_VM_CACHE or ~/.cache/hvgpu-vm)
#
# Prints the cache directory on success. Exit 3, with one line on stderr, when
# something it needs cannot be had here (the tests then skip); any other failure is
# a bug. Needs root only to apt-get install what is missing (qemu, python3.11).
set -euo pipefail
C=${1:-${HVGPU_VM_CACHE:-$HOME/.cache/hvgpu-vm}}
mkdir -p "$C"
C=$(cd "$C" && pwd)
unavailable() { echo "guest image: $*" >&2; exit 3; }
say() { echo "[guest image] $*" >&2; }
MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci vsock
         vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport"
PY=/usr/bin/python3.11
STAMP="v1 $(uname -m) $(stat -c %Y "$PY" 2>/dev/null || echo none)"

if [ -f "$C/ready" ] && [ "$(cat "$C/ready")" = "$STAMP" ]; then
    echo "$C"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
need=""
command -v qemu-system-x86_64 >/dev/null || need="$need qemu-system-x86"
[ -x "$PY" ] || need="$need python3.11"
if [ -n "$need" ]; then
    [ "$(id -u)" = 0 ] || unavailable "needs$need installed (run as root to install it)"
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $need >/dev/null \
        || unavailable "could not install$need"
fi

mkdir -p "$C/debs"
cd "$C/debs"
kernel_package() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}
KPKG=$(kernel_package)
if [ -z "$KPKG" ] && [ "$(id -u)" = 0 ]; then  # a fresh machine's apt index may be empty
    apt-get update -q >/dev/null 2>&1 || true
    KPKG=$(kernel_package)
fi
[ -n "$KPKG" ] || unavailable "no linux-image-cloud-amd64 in this machine's apt index"
[ -n "$(ls "$KPKG"_*.deb 2>/dev/null)" ] || apt-get download -q "$KPKG" >/dev/null 2>&1 \
    || unavailable "could not download $KPKG"
[ -n "$(ls busybox-static_*.deb 2>/dev/null)" ] || apt-get download -q busybox-static >/dev/null 2>&1 \
    || unavailable "could not download busybox-static"
if [ -z "$(ls vhost-device-vsock_*.deb 2>/dev/null)" ]; then
    A=$C/apt-sid
    mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
    touch "$A/status"
    MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$MIRROR" ] || unavailable "no Debian mirror found in the apt sources"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR sid main" \
        > "$A/sources.list"
    SID=(-o Dir::Etc::sourcelist="$A/sources.list" -o Dir::Etc::sourceparts=/nonexistent
         -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" -o Dir::State::status="$A/status")
    apt-get "${SID[@]}" update -q >/dev/null 2>&1 \
        || unavailable "cannot read Debian unstable's index from $MIRROR (vhost-device-vsock is only there)"
    apt-get "${SID[@]}" download -q vhost-device-vsock >/dev/null 2>&1 \
        || unavailable "cannot download vhost-device-vsock from Debian unstable"
fi
cd "$C"
rm -rf kernel busybox vdv root
dpkg -x debs/"$KPKG"_*.deb kernel
dpkg -x debs/busybox-static_*.deb busybox
dpkg -x debs/vhost-device-vsock_*.deb vdv
grep -qx 'CONFIG_VIRTIO_VSOCKETS=m' kernel/boot/config-* || unavailable "$KPKG lacks virtio-vsock"
ln -sf "$(ls "$C"/kernel/boot/vmlinuz-* | head -1)" "$C/vmlinuz"
ln -sf "$C/vdv/usr/bin/vhost-device-vsock" "$C/vhost-device-vsock"
ln -sf "$C/busybox/bin/busybox" "$C/busybox-bin"
"$C/vhost-device-vsock" --help >/dev/null || unavailable "vhost-device-vsock does not run here"

# The initramfs: busybox, the virtio/vsock modules, python3.11 and its libraries.
R=$C/root
mkdir -p "$R"/{bin,dev,proc,sys,tmp,run,etc,lib/modules,lib64,usr/bin,usr/lib,usr/local/bin}
cp "$C/busybox/bin/busybox" "$R/bin/busybox"
for m in $MODULES; do
    f=$(find kernel/lib/modules -name "$m.ko" | head -1)
    [ -n "$f" ] || unavailable "$KPKG has no module $m"
    cp "$f" "$R/lib/modules/"
done
cat > "$R/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys
mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
         vsock vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport; do
    insmod /lib/modules/$m.ko || echo "insmod $m failed"
done
export PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp
echo "GUEST-READY uptime=$(cut -d' ' -f1 /proc/uptime)"
if [ -x /guest-test.sh ]; then /guest-test.sh; echo "GUEST-EXIT rc=$?"
else setsid cttyhack sh; fi
sync; poweroff -f
INIT
chmod 755 "$R/init"
cp "$PY" "$R/usr/bin/"
ln -sf python3.11 "$R/usr/bin/python3"
for l in $( { ldd "$PY"; for so in /usr/lib/python3.11/lib-dynload/*.so; do ldd "$so"; done; } |
            awk '/=> \//{print $3}' | sort -u); do
    mkdir -p "$R$(dirname "$l")"
    cp -L "$l" "$R$l"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
# The C++ runtime an nvcc-built program links: the host's, as a distribution has it.
for l in libstdc++.so.6 libgcc_s.so.1; do
    # awk reads all of ldconfig's output (no early exit): under pipefail a SIGPIPE
    # to ldconfig would end the script with status 141 and no message
    p=$(ldconfig -p | awk -v n="$l" '$1 == n && /x86-64/ && !p {p = $NF} END {print p}')
    [ -n "$p" ] && { mkdir -p "$R$(dirname "$p")"; cp -L "$p" "$R$p"; }
done
tar -C /usr/lib --exclude=python3.11/test --exclude=tests --exclude=idlelib --exclude=tkinter \
    --exclude=turtledemo --exclude=lib2to3 --exclude='config-3.11-*' --exclude=pydoc_data \
    -cf - python3.11 | tar -C "$R/usr/lib" -xf -
(cd "$R" && find . | "$C/busybox/bin/busybox" cpio -o -H newc 2>/dev/null) > "$C/base.cpio.new"
mv "$C/base.cpio.new" "$C/base.cpio"
rm -rf "$R"
echo "$STAMP" > "$C/ready"
say "built in $C: $(du -h "$C/base.cpio" | cut -f1) initramfs, kernel $KPKG"
echo "$C"
